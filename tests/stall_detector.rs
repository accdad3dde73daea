//! The stall detector: with NATS black-holed (connections open, nothing answers) and
//! messages waiting, /readyz turns 503 saying "stalled" and pgoutbox_stalled is 1 within
//! the timeout plus a few seconds; after the thaw both recover and every row is stored
//! once. An idle outbox is never a stall.

mod support;

use std::time::{Duration, Instant};

use support::pgoutbox::{Pgoutbox, command};
use support::proxy::FaultProxy;
use support::stream::{audit, count, jetstream, read_all};
use support::{Nats, Postgres, eventually, http_get, numbered_rows, wait_until_streaming};

fn stalled_gauge(port: u16) -> Option<f64> {
    let (_, text) = http_get(port, "/metrics")?;
    text.lines().find(|l| l.starts_with("pgoutbox_stalled "))?.split(' ').nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_nats_is_reported_as_a_stall_and_recovers() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let proxy = FaultProxy::start(nats.port()).await;
    pg.psql(include_str!("../sql/outbox.sql"));
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_NATS_URL", proxy.url()).args(["run", "--stall-timeout", "3s"]);
    let app = Pgoutbox::spawn(cmd);
    let port = app.http_port();
    wait_until_streaming(&pg, &app).await;

    // Idle for longer than the timeout: ready, not stalled.
    let idle_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < idle_until {
        assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200), "idle counted as a stall");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(stalled_gauge(port), Some(0.0));

    proxy.blackhole();
    pg.psql(&numbered_rows(0, 100, 100));
    let frozen_at = Instant::now();
    let body = eventually(Duration::from_secs(10), "/readyz 503 stalled", || async {
        let (code, body) = http_get(port, "/readyz")?;
        (code == 503 && body.contains("stalled")).then_some(body)
    })
    .await;
    eprintln!("stall reported after {:?}: {body}", frozen_at.elapsed());
    assert_eq!(stalled_gauge(port), Some(1.0));
    assert!(app.log().contains("stalled:"), "no warning logged:\n{}", app.log());

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
