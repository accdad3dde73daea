//! `wal_sender_timeout = 2s` and a full ack window: while NATS is black-holed the pipeline
//! stops reading the replication socket, so it never sees the walsender's pings. Its own
//! status updates, sent within half the server's timeout, must keep the session alive: the
//! same walsender holds the slot throughout, and Postgres ends no walsender for a
//! replication timeout.

use std::time::{Duration, Instant};

use crate::support::pgoutbox::Pgoutbox;
use crate::support::proxy::FaultProxy;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, http_get, numbered_rows, wait_until_streaming};

fn slot_holder(pg: &Postgres) -> String {
    pg.psql("SELECT coalesce(active_pid::text, 'none') FROM pg_replication_slots")
}

fn in_flight(port: u16) -> Option<f64> {
    let (_, text) = http_get(port, "/metrics")?;
    let line = text.lines().find(|l| l.starts_with("pgoutbox_messages_in_flight "))?;
    line.split(' ').nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn statuses_keep_a_short_wal_sender_timeout_satisfied_while_the_ack_window_is_full() {
    let pg = Postgres::builder().conf("wal_sender_timeout = '2s'").start();
    let nats = Nats::start();
    let proxy = FaultProxy::start(nats.port()).await;
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run_via(&pg, &nats, &proxy.url());
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    pg.psql(&numbered_rows(0, 100, 10));
    eventually(Duration::from_secs(20), "the first rows stored", || async {
        (count(&js, "OUTBOX").await >= 100).then_some(())
    })
    .await;
    let walsender = slot_holder(&pg);

    proxy.blackhole();
    pg.psql(&numbered_rows(100, 10_100, 1_000)); // more rows than the ack window holds
    eventually(Duration::from_secs(5), "a full ack window", || async {
        (in_flight(app.http_port())? >= 4096.0).then_some(())
    })
    .await;
    // Acks time out 10 s after their publish; 6 s of a full window is three timeouts'
    // worth of silence from a pipeline that does not read the socket.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let holder = slot_holder(&pg);
        assert_eq!(holder, walsender, "the walsender was replaced; log:\n{}", app.log());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(!pg.log().contains("replication timeout"), "Postgres log:\n{}", pg.log());

    proxy.restore();
    eventually(Duration::from_secs(60), "every row stored", || async {
        (count(&js, "OUTBOX").await >= 10_100).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 10_100);
    assert_eq!(report.stored, 10_100, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
}
