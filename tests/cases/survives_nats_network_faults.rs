//! NATS behind a proxy the test controls: the connection cut, and black-holed for 30 s
//! (open, silent). While messages are unacknowledged the slot's confirmed_flush_lsn does not
//! move; afterwards every row is stored once, in commit order. Also: nats-server stopped and
//! restarted while rows keep coming.

use std::time::{Duration, Instant};

use crate::support::pgoutbox::Pgoutbox;
use crate::support::proxy::FaultProxy;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{
    Nats, Postgres, confirmed_flush, eventually, mixed_rows, numbered_rows, wait_until_streaming,
};

/// Samples the slot's confirmed_flush_lsn every 250 ms for `duration`.
async fn sample_confirmed(pg: &Postgres, duration: Duration) -> Vec<String> {
    let mut samples = Vec::new();
    let until = Instant::now() + duration;
    while Instant::now() < until {
        samples.push(confirmed_flush(pg));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    samples
}

#[tokio::test(flavor = "multi_thread")]
async fn cut_and_black_holed_connections_lose_and_duplicate_nothing() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let proxy = FaultProxy::start(nats.port()).await;
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run_via(&pg, &nats, &proxy.url());
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;

    let writer = pg.psql_in_background(mixed_rows(0, 6_000, 1_000, 0.1));
    eventually(Duration::from_secs(20), "rows streaming", || async {
        (count(&js, "OUTBOX").await >= 500).then_some(())
    })
    .await;
    proxy.cut();
    let stored_during_cut = count(&js, "OUTBOX").await;
    tokio::time::sleep(Duration::from_secs(3)).await; // the outage itself
    proxy.restore();
    eventually(Duration::from_secs(60), "streaming again after the cut", || async {
        (count(&js, "OUTBOX").await > stored_during_cut).then_some(())
    })
    .await;

    writer.join().expect("writer").expect("inserts");

    // Rows committed into a black hole: sent, never acknowledged.
    proxy.blackhole();
    pg.psql(&numbered_rows(6_000, 6_100, 100));
    let samples = sample_confirmed(&pg, Duration::from_secs(30)).await;
    proxy.restore();
    eventually(Duration::from_secs(90), "every row stored", || async {
        (count(&js, "OUTBOX").await >= 6_100).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    let report = audit(&messages, 6_100);
    assert_eq!(report.stored, 6_100, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
    let position = messages[6_000].header("Pgoutbox-Position").expect("position header");
    let commit = position.split(':').next().expect("commit LSN");
    for confirmed in samples {
        let before = pg.psql(&format!("SELECT '{confirmed}'::pg_lsn < '{commit}'::pg_lsn"));
        assert_eq!(before, "t", "confirmed {confirmed} passed commit {commit} before its acks");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_server_restarted_mid_stream() {
    let pg = Postgres::start();
    let mut nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    // No durability horizon: the slot is sampled for confirming past unstored rows.
    let app = Pgoutbox::run(&pg, &nats, &["--durability-horizon", "0s"]);
    wait_until_streaming(&pg, &app).await;
    let writer = pg.psql_in_background(mixed_rows(0, 6_000, 1_000, 0.1));
    {
        let js = jetstream(&nats.url()).await;
        eventually(Duration::from_secs(20), "rows streaming", || async {
            (count(&js, "OUTBOX").await >= 500).then_some(())
        })
        .await;
    }
    nats.stop();
    tokio::time::sleep(Duration::from_secs(2)).await; // the outage itself
    nats.start_again();
    writer.join().expect("writer").expect("inserts");
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(90), "every row stored", || async {
        (count(&js, "OUTBOX").await >= 6_000).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 6_000);
    assert_eq!(report.stored, 6_000, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
}
