//! `status` is critical (exit 2) whenever the stream it looks at cannot be the one this
//! source streams into: NATS unreachable, the stream missing, or the stream written by
//! another source or by nobody while the slot exists. Each error is said once, and
//! `nats.jetstream_answered` is true whenever JetStream answered, even "no such stream".

use std::process::Command;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::jetstream;
use crate::support::{Nats, Postgres, free_port, wait_until_streaming};

/// What `status --json` said: its exit code, the report, and its stderr.
struct Status {
    code: Option<i32>,
    report: serde_json::Value,
    stderr: String,
}

fn status_json(mut cmd: Command) -> Status {
    let output = cmd.args(["status", "--json"]).output().expect("status runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|err| panic!("status --json printed no JSON ({err}):\n{stdout}"));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    Status { code: output.status.code(), report, stderr }
}

/// `status` for `pg`, pointed at the NATS at `nats_url`.
fn status_at(pg: &Postgres, nats: &Nats, nats_url: &str) -> Status {
    let mut cmd = command(pg, nats);
    cmd.env("PGOUTBOX_NATS_URL", nats_url);
    status_json(cmd)
}

fn problems(report: &serde_json::Value) -> String {
    report["problems"]
        .as_array()
        .map(|p| p.iter().filter_map(|p| p.as_str()).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn status_is_healthy_only_against_the_stream_this_source_writes() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    // The NATS pgoutbox writes to: healthy, and the stream's writer is this source.
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_HTTP_ADDR", format!("127.0.0.1:{}", app.http_port()));
    let right = status_json(cmd);
    assert_eq!(right.code, Some(0), "{:#}", right.report);
    assert_eq!(right.report["nats"]["jetstream_answered"], true, "{:#}", right.report);
    assert_eq!(right.report["stream"]["exists"], true, "{:#}", right.report);
    let writer = right.report["stream"]["writer"].as_str().unwrap_or_default().to_owned();
    assert!(writer.ends_with("/postgres/pgoutbox"), "{:#}", right.report);

    // A stranger's nats-server, as a system one on 4222 would be: no stream OUTBOX there.
    let stranger = Nats::start();
    let wrong = status_at(&pg, &nats, &stranger.url());
    assert_eq!(wrong.code, Some(2), "{:#}", wrong.report);
    assert_eq!(wrong.report["health"], "critical", "{:#}", wrong.report);
    assert_eq!(wrong.report["nats"]["jetstream_answered"], true, "{:#}", wrong.report);
    assert_eq!(wrong.report["stream"]["exists"], false, "{:#}", wrong.report);
    let said = problems(&wrong.report);
    assert!(said.contains("stream OUTBOX does not exist"), "{said}");

    // The stranger has a stream OUTBOX of its own, written by nobody pgoutbox knows.
    let js = jetstream(&stranger.url()).await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "OUTBOX".into(),
        subjects: vec!["outbox.>".into()],
        ..Default::default()
    })
    .await
    .expect("the stranger's stream");
    let unclaimed = status_at(&pg, &nats, &stranger.url());
    assert_eq!(unclaimed.code, Some(2), "{:#}", unclaimed.report);
    assert_eq!(unclaimed.report["stream"]["exists"], true, "{:#}", unclaimed.report);
    let said = problems(&unclaimed.report);
    assert!(said.contains("is not claimed by this source"), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_port_is_critical_and_its_error_is_said_once() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    // Status reads the running process, so the only refused connection is the NATS one.
    let http = format!("127.0.0.1:{}", app.http_port());
    let status_at = |url: &str| {
        let mut cmd = command(&pg, &nats);
        cmd.env("PGOUTBOX_NATS_URL", url).env("PGOUTBOX_HTTP_ADDR", &http);
        cmd
    };

    let closed = format!("nats://127.0.0.1:{}", free_port());
    let down = status_json(status_at(&closed));
    assert_eq!(down.code, Some(2), "{:#}", down.report);
    assert_eq!(down.report["nats"]["connected"], false, "{:#}", down.report);
    assert_eq!(down.report["nats"]["jetstream_answered"], false, "{:#}", down.report);
    let said = problems(&down.report);
    assert!(said.contains("NATS is unreachable"), "{said}");
    assert_eq!(said.matches("Connection refused").count(), 1, "{said}");
    assert_eq!(down.report.to_string().matches("Connection refused").count(), 1);

    // The table a human reads says it once too.
    let output = status_at(&closed).arg("status").output().expect("status runs");
    assert_eq!(output.status.code(), Some(2));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(all.matches("Connection refused").count(), 1, "{all}");
    assert!(!down.stderr.contains("Connection refused: Connection refused"), "{}", down.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_another_source_writes_is_critical() {
    let pg = Postgres::start();
    let nats = Nats::start();
    for db in ["app_a", "app_b"] {
        pg.psql(&format!("CREATE DATABASE {db}"));
        pg.psql_db(db, include_str!("../../sql/outbox.sql"));
    }
    // A sets up stream OUTBOX and claims it.
    let mut cmd = command(&pg, &nats);
    cmd.args(["setup", "--database-url", &pg.url_for("postgres", None, "app_a")]);
    let setup = cmd.args(["--slot", "slot_a"]).output().expect("setup runs");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));
    // B has its slot and is left on the default stream: A's.
    pg.psql_db("app_b", "SELECT pg_create_logical_replication_slot('slot_b', 'pgoutput')");
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_DATABASE_URL", pg.url_for("postgres", None, "app_b"))
        .env("PGOUTBOX_SLOT", "slot_b");
    let theirs = status_json(cmd);
    assert_eq!(theirs.code, Some(2), "{:#}", theirs.report);
    let said = problems(&theirs.report);
    assert!(said.contains("stream OUTBOX is written by another source"), "{said}");
    assert!(said.contains("/app_a/slot_a"), "{said}");
    assert_eq!(theirs.report["nats"]["jetstream_answered"], true, "{:#}", theirs.report);

    // A itself is not critical: its slot is only inactive (a warning).
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_DATABASE_URL", pg.url_for("postgres", None, "app_a"))
        .env("PGOUTBOX_SLOT", "slot_a");
    let ours = status_json(cmd);
    assert_eq!(ours.code, Some(1), "{:#}", ours.report);
}
