//! SIGTERM mid-stream: pgoutbox drains and exits 0; after a restart every row is in the
//! stream exactly once, in commit order.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_mid_stream_then_restart_stores_every_row_once() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    let total = 20_000;
    let writer = pg.psql_in_background(numbered_rows(0, total, 100));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "some rows streamed", || async {
        (count(&js, "OUTBOX").await >= 500).then_some(())
    })
    .await;
    app.sigterm();
    let status = app.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "exit status {status:?}; log:\n{}", app.log());
    assert!(app.log().contains("drained"), "no drain line in the log:\n{}", app.log());
    writer.join().expect("writer thread").expect("inserts");

    let stored_at_stop = count(&js, "OUTBOX").await;
    let app = Pgoutbox::run(&pg, &nats, &[]);
    eventually(Duration::from_secs(60), "all rows stored after restart", || async {
        (count(&js, "OUTBOX").await >= total as u64).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, total);
    assert_eq!(report.stored, total, "{report:?} (stored before restart: {stored_at_stop})");
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0), "{report:?}");
    drop(app);
}

/// SIGTERM while JetStream acknowledges nothing (NATS black-holed): the drain cannot finish,
/// so pgoutbox says so and exits non-zero; the unacknowledged rows were not confirmed and
/// arrive once after a restart.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_whose_drain_cannot_finish_exits_non_zero_and_loses_nothing() {
    use crate::support::proxy::FaultProxy;
    let pg = Postgres::start();
    let nats = Nats::start();
    let proxy = FaultProxy::start(nats.port()).await;
    pg.psql(include_str!("../../sql/outbox.sql"));
    let mut app = Pgoutbox::run_via(&pg, &nats, &proxy.url());
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    pg.psql(&numbered_rows(0, 10, 10));
    eventually(Duration::from_secs(20), "first rows stored", || async {
        (count(&js, "OUTBOX").await == 10).then_some(())
    })
    .await;

    proxy.blackhole();
    pg.psql(&numbered_rows(10, 20, 10));
    let port = app.http_port();
    eventually(Duration::from_secs(20), "messages awaiting acks", || async {
        let (_, metrics) = crate::support::http_get(port, "/metrics")?;
        metrics
            .lines()
            .any(|l| l.starts_with("pgoutbox_messages_in_flight ") && !l.ends_with(" 0"))
            .then_some(())
    })
    .await;
    app.sigterm();
    let status = app.wait_exit(Duration::from_secs(60));
    let log = app.log();
    assert!(!status.success(), "a drain that did not finish exited 0:\n{log}");
    assert!(log.contains("left unacknowledged"), "no line saying the drain failed:\n{log}");

    proxy.restore();
    let app = Pgoutbox::run(&pg, &nats, &[]);
    eventually(Duration::from_secs(30), "all 20 rows stored after restart", || async {
        (count(&js, "OUTBOX").await >= 20).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 20);
    assert_eq!(
        (report.stored, report.duplicates, report.order_violations, report.lost),
        (20, 0, 0, 0)
    );
    drop(app);
}
