//! The stall detector: with NATS black-holed (connections open, nothing answers) and
//! messages waiting, /readyz turns 503 saying "stalled", pgoutbox_stalled is 1 and `status`
//! shows the age of the last confirmation, within the timeout plus a few seconds; after the
//! thaw all recover and every row is stored once. An idle outbox is never a stall.
//!
//! The timeout (15 s) is longer than the ack timeout (10 s), so the stall is still seen
//! after the pipeline gave up on its acks and is reconnecting.

use std::time::{Duration, Instant};

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::proxy::FaultProxy;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, http_get, numbered_rows, wait_until_streaming};

fn stalled_gauge(port: u16) -> Option<f64> {
    let (_, text) = http_get(port, "/metrics")?;
    text.lines().find(|l| l.starts_with("pgoutbox_stalled "))?.split(' ').nth(1)?.parse().ok()
}

/// `pgoutbox status --json`: exit code and report. It reads the running process at
/// `http_port` if given, else wherever the slot's holder says it serves.
fn status(pg: &Postgres, nats: &Nats, http_port: Option<u16>) -> (Option<i32>, serde_json::Value) {
    let mut cmd = command(pg, nats);
    match http_port {
        Some(port) => cmd.env("PGOUTBOX_HTTP_ADDR", format!("127.0.0.1:{port}")),
        None => cmd.env_remove("PGOUTBOX_HTTP_ADDR"),
    };
    let out = cmd.args(["status", "--json"]).output().expect("run pgoutbox status");
    let report = serde_json::from_slice(&out.stdout).expect("status prints JSON");
    (out.status.code(), report)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_nats_is_reported_as_a_stall_and_recovers() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let proxy = FaultProxy::start(nats.port()).await;
    pg.psql(include_str!("../../sql/outbox.sql"));
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_NATS_URL", proxy.url()).args(["run", "--stall-timeout", "15s"]);
    let app = Pgoutbox::spawn(cmd);
    let port = app.http_port();
    wait_until_streaming(&pg, &app).await;

    eventually(Duration::from_secs(10), "/readyz 200 once streaming", || async {
        (http_get(port, "/readyz")?.0 == 200).then_some(())
    })
    .await;
    // Idle for longer than the timeout: ready, not stalled.
    let idle_until = Instant::now() + Duration::from_secs(17);
    while Instant::now() < idle_until {
        let ready = http_get(port, "/readyz");
        assert_eq!(ready.as_ref().map(|r| r.0), Some(200), "idle counted as a stall: {ready:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(stalled_gauge(port), Some(0.0));
    let (code, report) = status(&pg, &nats, None);
    assert_eq!(report["pgoutbox"]["http_addr"], format!("127.0.0.1:{port}"), "{report:#}");
    let age = report["pgoutbox"]["last_confirmation_age_seconds"].as_f64();
    assert!(age.is_some_and(|a| a < 1.0), "idle, yet an old confirmation: {report:#}");
    assert_eq!(code, Some(0), "{report:#}");

    proxy.blackhole();
    pg.psql(&numbered_rows(0, 100, 100));
    let frozen_at = Instant::now();
    let body = eventually(Duration::from_secs(20), "/readyz 503 stalled", || async {
        let (code, body) = http_get(port, "/readyz")?;
        (code == 503 && body.contains("stalled")).then_some(body)
    })
    .await;
    eprintln!("stall reported after {:?}: {body}", frozen_at.elapsed());
    assert_eq!(stalled_gauge(port), Some(1.0));
    assert!(app.log().contains("stalled:"), "no warning logged:\n{}", app.log());
    let (code, report) = status(&pg, &nats, Some(port));
    let age = report["pgoutbox"]["last_confirmation_age_seconds"].as_f64();
    assert!(age.is_some_and(|a| a >= 15.0), "status: {report:#}");
    assert_eq!(report["pgoutbox"]["stalled"], true, "status: {report:#}");
    assert_eq!(code, Some(1), "a stall is a warning: {report:#}");
    let timeouts = eventually(Duration::from_secs(15), "ack timeouts counted", || async {
        let (_, text) = http_get(port, "/metrics")?;
        let line = text
            .lines()
            .find(|l| l.starts_with("pgoutbox_publish_errors_total{kind=\"timeout\"}"))?;
        line.rsplit(' ').next()?.parse::<f64>().ok().filter(|n| *n >= 1.0)
    })
    .await;
    eprintln!("publish errors of kind timeout: {timeouts}");

    proxy.restore();
    eventually(Duration::from_secs(60), "/readyz 200 after the thaw", || async {
        (http_get(port, "/readyz")?.0 == 200).then_some(())
    })
    .await;
    assert_eq!(stalled_gauge(port), Some(0.0));
    assert!(app.log().contains("stall ended"), "{}", app.log());
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "100 rows stored", || async {
        (count(&js, "OUTBOX").await >= 100).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 100);
    assert_eq!(
        (report.stored, report.duplicates, report.order_violations, report.lost),
        (100, 0, 0, 0)
    );
}

/// Inside one long transaction the confirmed position cannot move before its commit is
/// acknowledged, but its rows are acknowledged all along: that is progress, not a stall.
/// (The warning used to fire here, paging someone while rows flowed.)
#[tokio::test(flavor = "multi_thread")]
async fn a_long_transaction_whose_rows_are_acknowledged_is_no_stall() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &["--stall-timeout", "2s"]);
    wait_until_streaming(&pg, &app).await;

    let total = 300_000;
    pg.psql(&numbered_rows(0, total, total));
    let js = jetstream(&nats.url()).await;
    let started = Instant::now();
    let mut stalled_seen = false;
    eventually(Duration::from_secs(300), "the long transaction stored", || {
        let stalled = stalled_gauge(app.http_port()) == Some(1.0);
        stalled_seen |= stalled;
        let js = js.clone();
        async move { (count(&js, "OUTBOX").await >= total as u64).then_some(()) }
    })
    .await;
    let took = started.elapsed();
    eprintln!("{total} rows in one transaction stored in {took:?}");
    // The test means something only if streaming the rows outlasted the stall timeout.
    assert!(took > Duration::from_secs(4), "the transaction streamed in {took:?}");
    assert!(!stalled_seen, "pgoutbox_stalled was 1 while rows were acknowledged");
    assert!(!app.log().contains("stalled:"), "stall warning logged:\n{}", app.log());
}
