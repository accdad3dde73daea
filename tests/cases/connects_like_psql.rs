//! pgoutbox finds the database the ways psql does: a role's password only in a password
//! file, a connection service file, and libpq's PG* variables alone, each with no
//! --database-url password; a password file that others can read is ignored with a warning,
//! as libpq ignores it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("write file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// `command` with a home of its own and neither a database URL nor a password.
fn bare(pg: &Postgres, nats: &Nats, home: &Path) -> Command {
    let mut cmd = command(pg, nats);
    cmd.env_remove("PGOUTBOX_DATABASE_URL").env("HOME", home);
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn a_passfile_a_service_file_and_the_environment_alone_each_connect() {
    let pg = Postgres::builder().hba("host all app_user 127.0.0.1/32 scram-sha-256").start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE app_user LOGIN REPLICATION PASSWORD 's3:cr\\et'; \
         GRANT SELECT ON outbox TO app_user;",
    );
    let nats = Nats::start();
    let setup = command(&pg, &nats).arg("setup").output().expect("setup runs");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));
    let home = tempfile::tempdir().expect("home");
    let port = pg.port();
    // The password holds a colon and a backslash, escaped in the password file.
    write(
        &home.path().join(".pgpass"),
        &format!("# pgoutbox\n127.0.0.1:{port}:postgres:app_user:s3\\:cr\\\\et\n"),
        0o600,
    );
    let services = home.path().join("services.conf");
    write(
        &services,
        &format!(
            "[other]\nhost=nowhere\n\n[outbox]\nhost=127.0.0.1\nport={port}\nuser=app_user\ndbname=postgres\n"
        ),
        0o644,
    );

    let mut passfile = bare(&pg, &nats, home.path());
    passfile.env("PGOUTBOX_DATABASE_URL", format!("postgres://app_user@127.0.0.1:{port}/postgres"));
    let mut service = bare(&pg, &nats, home.path());
    service.env("PGSERVICEFILE", &services).env("PGSERVICE", "outbox");
    let mut environment = bare(&pg, &nats, Path::new("/nonexistent"));
    environment
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", port.to_string())
        .env("PGUSER", "app_user")
        .env("PGDATABASE", "postgres")
        .env("PGPASSWORD", "s3:cr\\et");

    let js = jetstream(&nats.url()).await;
    for (i, (way, mut cmd)) in
        [("a passfile", passfile), ("a service file", service), ("PG* alone", environment)]
            .into_iter()
            .enumerate()
    {
        cmd.arg("run");
        let app = Pgoutbox::spawn(cmd);
        wait_until_streaming(&pg, &app).await;
        pg.psql(&numbered_rows(i * 10, i * 10 + 10, 10));
        let want = (i as u64 + 1) * 10;
        eventually(Duration::from_secs(20), &format!("rows streamed with {way}"), || async {
            (count(&js, "OUTBOX").await == want).then_some(())
        })
        .await;
        crate::support::stop_and_wait_released(&pg, app).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_passfile_others_can_read_is_ignored_with_a_warning() {
    let pg = Postgres::builder().hba("host all app_user 127.0.0.1/32 scram-sha-256").start();
    pg.psql("CREATE ROLE app_user LOGIN REPLICATION PASSWORD 's3cret';");
    let nats = Nats::start();
    let home = tempfile::tempdir().expect("home");
    let port = pg.port();
    let pgpass = home.path().join(".pgpass");
    write(&pgpass, &format!("*:{port}:*:app_user:s3cret\n"), 0o644);
    let mut cmd = bare(&pg, &nats, home.path());
    cmd.env("PGHOST", "127.0.0.1").env("PGPORT", port.to_string()).env("PGUSER", "app_user");
    let out = cmd.args(["setup"]).output().expect("setup runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the file must not be read: {stderr}");
    let warning = format!("password file {} has group or world access", pgpass.display());
    assert!(stderr.contains(&warning), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

/// `run` with no URL and no libpq variable that names a database (PGUSER alone does not).
#[test]
fn nothing_given_says_what_was_looked_for() {
    let home = tempfile::tempdir().expect("home");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgoutbox"));
    for (key, _) in std::env::vars() {
        if key.starts_with("PG") || key == "DATABASE_URL" {
            cmd.env_remove(key);
        }
    }
    let out = cmd.env("HOME", home.path()).env("PGUSER", "x").arg("run").output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for wanted in ["no database given", "--database-url", "PGHOST", "PGSERVICE"] {
        assert!(stderr.contains(wanted), "{stderr}");
    }
}
