//! `status` (text and --json) and `/metrics` name the connected nats-server's version and
//! whether JetStream answered it; run on every version of the NATS matrix.

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::{Nats, Postgres, http_get, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn status_and_metrics_name_the_nats_server_version() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let (_, varz) = http_get(nats.monitor_port(), "/varz").expect("the monitor answers");
    let varz: serde_json::Value = serde_json::from_str(&varz).expect("/varz is JSON");
    let version = varz["version"].as_str().expect("/varz names the version").to_owned();

    let output = command(&pg, &nats).args(["status", "--json"]).output().expect("status runs");
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("status --json prints JSON");
    assert_eq!(report["nats"]["version"], version.as_str(), "{report:#}");
    assert_eq!(report["nats"]["jetstream_answered"], true, "{report:#}");
    assert_eq!(report["nats"]["supported"], true, "{report:#}");
    let text = command(&pg, &nats).arg("status").output().expect("status runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.lines().any(|l| l.starts_with("nats.version") && l.contains(&version)), "{text}");

    let (_, metrics) = http_get(app.http_port(), "/metrics").expect("/metrics answers");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("pgoutbox_nats_info{") && l.ends_with(" 1"))
        .unwrap_or_else(|| panic!("no pgoutbox_nats_info at 1:\n{metrics}"));
    assert!(line.contains(&format!("version=\"{version}\"")), "{line}");
    assert!(line.contains("jetstream=\"true\""), "{line}");
    assert!(!app.log().contains("older than the oldest supported"), "{}", app.log());
}
