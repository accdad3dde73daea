//! Postgres restarted (fast and immediate) while pgoutbox streams: it reconnects with
//! backoff, resumes from the slot, and every row is stored once, in commit order.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn reconnects_after_fast_and_immediate_restarts_without_loss_or_duplicates() {
    let mut pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;

    let mut inserted = 0;
    for mode in ["fast", "immediate"] {
        pg.psql(&numbered_rows(inserted, inserted + 2_000, 100));
        inserted += 2_000;
        pg.restart(mode);
        pg.psql(&numbered_rows(inserted, inserted + 1_000, 100));
        inserted += 1_000;
        wait_until_streaming(&pg, &app).await;
    }
    let want = inserted as u64;
    eventually(Duration::from_secs(60), "every row stored", || async {
        (count(&js, "OUTBOX").await >= want).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, inserted);
    assert_eq!(report.stored, inserted, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
    assert!(app.log().contains("reconnecting"), "no reconnect logged:\n{}", app.log());
}
