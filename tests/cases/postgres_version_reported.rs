//! `status` (text and --json) and `/metrics` name the server's version and, from 17 on,
//! whether the slot is a failover slot and a synchronised copy (`unknown`/null before).

use crate::support::pg_bin;
use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::{Nats, Postgres, http_get, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn status_and_metrics_name_the_version_and_the_failover_state() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let failover = pg_bin::major() >= 17;
    let app = Pgoutbox::run(&pg, &nats, if failover { &["--failover"] } else { &[] });
    wait_until_streaming(&pg, &app).await;
    let version = pg.psql("SHOW server_version");

    let output = command(&pg, &nats).args(["status", "--json"]).output().expect("status runs");
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("status --json prints JSON");
    assert_eq!(report["postgres"]["version"], version.as_str(), "{report:#}");
    assert_eq!(report["postgres"]["in_recovery"], false, "{report:#}");
    let (want_failover, want_synced) = if failover {
        (serde_json::json!(true), serde_json::json!(false))
    } else {
        (serde_json::Value::Null, serde_json::Value::Null)
    };
    assert_eq!((&report["failover"], &report["synced"]), (&want_failover, &want_synced));
    let text = command(&pg, &nats).arg("status").output().expect("status runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.lines().any(|l| l.starts_with("postgres.version") && l.contains(&version)));

    let (_, metrics) = http_get(app.http_port(), "/metrics").expect("/metrics answers");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("pgoutbox_postgres_info{"))
        .unwrap_or_else(|| panic!("no pgoutbox_postgres_info:\n{metrics}"));
    assert!(line.contains(&format!("version=\"{version}\"")), "{line}");
    let word = if failover { "true" } else { "unknown" };
    assert!(line.contains(&format!("failover=\"{word}\"")), "{line}");
    assert!(line.ends_with(" 1"), "{line}");
}
