//! With NATS stopped while rows are inserted, the slot's confirmed_flush_lsn does not move
//! past them; after NATS is back every row arrives once, in order.

use std::time::{Duration, Instant};

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

fn confirmed_flush(pg: &Postgres) -> String {
    pg.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'pgoutbox'")
}

#[tokio::test(flavor = "multi_thread")]
async fn confirmed_lsn_waits_for_nats_and_every_row_arrives_once() {
    let pg = Postgres::start();
    let mut nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    // No durability horizon: the slot confirms the published rows within seconds of NATS
    // coming back (with the default, 150 s later), the strictest case for never confirming
    // past an unpublished one.
    let app = Pgoutbox::run(&pg, &nats, &["--durability-horizon", "0s"]);
    wait_until_streaming(&pg, &app).await;

    nats.stop();
    let before = pg.psql("SELECT pg_current_wal_lsn()");
    pg.psql(&numbered_rows(0, 1_000, 100));
    // For a while (longer than pgoutbox's ack timeout), the slot must not pass the rows.
    let watch_until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < watch_until {
        let past = pg.psql(&format!(
            "SELECT confirmed_flush_lsn > '{before}'::pg_lsn FROM pg_replication_slots \
             WHERE slot_name = 'pgoutbox'"
        ));
        assert_eq!(
            past,
            "f",
            "confirmed_flush_lsn {} moved past unpublished rows",
            confirmed_flush(&pg)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    nats.start_again();
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(90), "1,000 rows stored after NATS came back", || async {
        (count(&js, "OUTBOX").await >= 1_000).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 1_000);
    assert_eq!(report.stored, 1_000, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
    eventually(Duration::from_secs(10), "the slot confirms the published rows", || async {
        (pg.psql(&format!(
            "SELECT confirmed_flush_lsn > '{before}'::pg_lsn FROM pg_replication_slots"
        )) == "t")
            .then_some(())
    })
    .await;
    drop(app);
}
