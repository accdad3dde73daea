//! An idle outbox while another table, and another database on the same server, write
//! 200 MB of WAL: the slot's lag falls under 1 MB within 30 s of the writes stopping,
//! because pgoutbox confirms keepalives when nothing is in flight. And idle is idle: once a
//! horizon passed after the last event, pgoutbox writes nothing and its slot holds no WAL.

use std::time::{Duration, Instant};

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn idle_outbox_does_not_hold_wal_back() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE TABLE busy (id int, filler text)");
    pg.psql("CREATE DATABASE elsewhere");
    pg.psql_db("elsewhere", "CREATE TABLE busy (id int, filler text)");
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    let start = pg.psql("SELECT pg_current_wal_lsn()");
    let fill = "INSERT INTO busy SELECT g, repeat('x', 1000) FROM generate_series(1, 10000) g";
    for _ in 0..10 {
        pg.psql(fill);
        pg.psql_db("elsewhere", fill);
    }
    let written: i64 = pg
        .psql(&format!("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{start}')::bigint"))
        .parse()
        .unwrap();
    assert!(written > 200_000_000, "only {written} bytes of WAL written");

    let lag = || held_by_the_slot(&pg);
    eventually(Duration::from_secs(30), "slot lag under 1 MB", || async {
        (lag() < 1_000_000).then_some(())
    })
    .await;
    drop(app);
}

/// Issue 68: the record of what JetStream acknowledged was written every second forever
/// (each write is WAL, whose keepalive moved what was acknowledged, which was written
/// again), and the slot held that WAL for a horizon: 40 kB in 30 idle seconds, never zero.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_outbox_writes_nothing_and_its_slot_holds_nothing_a_horizon_after() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &["--durability-horizon", "3s"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(1, 21, 5));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "20 rows stored", || async {
        (count(&js, "OUTBOX").await == 20).then_some(())
    })
    .await;

    let held = || held_by_the_slot(&pg);
    eventually(Duration::from_secs(60), "the slot holding no WAL", || async {
        (held() == 0).then_some(())
    })
    .await;
    // pgoutbox writes nothing more while nothing is published: its record stays as it is
    // for longer than its pace (a second) and the horizon.
    let record = || pg.psql("SELECT xmin, at FROM pgoutbox.acknowledged");
    let written = record();
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert_eq!(record(), written, "the record written again while the outbox is idle");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eventually(Duration::from_secs(30), "the slot holding no WAL after", || async {
        (held() == 0).then_some(())
    })
    .await;
    drop(app);
}

/// The WAL the slot holds: from its confirmed position to where WAL is written now.
fn held_by_the_slot(pg: &Postgres) -> i64 {
    pg.psql(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), confirmed_flush_lsn)::bigint \
         FROM pg_replication_slots WHERE slot_name = 'pgoutbox'",
    )
    .parse()
    .expect("a number of bytes")
}
