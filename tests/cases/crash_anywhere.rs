//! kill -9 at 20 random moments while 20,000 rows stream from 1-row and 1,000-row
//! transactions, restarting each time: every row is stored exactly once, in commit order.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Lcg, Nats, Postgres, eventually, mixed_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_at_random_moments_loses_and_duplicates_nothing() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let first = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &first).await;
    drop(first);

    let total = 20_000;
    let writer = pg.psql_in_background(mixed_rows(0, total, 1_000, 0.2));
    let js = jetstream(&nats.url()).await;
    let mut random = Lcg::from_time();
    let mut kills = Vec::new();
    for _ in 0..20 {
        let mut app = Pgoutbox::run(&pg, &nats, &[]);
        tokio::time::sleep(Duration::from_millis(random.between(200, 1_200))).await;
        app.kill9();
        kills.push(count(&js, "OUTBOX").await);
    }
    writer.join().expect("writer").expect("inserts");

    let app = Pgoutbox::run(&pg, &nats, &[]);
    eventually(Duration::from_secs(90), "every row stored after the last restart", || async {
        (count(&js, "OUTBOX").await >= total as u64).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, total);
    eprintln!("stored after each kill: {kills:?}");
    assert!(kills.windows(2).any(|w| w[0] < w[1]), "no kill happened mid-stream: {kills:?}");
    assert_eq!(report.stored, total, "{report:?}");
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0), "{report:?}");
    drop(app);
}
