//! `--database-password-command` runs at every new connection: a password rotated with
//! `ALTER ROLE … PASSWORD` between reconnects is picked up and nothing is lost; a command
//! that fails at a reconnect is retried, not fatal; at start, a failing command shows its
//! stderr and a hanging one its timeout, each in one line.

use std::path::Path;
use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{assert_once_in_order, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

const HBA: &str = "host all rotating 127.0.0.1/32 scram-sha-256";

/// Ends every session of the role: pgoutbox must log in again, replication and SQL alike.
fn terminate_sessions(pg: &Postgres) {
    pg.psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE usename = 'rotating'",
    );
}

fn rotate(pg: &Postgres, file: &Path, password: &str) {
    pg.psql(&format!("ALTER ROLE rotating PASSWORD '{password}'"));
    std::fs::write(file, format!("{password}\n")).expect("write the password");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_password_is_used_at_each_reconnect_and_nothing_is_lost() {
    let pg = Postgres::builder().hba(HBA).start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE rotating LOGIN REPLICATION PASSWORD 'pw-1st-q7'; \
         GRANT SELECT ON outbox TO rotating;",
    );
    let nats = Nats::start();
    let setup = command(&pg, &nats).arg("setup").output().expect("setup runs");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("token");
    std::fs::write(&file, "pw-1st-q7\n").expect("write the password");
    let mut cmd = command(&pg, &nats);
    cmd.env(
        "PGOUTBOX_DATABASE_URL",
        format!("host=127.0.0.1 port={} user=rotating dbname=postgres", pg.port()),
    )
    .env("PGOUTBOX_DATABASE_PASSWORD_COMMAND", format!("cat '{}'", file.display()))
    .arg("run");
    let mut app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    let streamed = |n: u64| {
        let js = js.clone();
        async move { (count(&js, "OUTBOX").await == n).then_some(()) }
    };

    pg.psql(&numbered_rows(0, 20, 5));
    eventually(Duration::from_secs(20), "rows before the rotation", || streamed(20)).await;

    // The old password no longer logs in: only a fresh run of the command does.
    rotate(&pg, &file, "pw-2nd-q7");
    pg.psql(&numbered_rows(20, 40, 5));
    terminate_sessions(&pg);
    pg.psql(&numbered_rows(40, 60, 5));
    eventually(Duration::from_secs(60), "rows across the first rotation", || streamed(60)).await;

    // A command that fails at a reconnect is retried; the rows wait in the slot.
    std::fs::remove_file(&file).expect("remove the password");
    pg.psql("ALTER ROLE rotating PASSWORD 'pw-3rd-q7'");
    terminate_sessions(&pg);
    pg.psql(&numbered_rows(60, 80, 5));
    eventually(Duration::from_secs(30), "the failing command in the log", || async {
        app.log().contains("--database-password-command exited with status 1").then_some(())
    })
    .await;
    assert!(app.is_running(), "a failing command at a reconnect is not fatal:\n{}", app.log());
    rotate(&pg, &file, "pw-3rd-q7");
    pg.psql(&numbered_rows(80, 100, 5));
    eventually(Duration::from_secs(60), "rows across the second rotation", || streamed(100)).await;

    let messages = read_all(&js, "OUTBOX").await;
    assert_once_in_order(&messages, 100, &app.log());
    assert!(
        !app.log().contains("pw-2nd-q7") && !app.log().contains("pw-3rd-q7"),
        "a password logged"
    );
}

#[test]
fn a_failing_command_shows_its_status_not_its_stderr_and_a_hanging_one_times_out() {
    let pg = Postgres::builder().hba(HBA).start();
    let nats = Nats::start();
    let url = format!("host=127.0.0.1 port={} user=rotating dbname=postgres", pg.port());
    for (password_command, timeout, wanted) in [
        (
            "echo 'ExpiredToken: the session has expired' >&2; echo more >&2; exit 7",
            "10s",
            "--database-password-command exited with status 7: 2 line(s) on stderr, not shown",
        ),
        ("sleep 30", "1s", "--database-password-command gave no password within 1s; it was killed"),
    ] {
        let mut cmd = command(&pg, &nats);
        cmd.env("PGOUTBOX_DATABASE_URL", &url)
            .args(["--database-password-command", password_command])
            .args(["--database-password-command-timeout", timeout, "run"]);
        let mut app = Pgoutbox::spawn(cmd);
        let status = app.wait_exit(Duration::from_secs(20));
        let log = app.log();
        assert!(!status.success(), "{log}");
        let line =
            log.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("{log}"));
        assert!(line.contains(wanted), "{line}");
        assert!(!line.contains("ExpiredToken"), "the command's stderr was shown: {line}");
    }
}
