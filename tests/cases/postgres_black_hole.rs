//! Postgres behind a proxy that black-holes the connections (they stay open, nothing gets
//! through, and the proxy's kernel keeps acknowledging, so TCP keepalive sees nothing). The
//! liveness check must notice within 60 s: /readyz turns 503 saying why. Once the path is
//! back, pgoutbox resumes from the slot on its own, and every row, including those committed
//! while the path was dark, is stored exactly once, in commit order.

use std::time::{Duration, Instant};

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::proxy::FaultProxy;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, http_get, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn a_black_holed_postgres_is_noticed_and_streaming_resumes_without_loss() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let proxy = FaultProxy::start_bytes(pg.port()).await;
    let mut cmd = command(&pg, &nats);
    let via_proxy = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    cmd.env("PGOUTBOX_DATABASE_URL", via_proxy).arg("run");
    let mut app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    let port = app.http_port();
    let js = jetstream(&nats.url()).await;
    pg.psql(&numbered_rows(0, 1_000, 100));
    eventually(Duration::from_secs(20), "the first rows stored", || async {
        (count(&js, "OUTBOX").await >= 1_000).then_some(())
    })
    .await;
    eventually(Duration::from_secs(10), "/readyz 200 while streaming", || async {
        (http_get(port, "/readyz")?.0 == 200).then_some(())
    })
    .await;

    proxy.blackhole();
    let dark_since = Instant::now();
    let why = eventually(Duration::from_secs(60), "/readyz 503 after the black hole", || async {
        let (code, body) = http_get(port, "/readyz")?;
        (code == 503).then_some(body)
    })
    .await;
    let detected_after = dark_since.elapsed();
    eprintln!("black hole detected after {detected_after:?}: {why}");
    assert!(why.contains("Postgres stopped answering"), "{why}\nlog:\n{}", app.log());
    pg.psql(&numbered_rows(1_000, 2_000, 100)); // committed while the path is dark

    proxy.restore();
    pg.psql(&numbered_rows(2_000, 3_000, 100));
    eventually(Duration::from_secs(60), "every row stored", || async {
        (count(&js, "OUTBOX").await >= 3_000).then_some(())
    })
    .await;
    eventually(Duration::from_secs(10), "/readyz 200 again", || async {
        (http_get(port, "/readyz")?.0 == 200).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 3_000);
    assert_eq!(report.stored, 3_000, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
    assert!(app.is_running(), "pgoutbox exited; log:\n{}", app.log());
}

/// pgoutbox streaming through a proxy whose connections the test can black-hole, with 100
/// rows stored; returns the proxy, pgoutbox and the stream's context.
async fn streaming_through_a_proxy(
    pg: &Postgres,
    nats: &Nats,
) -> (FaultProxy, Pgoutbox, async_nats::jetstream::Context) {
    pg.psql(include_str!("../../sql/outbox.sql"));
    let proxy = FaultProxy::start_bytes(pg.port()).await;
    let mut cmd = command(pg, nats);
    // No connect_timeout: a login that never completes is bounded by pgoutbox alone.
    let via_proxy = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    cmd.env("PGOUTBOX_DATABASE_URL", via_proxy).arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(pg, &app).await;
    let js = jetstream(&nats.url()).await;
    pg.psql(&numbered_rows(0, 100, 10));
    eventually(Duration::from_secs(20), "the first rows stored", || async {
        (count(&js, "OUTBOX").await >= 100).then_some(())
    })
    .await;
    (proxy, app, js)
}

/// Cuts pgoutbox's connections and black-holes the path, then waits until pgoutbox has
/// reconnected into the black hole (a connection accepted that nothing ever answers).
async fn reconnect_into_a_black_hole(proxy: &FaultProxy) {
    proxy.cut();
    proxy.blackhole();
    let accepted = proxy.accepted();
    eventually(Duration::from_secs(10), "a reconnect into the black hole", || async {
        (proxy.accepted() > accepted).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reconnect_into_a_black_hole_is_given_up_and_tried_again() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let (proxy, mut app, js) = streaming_through_a_proxy(&pg, &nats).await;
    reconnect_into_a_black_hole(&proxy).await;
    pg.psql(&numbered_rows(100, 200, 10));
    // The path comes back for new connections; the one in the hole never answers.
    proxy.heal_for_new_connections();
    let healed = Instant::now();
    eventually(Duration::from_secs(60), "the rows committed meanwhile stored", || async {
        (count(&js, "OUTBOX").await >= 200).then_some(())
    })
    .await;
    eprintln!("streaming again {:?} after the path healed", healed.elapsed());
    let report = audit(&read_all(&js, "OUTBOX").await, 200);
    assert_eq!((report.stored, report.duplicates, report.lost), (200, 0, 0), "{report:?}");
    assert!(app.is_running(), "pgoutbox exited; log:\n{}", app.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_a_reconnect_stuck_in_a_black_hole() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let (proxy, mut app, _js) = streaming_through_a_proxy(&pg, &nats).await;
    reconnect_into_a_black_hole(&proxy).await;
    app.sigterm();
    let status = app.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "exit status {status:?}; log:\n{}", app.log());
}
