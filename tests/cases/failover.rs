//! PostgreSQL 17+ failover slots (`--failover`). A primary with a physical standby that
//! synchronises the slot (`sync_replication_slots`, `synchronized_standby_slots` on the
//! primary); rows committed while pgoutbox streams, the primary killed, a pgoutbox pointed
//! at the standby while it is still in recovery, the standby promoted, more rows: every row
//! is stored exactly once, in commit order, with no `--recreate-slot` and nothing skipped.
//! Below 17, `--failover` is refused with one line naming the server's version, so the
//! default suite (Debian's 15) proves that instead.

use std::time::Duration;

use crate::support::pg_bin;
use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

/// A primary whose logical walsenders wait for the standby's physical slot, so pgoutbox
/// never publishes a row the standby has not received.
fn primary_for_failover() -> Postgres {
    let primary = Postgres::start();
    primary.psql("SELECT pg_create_physical_replication_slot('standby1', true)");
    primary.psql("ALTER SYSTEM SET synchronized_standby_slots = 'standby1'");
    primary.psql("SELECT pg_reload_conf()");
    primary.psql(include_str!("../../sql/outbox.sql"));
    primary
}

const STANDBY_CONF: &[&str] =
    &["primary_slot_name = 'standby1'", "hot_standby_feedback = on", "sync_replication_slots = on"];

fn assert_refused_below_17(pg: &Postgres, nats: &Nats) {
    let mut app = Pgoutbox::run(pg, nats, &["--failover"]);
    let status = app.wait_exit(Duration::from_secs(30));
    let log = app.log();
    assert!(!status.success(), "--failover accepted on PostgreSQL {}:\n{log}", pg_bin::major());
    let version = pg.psql("SHOW server_version");
    let line = log
        .lines()
        .find(|l| l.contains("--failover needs PostgreSQL 17"))
        .unwrap_or_else(|| panic!("no refusal naming the version:\n{log}"));
    assert!(line.contains(&format!("PostgreSQL {version}")), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failover_slot_carries_every_row_once_through_a_promotion() {
    if pg_bin::major() < 17 {
        let pg = Postgres::start();
        let nats = Nats::start();
        pg.psql(include_str!("../../sql/outbox.sql"));
        assert_refused_below_17(&pg, &nats);
        assert_eq!(pg.psql("SELECT count(*) FROM pg_replication_slots"), "0");
        return;
    }
    let mut primary = primary_for_failover();
    let nats = Nats::start();
    let mut old = Pgoutbox::run(&primary, &nats, &["--failover"]);
    wait_until_streaming(&primary, &old).await;
    assert_eq!(
        primary.psql("SELECT failover FROM pg_replication_slots WHERE slot_name = 'pgoutbox'"),
        "t"
    );
    let standby = primary.start_standby(STANDBY_CONF);

    primary.psql(&numbered_rows(0, 500, 50));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "500 rows stored", || async {
        (count(&js, "OUTBOX").await == 500).then_some(())
    })
    .await;
    // The standby's copy of the slot is usable once synced and no longer temporary.
    eventually(Duration::from_secs(60), "the slot synchronised to the standby", || async {
        let q = "SELECT synced AND NOT temporary FROM pg_replication_slots \
                 WHERE slot_name = 'pgoutbox'";
        (standby.try_psql(q).as_deref() == Ok("t")).then_some(())
    })
    .await;

    // More rows, the standby has them all, then the primary dies under the running pgoutbox.
    primary.psql(&numbered_rows(500, 1_000, 100));
    standby.wait_replayed(&primary.psql("SELECT pg_current_wal_lsn()"));
    primary.stop("immediate");
    old.kill9();

    let mut app = Pgoutbox::run(&standby, &nats, &["--failover"]);
    eventually(Duration::from_secs(20), "waiting while in recovery", || async {
        app.log().contains("Postgres is in recovery").then_some(())
    })
    .await;
    standby.promote();
    standby.wait_promoted();
    // The data directory came with the primary's postgresql.auto.conf: the new primary has
    // no slot `standby1`, and logical walsenders would wait for it forever. The operator's
    // step after a promotion (docs/runbooks/failover.md).
    standby.psql("ALTER SYSTEM RESET synchronized_standby_slots");
    standby.psql("SELECT pg_reload_conf()");
    wait_until_streaming(&standby, &app).await;
    standby.psql(&numbered_rows(1_000, 1_500, 100));
    eventually(Duration::from_secs(60), "1,500 rows stored", || async {
        (count(&js, "OUTBOX").await >= 1_500).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 1_500);
    assert_eq!(report.stored, 1_500, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0), "{report:?}");
    assert!(app.is_running(), "{}", app.log());
    assert!(!app.log().contains("does not exist"), "{}", app.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn failover_is_turned_on_for_an_existing_slot() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    crate::support::stop_and_wait_released(&pg, app).await;
    if pg_bin::major() < 17 {
        assert_refused_below_17(&pg, &nats);
        return;
    }
    let failover = "SELECT failover FROM pg_replication_slots WHERE slot_name = 'pgoutbox'";
    assert_eq!(pg.psql(failover), "f");
    let app = Pgoutbox::run(&pg, &nats, &["--failover"]);
    wait_until_streaming(&pg, &app).await;
    assert_eq!(pg.psql(failover), "t", "{}", app.log());
    assert!(app.log().contains("failover turned on"), "{}", app.log());
}

/// A writer that never pauses, from the moment pgoutbox made its slot, and a 20 s durability
/// horizon: the standby's copy of the slot becomes persistent once the primary's slot has
/// moved past what the standby reserved, which the horizon allows once its first positions
/// are released (before issue 68 the slot never moved under such a writer, and a promotion
/// dropped the temporary copy). Then the failover loses nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_failover_slot_is_synced_and_carries_every_row_under_a_writer_that_never_pauses() {
    if pg_bin::major() < 17 {
        return; // --failover is refused below 17 (the test above)
    }
    let mut primary = primary_for_failover();
    let standby = primary.start_standby(STANDBY_CONF);
    let nats = Nats::start();
    let args = ["--failover", "--durability-horizon", "20s"];
    let mut old = Pgoutbox::run(&primary, &nats, &args);
    wait_until_streaming(&primary, &old).await;
    let made = std::time::Instant::now();
    // From the slot's first moments on (rows committed before it are not in its stream).
    let writer = primary.start_writer(0, 0.02);
    eventually(Duration::from_secs(120), "the slot synchronised to the standby", || async {
        let q = "SELECT synced AND NOT temporary FROM pg_replication_slots \
                 WHERE slot_name = 'pgoutbox'";
        (standby.try_psql(q).as_deref() == Ok("t")).then_some(())
    })
    .await;
    eprintln!("the standby's slot was persistent {:?} after pgoutbox made it", made.elapsed());
    let written = writer.finish();
    standby.wait_replayed(&primary.psql("SELECT pg_current_wal_lsn()"));
    primary.stop("immediate");
    old.kill9();

    let mut app = Pgoutbox::run(&standby, &nats, &args);
    standby.promote();
    standby.wait_promoted();
    standby.psql("ALTER SYSTEM RESET synchronized_standby_slots");
    standby.psql("SELECT pg_reload_conf()");
    wait_until_streaming(&standby, &app).await;
    standby.psql(&numbered_rows(written, written + 100, 100));
    let js = jetstream(&nats.url()).await;
    let total = written as u64 + 100;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while count(&js, "OUTBOX").await < total && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let report = audit(&read_all(&js, "OUTBOX").await, total as usize);
    assert_eq!(report.stored, total as usize, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0), "{report:?}");
    assert!(app.is_running(), "{}", app.log());
}
