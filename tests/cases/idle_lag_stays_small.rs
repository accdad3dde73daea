//! An idle outbox while another table, and another database on the same server, write
//! 200 MB of WAL: the slot's lag falls under 1 MB within 30 s of the writes stopping,
//! because pgoutbox confirms keepalives when nothing is in flight.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::{Nats, Postgres, eventually, wait_until_streaming};

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

    let lag = || {
        pg.psql(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint \
             FROM pg_replication_slots WHERE slot_name = 'pgoutbox'",
        )
        .parse::<i64>()
        .unwrap()
    };
    eventually(Duration::from_secs(30), "slot lag under 1 MB", || async {
        (lag() < 1_000_000).then_some(())
    })
    .await;
    drop(app);
}
