//! A lost slot is never replaced silently: when Postgres invalidated it (max_slot_wal_keep_size
//! exceeded) or it was dropped, pgoutbox exits non-zero saying what happened and how to
//! recover; `--recover` is the way on that loses nothing, `--recreate-slot` the one that skips.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

async fn stream_some_rows(pg: &Postgres, nats: &Nats) {
    let app = Pgoutbox::run(pg, nats, &[]);
    wait_until_streaming(pg, &app).await;
    pg.psql(&numbered_rows(0, 10, 10));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "rows stored", || async {
        (count(&js, "OUTBOX").await == 10).then_some(())
    })
    .await;
    crate::support::stop_and_wait_released(pg, app).await;
}

fn assert_exits_explaining(pg: &Postgres, nats: &Nats, needles: &[&str]) {
    let mut app = Pgoutbox::run(pg, nats, &[]);
    let status = app.wait_exit(Duration::from_secs(30));
    let log = app.log();
    assert!(!status.success(), "pgoutbox kept running on a lost slot:\n{log}");
    for needle in needles {
        assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    }
    let slots = pg.psql("SELECT count(*) FROM pg_replication_slots");
    assert!(slots == "0" || slots == "1", "{slots}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_slot_stops_pgoutbox_until_the_operator_recreates_it() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    stream_some_rows(&pg, &nats).await;

    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    assert_exits_explaining(
        &pg,
        &nats,
        &["does not exist", "--recreate-slot", "docs/runbooks/slot-lost.md"],
    );
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_replication_slots"),
        "0",
        "a slot was created silently"
    );

    let app = Pgoutbox::run(&pg, &nats, &["--recreate-slot"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(10, 20, 10));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "rows after the re-created slot", || async {
        (count(&js, "OUTBOX").await == 20).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalidated_slot_stops_pgoutbox_with_the_reason() {
    let pg = Postgres::builder()
        .conf("max_slot_wal_keep_size = 1MB")
        .conf("max_wal_size = 64MB")
        .start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    stream_some_rows(&pg, &nats).await;

    pg.psql("CREATE TABLE filler (x text)");
    for _ in 0..5 {
        pg.psql("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 20000)");
        pg.psql("SELECT pg_switch_wal(); CHECKPOINT;");
    }
    assert_eq!(pg.psql("SELECT wal_status FROM pg_replication_slots"), "lost");
    assert_exits_explaining(
        &pg,
        &nats,
        &["invalidated", "WAL it needed was removed", "--recover", "--recreate-slot"],
    );

    // Rows committed after the slot was lost are still in the table: --recover publishes
    // them, and streaming goes on from a new slot.
    pg.psql(&numbered_rows(10, 30, 5));
    let app = Pgoutbox::run(&pg, &nats, &["--recover"]);
    crate::support::wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(30, 40, 5));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "every row stored once", || async {
        let report = audit(&read_all(&js, "OUTBOX").await, 40);
        (report.stored == 40 && report.lost == 0 && report.order_violations == 0).then_some(())
    })
    .await;
    assert_eq!(pg.psql("SELECT wal_status FROM pg_replication_slots"), "reserved");
}
