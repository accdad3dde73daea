//! PostgreSQL 16+: logical decoding on a physical standby (`--from-standby`) takes the
//! decoding off the primary. The publication comes from the primary (a standby is
//! read-only; without it pgoutbox stops with one line saying where to create it), the slot
//! is made on the standby, and rows committed on the primary arrive once, in commit order,
//! while the primary holds no slot of ours. Below 16 the flag is refused with one line
//! naming the version.

use std::time::{Duration, Instant};

use crate::support::pg_bin;
use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, http_get, numbered_rows};

fn exits_saying(pg: &Postgres, nats: &Nats, needles: &[&str]) {
    let mut app = Pgoutbox::run(pg, nats, &["--from-standby"]);
    let status = app.wait_exit(Duration::from_secs(30));
    let log = app.log();
    assert!(!status.success(), "{log}");
    for needle in needles {
        assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_from_a_standby_with_the_primary_holding_no_slot() {
    let primary = Postgres::start();
    let nats = Nats::start();
    primary.psql(include_str!("../../sql/outbox.sql"));
    let standby = primary.start_standby(&["hot_standby_feedback = on"]);
    if pg_bin::major() < 16 {
        let version = standby.psql("SHOW server_version");
        exits_saying(&standby, &nats, &["--from-standby needs PostgreSQL 16", &version]);
        return;
    }
    exits_saying(&standby, &nats, &["publication pgoutbox does not exist", "on the primary"]);

    primary.psql(
        "CREATE PUBLICATION pgoutbox FOR TABLE outbox \
         WITH (publish = 'insert', publish_via_partition_root = true)",
    );
    standby.wait_replayed(&primary.psql("SELECT pg_current_wal_lsn()"));
    let app = Pgoutbox::run(&standby, &nats, &["--from-standby"]);
    // Slot creation on a standby waits for a running-transactions record from the primary,
    // and the slot is already active while it waits: rows committed before it is consistent
    // are not its to decode. So wait until pgoutbox streams (/readyz 200), not for `active`.
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(app.http_port(), "/readyz").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "never streamed:\n{}", app.log());
        primary.psql("SELECT pg_log_standby_snapshot()");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    primary.psql(&numbered_rows(0, 1_000, 100));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), "1,000 rows stored", || async {
        (count(&js, "OUTBOX").await >= 1_000).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 1_000);
    assert_eq!(report.stored, 1_000, "{report:?}\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
    assert_eq!(primary.psql("SELECT count(*) FROM pg_replication_slots"), "0");
}
