//! Two instances, one slot: the second waits as a hot standby, says so in its log, and takes
//! over within 10 s of a kill -9 of the active one, with no loss and no duplicate.

use std::time::{Duration, Instant};

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, mixed_rows, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn standby_takes_over_after_kill_9_of_the_active_instance() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let mut active = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &active).await;
    let standby = Pgoutbox::run(&pg, &nats, &[]);
    eventually(Duration::from_secs(20), "the standby says it waits", || async {
        standby.log().contains("waiting as hot standby").then_some(())
    })
    .await;
    // Alive but not ready, and /readyz says why in words an operator expects.
    let (code, body) = crate::support::http_get(standby.http_port(), "/readyz").expect("readyz");
    assert_eq!(code, 503);
    assert!(body.contains("hot standby"), "{body}");
    let active_pid = pg.psql("SELECT active_pid FROM pg_replication_slots");

    pg.psql(&numbered_rows(0, 1_000, 100));
    let writer = pg.psql_in_background(mixed_rows(1_000, 6_000, 1_000, 0.1));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "rows streaming", || async {
        (count(&js, "OUTBOX").await >= 1_000).then_some(())
    })
    .await;
    active.kill9();
    let killed_at = Instant::now();
    eventually(Duration::from_secs(10), "the standby holds the slot", || async {
        let pid = pg.psql("SELECT coalesce(active_pid::text, '') FROM pg_replication_slots");
        (!pid.is_empty() && pid != active_pid).then_some(())
    })
    .await;
    eprintln!("took over in {:?}", killed_at.elapsed());
    writer.join().expect("writer").expect("inserts");
    eventually(Duration::from_secs(60), "every row stored", || async {
        (count(&js, "OUTBOX").await >= 6_000).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 6_000);
    assert_eq!(report.stored, 6_000, "{report:?}\nstandby log:\n{}", standby.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
}
