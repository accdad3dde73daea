//! pgoutbox started while its NATS cluster has no JetStream quorum, as on a cold start of
//! the whole platform with the servers coming up one by one: NATS takes the connection,
//! JetStream answers nothing. pgoutbox waits and says why on `/readyz`, never exits, and
//! streams every row once when quorum is back.

use std::time::{Duration, Instant};

use crate::support::cluster::NatsCluster;
use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Postgres, eventually, http_get, numbered_rows, wait_until_streaming};

const WAITING: &str = "JetStream did not answer while setting up; retrying";

// Quarantined on 2026-11-24: after quorum comes back, nats-server 2.9.10 sometimes answers
// every publish to the new R3 stream with "no responders" for over a minute, even once
// the stream reports a leader with current replicas. It failed 2 of 4 runs on 3ff31c5 as
// well as now, so it is the cluster, not this change; run it with `--ignored`.
#[ignore = "flaky: a 2.9.10 cluster back from lost quorum may not route publishes for minutes"]
#[tokio::test(flavor = "multi_thread")]
async fn setup_waits_for_a_cluster_without_quorum_then_streams() {
    let pg = Postgres::start();
    let mut nats = NatsCluster::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    nats.node(1).kill();
    nats.node(2).kill();
    let mut cmd = command(&pg, nats.node(0));
    cmd.env("PGOUTBOX_NATS_URL", nats.urls()).env("PGOUTBOX_STREAM_REPLICAS", "3").arg("run");
    let mut app = Pgoutbox::spawn(cmd);

    // Twice: it went on waiting after the first failure instead of exiting.
    let deadline = Instant::now() + Duration::from_secs(90);
    while app.log().matches(WAITING).count() < 2 {
        assert!(app.is_running(), "pgoutbox exited without quorum; log:\n{}", app.log());
        assert!(Instant::now() < deadline, "pgoutbox never said it waits; log:\n{}", app.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, why) = http_get(app.http_port(), "/readyz").expect("/readyz answers");
    assert_eq!(code, 503, "ready without JetStream: {why}");
    assert!(why.contains("JetStream did not answer"), "/readyz says: {why}");

    nats.node(1).start_again();
    nats.node(2).start_again();
    wait_until_streaming(&pg, &app).await;
    let total = 1_000;
    pg.psql(&numbered_rows(0, total, 10));
    let js = jetstream(&nats.urls()).await;
    eventually(Duration::from_secs(60), "every row stored", || async {
        (count(&js, "OUTBOX").await >= total as u64).then_some(())
    })
    .await;
    assert!(app.is_running(), "pgoutbox exited; log:\n{}", app.log());
    let report = audit(&read_all(&js, "OUTBOX").await, total);
    assert_eq!(report.stored, total, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
}
