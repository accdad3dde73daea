//! TLS to Postgres on both connections: the server only accepts TLS (hostssl), and pgoutbox
//! streams with sslmode=verify-full and a CA the test generated; a wrong CA and
//! sslmode=disable are refused with a clear error; a client certificate (PGSSLCERT and
//! PGSSLKEY) logs in where pg_hba.conf asks for one.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::postgres::give_to_postgres;
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

/// A CA, a server certificate for 127.0.0.1 signed by it, and an unrelated CA; the server's
/// files owned by the user Postgres runs as, its key private.
fn certificates(dir: &Path) {
    crate::support::certs::ca_and_server(dir, "IP:127.0.0.1");
    crate::support::certs::ca(dir, "other-ca");
    for file in ["server.pem", "server.key"] {
        let path = dir.join(file);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        give_to_postgres(&path);
    }
    give_to_postgres(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_over_verified_tls_and_refuses_what_it_cannot_verify() {
    let dir = tempfile::tempdir().expect("dir");
    certificates(dir.path());
    let pg = Postgres::builder()
        .conf("ssl = on")
        .conf(&format!("ssl_cert_file = '{}'", dir.path().join("server.pem").display()))
        .conf(&format!("ssl_key_file = '{}'", dir.path().join("server.key").display()))
        .hba("hostssl all all 127.0.0.1/32 trust")
        .hba("hostnossl all all 127.0.0.1/32 reject")
        .start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let nats = Nats::start();
    let with_tls = |query: &str| format!("{}?{query}", pg.url());
    let ca = dir.path().join("ca.pem");
    let other = dir.path().join("other-ca.pem");

    let mut cmd = command(&pg, &nats);
    let url = with_tls(&format!("sslmode=verify-full&sslrootcert={}", ca.display()));
    cmd.env("PGOUTBOX_DATABASE_URL", &url).arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 5, 5));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "rows streamed over TLS", || async {
        (count(&js, "OUTBOX").await == 5).then_some(())
    })
    .await;
    let ssl_sessions = pg.psql("SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE ssl AND backend_type = 'walsender'");
    assert_eq!(ssl_sessions, "1", "the replication connection is not encrypted");
    drop(app);

    for (query, needle) in [
        (format!("sslmode=verify-ca&sslrootcert={}", other.display()), "certificate"),
        ("sslmode=disable".to_owned(), "pg_hba.conf"),
    ] {
        let mut cmd = command(&pg, &nats);
        cmd.env("PGOUTBOX_DATABASE_URL", with_tls(&query)).arg("status");
        let output = cmd.output().expect("status runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(2), "{query}: {stdout}");
        assert!(stdout.contains(needle), "{query}: {needle:?} not in {stdout}");
    }
    // A settings mistake, not a health verdict: refused before connecting, on stderr.
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_DATABASE_URL", with_tls("sslmode=verify-full")).arg("status");
    let output = cmd.output().expect("status runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("sslrootcert"), "{stderr}");
}

/// A client certificate from libpq's PGSSLCERT and PGSSLKEY logs in where `pg_hba.conf`
/// asks for one (`cert`: the certificate's CN is the role), on both connections.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_certificate_from_pgsslcert_and_pgsslkey_logs_in() {
    let dir = tempfile::tempdir().expect("dir");
    certificates(dir.path());
    crate::support::certs::client(dir.path());
    let file = |name: &str| dir.path().join(name);
    std::fs::set_permissions(file("client.key"), std::fs::Permissions::from_mode(0o600))
        .expect("chmod");
    let pg = Postgres::builder()
        .conf("ssl = on")
        .conf(&format!("ssl_cert_file = '{}'", file("server.pem").display()))
        .conf(&format!("ssl_key_file = '{}'", file("server.key").display()))
        .conf(&format!("ssl_ca_file = '{}'", file("ca.pem").display()))
        .hba("hostssl all client 127.0.0.1/32 cert")
        .hba("hostssl all all 127.0.0.1/32 trust")
        .hba("hostnossl all all 127.0.0.1/32 reject")
        .start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE ROLE client LOGIN REPLICATION; GRANT SELECT ON outbox TO client;");
    let nats = Nats::start();
    let setup = command(&pg, &nats).arg("setup").output().expect("setup runs");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));

    let mut cmd = command(&pg, &nats);
    cmd.env_remove("PGOUTBOX_DATABASE_URL")
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", pg.port().to_string())
        .env("PGUSER", "client")
        .env("PGDATABASE", "postgres")
        .env("PGSSLMODE", "verify-full")
        .env("PGSSLROOTCERT", file("ca.pem"))
        .env("PGSSLCERT", file("client.pem"))
        .env("PGSSLKEY", file("client.key"))
        .arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 5, 5));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "rows streamed with a client certificate", || async {
        (count(&js, "OUTBOX").await == 5).then_some(())
    })
    .await;
}
