//! Pipelining without reordering: when publish k is lost while k+1.. are in flight, k+1
//! must not be stored before k. A proxy drops exactly one publish; every message after it
//! names its predecessor (Nats-Expected-Last-Msg-Id) and is refused, and pgoutbox resumes
//! from the slot.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::proxy::FaultProxy;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_publish_never_lets_later_rows_overtake_it() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let proxy = FaultProxy::start(nats.port()).await;
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run_via(&pg, &nats, &proxy.url());
    wait_until_streaming(&pg, &app).await;

    pg.psql(&numbered_rows(0, 100, 100));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "first rows stored", || async {
        (count(&js, "OUTBOX").await == 100).then_some(())
    })
    .await;
    proxy.drop_next_publish("outbox.");
    pg.psql(&numbered_rows(100, 2_100, 500));
    eventually(Duration::from_secs(60), "every row stored", || async {
        (count(&js, "OUTBOX").await >= 2_100).then_some(())
    })
    .await;
    assert_eq!(proxy.dropped(), 1, "the proxy did not drop a publish");
    let report = audit(&read_all(&js, "OUTBOX").await, 2_100);
    assert_eq!(report.stored, 2_100, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
    assert!(app.log().contains("reconnecting"), "the loss went unnoticed:\n{}", app.log());
}
