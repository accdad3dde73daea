//! What pgoutbox tells the walsender, as `pg_stat_replication` shows it: `write_lsn` is what
//! JetStream acknowledged, `flush_lsn` (the slot's `confirmed_flush_lsn`) what the
//! durability horizon released. Behind a horizon both trailed by 150 s before, and the
//! walsender, which pings before each wait while the client's write and flush positions are
//! behind what it sent (`WalSndWaitForWal`), sent a keepalive after every transaction: 7-12
//! ms of p99 at 3,000 transactions/s (issue 68). `pgoutbox replay` waits for `write_lsn`.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, numbered_rows, parse_lsn, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn behind_the_horizon_the_write_position_is_what_jetstream_acknowledged() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let slot = "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'pgoutbox'";
    pg.psql(&numbered_rows(0, 100, 10));
    let end = parse_lsn(&pg.psql("SELECT pg_current_wal_lsn()"));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "100 rows stored", || async {
        (count(&js, "OUTBOX").await == 100).then_some(())
    })
    .await;
    let positions = "SELECT r.write_lsn, r.flush_lsn FROM pg_stat_replication r \
                     JOIN pg_replication_slots s ON s.active_pid = r.pid \
                     WHERE s.slot_name = 'pgoutbox'";
    let (written, flushed) = eventually(Duration::from_secs(5), "the write position", || async {
        let row = pg.psql(positions);
        let (written, flushed) = row.split_once('|')?;
        let (written, flushed) = (parse_lsn(written), parse_lsn(flushed));
        (written >= end).then_some((written, flushed))
    })
    .await;
    assert!(flushed < end, "the horizon released at once: flush {flushed:x}, end {end:x}");
    assert!(written >= flushed, "write {written:x} behind flush {flushed:x}");
    assert!(parse_lsn(&pg.psql(slot)) < end, "the slot was confirmed past the horizon's rows");
    drop(app);
}
