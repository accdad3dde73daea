//! Seeding the stream from the outbox table: a dropped slot recovered with `--recover`, a
//! new stream backfilled with `--backfill`, each while rows keep committing, and a recovery
//! killed halfway and run again. Every row committed before, during and after is stored
//! exactly once, in commit order (rows carry their commit order in `n`).

use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{
    Stored, assert_once_in_order, assert_rows_and_letters, count, jetstream, read_all,
};
use crate::support::{
    BIGSERIAL_OUTBOX, Nats, Postgres, eventually, metric, numbered_rows, stop_and_wait_released,
    wait_until_streaming,
};

/// Waits until the stream holds at least `n` messages.
async fn wait_for(nats: &Nats, n: u64, what: &str) {
    wait_for_in(nats, "OUTBOX", n, what).await;
}

async fn wait_for_in(nats: &Nats, stream: &str, n: u64, what: &str) {
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(90), what, || async {
        (count(&js, stream).await >= n).then_some(())
    })
    .await;
}

/// Reads the whole stream and asserts rows 0..n stored once each, in order.
async fn assert_exactly_once_in_order(nats: &Nats, n: usize, log: &str) -> Vec<Stored> {
    assert_exactly_once_in_order_in(nats, "OUTBOX", n, log).await
}

async fn assert_exactly_once_in_order_in(
    nats: &Nats,
    stream: &str,
    n: usize,
    log: &str,
) -> Vec<Stored> {
    wait_for_in(nats, stream, n as u64, "every row stored").await;
    let js = jetstream(&nats.url()).await;
    let stored = read_all(&js, stream).await;
    assert_once_in_order(&stored, n, log);
    stored
}

/// 100 rows streamed, then the slot dropped while pgoutbox is stopped, then `gap` rows
/// committed while no slot exists.
async fn slot_dropped_with_rows_in_the_gap(pg: &Postgres, nats: &Nats, gap: usize) {
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(pg, nats, &[]);
    wait_until_streaming(pg, &app).await;
    pg.psql(&numbered_rows(0, 100, 10));
    wait_for(nats, 100, "the first 100 rows stored").await;
    stop_and_wait_released(pg, app).await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql(&numbered_rows(100, 100 + gap, 50));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_slot_is_recovered_from_the_table_while_rows_keep_committing() {
    let pg = Postgres::builder().conf("track_commit_timestamp = on").start();
    let nats = Nats::start();
    slot_dropped_with_rows_in_the_gap(&pg, &nats, 300).await;
    let writer = pg.start_writer(400, 0.005);
    // No margin: only rows from the stream's last transaction on are read from the table.
    let app = Pgoutbox::run(&pg, &nats, &["--recover", "--recover-margin", "0s"]);
    wait_until_streaming(&pg, &app).await;
    wait_for(&nats, 600, "rows committed during the recovery stored").await;
    let next = writer.finish();
    let stored = assert_exactly_once_in_order(&nats, next, &app.log()).await;
    let seeded: Vec<u64> = stored
        .iter()
        .filter(|m| m.header("Pgoutbox-Seed").is_some())
        .map(|m| m.json()["n"].as_u64().unwrap_or(u64::MAX))
        .collect();
    // The seed holds every row committed from the gap up to its snapshot, in order; the
    // slot sends the rest.
    let end = 100 + seeded.len() as u64;
    assert!(seeded.iter().copied().eq(100..end) && end >= 400, "seeded: {seeded:?}");
    assert!((end as usize) < next, "no row came from the slot after the seed");
    assert!(app.log().contains("commit order"), "order not said:\n{}", app.log());
    let read = seed_rows_read(&app.log());
    assert_eq!(
        read,
        10 + seeded.len(),
        "rows read: the last transaction before the gap, then the gap"
    );
    assert!(app.log().contains("seed finished"), "{}", app.log());
    assert_eq!(pg.psql("SELECT count(*) FROM pg_replication_slots"), "1", "the seed's slot stays");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_stream_is_backfilled_while_rows_keep_committing() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(&numbered_rows(0, 1_000, 100));
    let writer = pg.start_writer(1_000, 0.005);
    let mut app = Pgoutbox::run(&pg, &nats, &["--backfill"]);
    wait_until_streaming(&pg, &app).await;
    wait_for(&nats, 1_300, "rows committed during the backfill stored").await;
    let next = writer.finish();
    assert_exactly_once_in_order(&nats, next, &app.log()).await;
    assert!(app.log().contains("created-at order"), "order not said:\n{}", app.log());
    assert_eq!(metric(app.http_port(), "pgoutbox_seed_rows "), Some(0.0), "gauge reset");
    assert!(app.is_running(), "{}", app.log());
}

/// A recovery killed halfway is seen in `status` while pgoutbox is down, and the next start
/// finishes it without the flag: pgoutbox may begin a seed by itself (the stream lost what
/// only the table held), so a plain restart must not leave it half done (it exited 1
/// asking for `--recover`: the 30-minute soak, seed 29, stayed down 30 s so).
#[tokio::test(flavor = "multi_thread")]
async fn a_recovery_killed_halfway_is_finished_by_the_next_start_without_the_flag() {
    let pg = Postgres::builder().conf("track_commit_timestamp = on").start();
    let nats = Nats::start();
    slot_dropped_with_rows_in_the_gap(&pg, &nats, 50_000).await;
    let mut app = Pgoutbox::run(&pg, &nats, &["--recover"]);
    wait_for(&nats, 1_000, "part of the gap stored").await;
    app.kill9();
    assert!(count(&jetstream(&nats.url()).await, "OUTBOX").await < 50_100, "killed too late");

    let status = command(&pg, &nats).args(["status", "--json"]).output().expect("status runs");
    let report: serde_json::Value =
        serde_json::from_slice(&status.stdout).expect("status prints JSON");
    assert_eq!(report["seed"]["slot"], "pgoutbox_seed", "{report:#}");
    // The WAL the left slot pins, to judge how urgent running --recover again is.
    let pinned = report["seed"]["retained_wal_bytes"].as_i64();
    assert!(pinned.is_some_and(|bytes| bytes > 0), "{report:#}");
    assert!(report["seed"]["wal_status"].is_string(), "{report:#}");
    assert!(report["problems"].to_string().contains("did not finish"), "{report:#}");

    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(50_100, 50_200, 10));
    assert_exactly_once_in_order(&nats, 50_200, &app.log()).await;
    assert!(app.log().contains("finishing it"), "{}", app.log());
}

/// The number of rows the seed said it reads from the table.
fn seed_rows_read(log: &str) -> usize {
    let line = log.lines().find(|l| l.contains("seeding the stream from the table"));
    let rows = line.and_then(|l| l.split(" rows=").nth(1)).and_then(|r| r.split(' ').next());
    rows.and_then(|r| r.parse().ok()).unwrap_or_else(|| panic!("no seed line in:\n{log}"))
}

/// The seed's snapshot outlives NATS faults: after nats-server is killed and started again,
/// and after it was frozen long enough for pgoutbox to give up on its connection (whose
/// publishes the server then executes late), the same snapshot goes on, and what the stream
/// gained meanwhile is not sent again.
#[tokio::test(flavor = "multi_thread")]
async fn a_seed_survives_nats_killed_and_frozen_on_the_same_snapshot() {
    let pg = Postgres::builder().conf("track_commit_timestamp = on").start();
    let mut nats = Nats::start();
    slot_dropped_with_rows_in_the_gap(&pg, &nats, 60_000).await;
    let app = Pgoutbox::run(&pg, &nats, &["--recover"]);
    wait_for(&nats, 2_000, "part of the gap stored").await;
    assert!(!app.log().contains("seed finished"), "the seed ended before the fault");
    nats.kill();
    nats.start_again();
    wait_for(&nats, 20_000, "more of the gap stored after the restart").await;
    assert!(!app.log().contains("seed finished"), "the seed ended before the fault");
    let reconnects = app.log().matches("reconnecting").count();
    nats.pause();
    eventually(Duration::from_secs(40), "pgoutbox giving up on the frozen server", || async {
        (app.log().matches("reconnecting").count() > reconnects).then_some(())
    })
    .await;
    nats.resume();
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(60_100, 60_200, 10));
    let log = app.log();
    assert_exactly_once_in_order(&nats, 60_200, &log).await;
    // Once, unless nats-server lost acknowledged messages it had not yet written when it
    // was killed (2.9 writes a moment after its ack): then the seed begins again, on purpose.
    let again = log.matches("seeding again").count();
    assert_eq!(log.matches("seeding the stream from the table").count(), 1 + again, "{log}");
}

/// pgoutbox streamed into one stream, then is pointed at a new one with `--backfill`: the
/// new stream gets the table's history before the rows that keep committing, although the
/// slot had long confirmed the old rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_stream_behind_an_existing_slot_is_backfilled_with_history() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 2_000, 100));
    wait_for(&nats, 2_000, "the first stream written").await;
    stop_and_wait_released(&pg, app).await;

    let writer = pg.start_writer(2_000, 0.005);
    let new_stream = ["--stream", "HISTORY", "--subject-template", "history.{aggregate_type}.x"];
    let mut args = new_stream.to_vec();
    args.extend(["--dead-letter-subject", "history.dead_letter", "--backfill"]);
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    wait_for_in(&nats, "HISTORY", 2_300, "history and new rows in the new stream").await;
    let next = writer.finish();
    assert_exactly_once_in_order_in(&nats, "HISTORY", next, &app.log()).await;
    assert!(app.is_running(), "{}", app.log());
}

/// Issue 28, F3: a `bigserial` outbox, 100 rows streamed, the slot dropped, the table
/// truncated with its sequence restarted, 150 new rows over 3 s. The old tail's id `100`
/// is a newer row now: before, the recovery anchored its bound on it and took every new row
/// whose id the stream held as published (88 of 150 missing, no warning). A stream message
/// is the row only when its payload is the row's.
#[tokio::test(flavor = "multi_thread")]
async fn a_recovery_after_a_truncate_that_restarted_the_ids_misses_no_new_row() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(BIGSERIAL_OUTBOX);
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 100, 10));
    wait_for(&nats, 100, "the first 100 rows stored").await;
    stop_and_wait_released(&pg, app).await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql("TRUNCATE outbox RESTART IDENTITY");
    for batch in 0..15 {
        let from = 100 + batch * 10;
        pg.psql(&format!("{} SELECT pg_sleep(0.2);", numbered_rows(from, from + 10, 10)));
    }
    let app = Pgoutbox::run(&pg, &nats, &["--recover", "--recover-margin", "1s"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(250, 251, 1));
    wait_for(&nats, 251, "every event stored").await;
    let js = jetstream(&nats.url()).await;
    let stored = read_all(&js, "OUTBOX").await;
    let log = app.log();
    assert_eq!(stored.len(), 251, "events lost or doubled:\n{log}");
    // The new rows with ids 1-100 reuse ids inside the duplicate window: each is its dead
    // letter, in its place; ids 101-150 and the row after the recovery are themselves.
    assert_rows_and_letters(&stored, 100, |n| n < 200, &log);
}

/// Issue 28, item 1: a second pgoutbox started with `--recover` while the first seeds
/// dropped the first one's temporary slot, and the first went on from a slot whose
/// snapshot was not its own. Now the second stops at once, saying why, and the first
/// stores every row once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_recovery_of_the_same_slot_stops_and_leaves_the_first_whole() {
    let pg = Postgres::builder().conf("track_commit_timestamp = on").start();
    let nats = Nats::start();
    slot_dropped_with_rows_in_the_gap(&pg, &nats, 50_000).await;
    let first = Pgoutbox::run(&pg, &nats, &["--recover"]);
    wait_for(&nats, 1_000, "part of the gap stored").await;
    let mut second = Pgoutbox::run(&pg, &nats, &["--recover"]);
    let status = second.wait_exit(Duration::from_secs(30));
    let log = second.log();
    assert!(!status.success(), "{log}");
    assert!(log.contains("in use by another process") || log.contains("made again"), "{log}");
    wait_until_streaming(&pg, &first).await;
    pg.psql(&numbered_rows(50_100, 50_200, 10));
    assert_exactly_once_in_order(&nats, 50_200, &first.log()).await;
}

/// The stream of two tables holds every row of both once, each on its table's subject, in
/// the witness slot's order (`committed`): commit order, and within a transaction that wrote
/// to both, the order it wrote them in, for seeded rows as for the rows the slot sent.
async fn assert_two_tables_once(pg: &Postgres, nats: &Nats, log: &str) -> usize {
    use crate::cases::several_tables::{committed_transactions, stored_order};
    let committed = committed_transactions(pg);
    let rows: usize = committed.iter().map(Vec::len).sum();
    wait_for(nats, rows as u64, "every row of both tables stored").await;
    let js = jetstream(&nats.url()).await;
    let stored = read_all(&js, "OUTBOX").await;
    let keys = stored_order(&stored);
    let seeded: std::collections::HashSet<&String> = keys
        .iter()
        .zip(&stored)
        .filter(|(_, message)| message.header("Pgoutbox-Seed").is_some())
        .map(|(key, _)| key)
        .collect();
    let expected: Vec<String> = committed.into_iter().flatten().collect();
    if keys != expected {
        let first = keys.iter().zip(&expected).position(|(s, e)| s != e);
        panic!(
            "{} stored, {} committed; first difference at {first:?}: {:?} for {:?}\nlog:\n{log}",
            keys.len(),
            expected.len(),
            first.map(|i| &keys[i]),
            first.map(|i| &expected[i]),
        );
    }
    assert!(seeded.iter().any(|k| k.starts_with("public.")), "no row of the first table seeded");
    assert!(seeded.iter().any(|k| k.starts_with("billing.")), "no row of the second table seeded");
    seeded.len()
}

/// Issue 32, step 5: two tables, the slot dropped, rows of both committed interleaved while
/// none exists (a transaction of A, of B, of A then B, of B then A), among them a row of A
/// with the id and payload of B's row that is the stream's tail. `--recover` anchors on
/// that row of B, in B, reads both tables in one snapshot, and stores every row once on its
/// table's subject; the row of A is not taken for B's (the stream's rows are known by
/// table and id). Then live rows of two sessions after it, once, in commit order.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_slot_of_two_tables_is_recovered_once_each_on_its_subject() {
    use crate::cases::several_tables::{TABLES, session, two_tables};
    let pg = Postgres::builder().conf("track_commit_timestamp = on").start();
    let nats = Nats::start();
    two_tables(&pg);
    let app = Pgoutbox::run(&pg, &nats, &TABLES);
    wait_until_streaming(&pg, &app).await;
    let same = "00000000-0000-4000-8000-000000000032";
    // The same id and payload in both tables, each on its table's subject.
    let row = |table: &str| {
        let aggregate = if table.starts_with("public.") { "order" } else { "invoice" };
        format!(
            "INSERT INTO {table} (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('{same}', '{aggregate}', '1', 'created', '{{}}');"
        )
    };
    pg.psql(&session(0, 46, 0.0));
    pg.psql(&row("billing.outbox"));
    wait_for(&nats, 69, "the rows before the gap stored").await;
    app.sigterm();
    drop(app);
    // The witness slot stays inactive too: only pgoutbox's is waited for.
    eventually(Duration::from_secs(10), "slot released", || async {
        let active = "SELECT active FROM pg_replication_slots WHERE slot_name = 'pgoutbox'";
        (pg.psql(active) == "f").then_some(())
    })
    .await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql(&row("public.outbox"));
    pg.psql(&session(1, 200, 0.0));

    let mut args = TABLES.to_vec();
    args.extend(["--recover", "--recover-margin", "0s"]);
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let writers =
        [pg.psql_in_background(session(2, 60, 0.0)), pg.psql_in_background(session(3, 60, 0.0))];
    for writer in writers {
        writer.join().expect("writer").expect("inserts");
    }
    let log = app.log();
    let seeded = assert_two_tables_once(&pg, &nats, &log).await;
    // The gap: 200 transactions of 1 or 2 rows, and A's row with B's id.
    assert_eq!(seeded, 1 + 300, "seeded rows:\n{log}");
    assert_eq!(seed_rows_read(&log), 1 + seeded, "rows read: the tail's, then the gap");
    assert!(log.contains("tables=2") && log.contains("seed finished"), "{log}");
}

/// Issue 32, step 5: `--backfill` with two tables: both tables' history, written
/// interleaved before any slot existed, in created-at order (no commit timestamps), then
/// live rows, every row once, on its table's subject.
#[tokio::test(flavor = "multi_thread")]
async fn two_tables_are_backfilled_into_a_new_stream_once_each() {
    use crate::cases::several_tables::{TABLES, session, two_tables};
    let pg = Postgres::start();
    let nats = Nats::start();
    two_tables(&pg);
    pg.psql(&session(0, 200, 0.0));
    let mut args = TABLES.to_vec();
    args.push("--backfill");
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let writers =
        [pg.psql_in_background(session(1, 60, 0.0)), pg.psql_in_background(session(2, 60, 0.0))];
    for writer in writers {
        writer.join().expect("writer").expect("inserts");
    }
    let log = app.log();
    let seeded = assert_two_tables_once(&pg, &nats, &log).await;
    assert_eq!(seeded, 300, "every row of the history seeded:\n{log}");
    assert!(log.contains("created-at order"), "{log}");
}

/// `--recover` with a table pattern: the slot dropped while two tenants' tables stream,
/// rows committed to both while no slot exists, and a third tenant created then (adopted
/// once the seed's slot exists, its rows handed over). The seed reads every tenant table
/// the publication has in its snapshot, and each tenant's rows are in the stream once, on
/// its own subject; rows committed after the recovery come from the slot.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_slot_of_a_table_pattern_is_recovered_for_every_tenant() {
    use crate::cases::several_tables::{per_tenant, tenant_rows, tenant_table};
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&(tenant_table("tenant_1") + &tenant_table("tenant_2")));
    let pattern =
        ["--table", "tenant_*.outbox", "--subject-template", "tenants.{$schema}.{event_type}"];
    let app = Pgoutbox::run(&pg, &nats, &pattern);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&(tenant_rows("tenant_1", 0, 10) + &tenant_rows("tenant_2", 0, 10)));
    wait_for(&nats, 20, "the first 20 rows stored").await;
    stop_and_wait_released(&pg, app).await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql(&(tenant_rows("tenant_1", 10, 25) + &tenant_rows("tenant_2", 10, 20)));
    pg.psql(&(tenant_table("tenant_3") + &tenant_rows("tenant_3", 0, 5)));

    let mut args = pattern.to_vec();
    args.extend(["--recover", "--recover-margin", "0s"]);
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_rows("tenant_2", 20, 22));
    wait_for(&nats, 52, "every tenant's rows stored").await;
    let js = jetstream(&nats.url()).await;
    let stored = read_all(&js, "OUTBOX").await;
    let want = [("tenant_1", 25), ("tenant_2", 22), ("tenant_3", 5)];
    let want = want.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect();
    assert_eq!(per_tenant(&stored), want, "{}", app.log());
    let seeded = stored.iter().filter(|m| m.header("Pgoutbox-Seed").is_some()).count();
    assert_eq!(seeded, 25, "the gap's 25 rows seeded (tenant_3's adopted):\n{}", app.log());
    assert!(app.log().contains("seed finished"), "{}", app.log());
}

/// `--recover` with a table pattern, where a tenant's table never joined the publication
/// before the slot was lost (created while pgoutbox was down, or an adoption that had not
/// come round yet), and its rows are older than the stream's last message (their
/// created-at set an hour back, as a long-lived table's would be): the recovery's seed
/// reads rows only from the stream's last message on, so the table's rows come whole by
/// adoption once the seed's slot exists, never by a join before the slot that leaves them
/// to that seed (3 of 3 were lost so).
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_table_never_published_before_a_recovery_has_all_its_rows_streamed() {
    use crate::cases::several_tables::{per_tenant, tenant_rows, tenant_table};
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&tenant_table("tenant_1"));
    let pattern =
        ["--table", "tenant_*.outbox", "--subject-template", "tenants.{$schema}.{event_type}"];
    let app = Pgoutbox::run(&pg, &nats, &pattern);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_rows("tenant_1", 0, 10));
    wait_for(&nats, 10, "the first 10 rows stored").await;
    stop_and_wait_released(&pg, app).await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    let old = tenant_rows("tenant_2", 0, 3).replace(
        "INSERT INTO tenant_2.outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES (",
        "INSERT INTO tenant_2.outbox (created_at, aggregate_type, aggregate_id, event_type, \
         payload) VALUES (now() - interval '1 hour', ",
    );
    assert!(old.contains("1 hour"), "the rows' insert changed shape: {old}");
    pg.psql(&(tenant_table("tenant_2") + &old + &tenant_rows("tenant_1", 10, 12)));

    let mut args = pattern.to_vec();
    args.extend(["--recover", "--recover-margin", "0s"]);
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_rows("tenant_2", 3, 5));
    let js = jetstream(&nats.url()).await;
    let want: std::collections::HashMap<String, usize> =
        [("tenant_1".to_owned(), 12), ("tenant_2".to_owned(), 5)].into();
    let stored = eventually(Duration::from_secs(60), "every tenant's rows stored", || async {
        let stored = read_all(&js, "OUTBOX").await;
        (per_tenant(&stored) == want).then_some(stored)
    })
    .await;
    let tenant_2: Vec<String> = stored
        .iter()
        .filter(|m| m.subject.starts_with("tenants.tenant_2."))
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    let in_order: Vec<String> = (0..5).map(|k| format!("{{\"k\": {k}}}")).collect();
    assert_eq!(tenant_2, in_order, "tenant_2's rows in commit order:\n{}", app.log());
    let log = app.log();
    // Its 3 old rows, and the 2 new ones too when they committed before adoption read it.
    let adopted = log.lines().any(|l| {
        l.contains("tenant_2.outbox")
            && l.contains("rows handed over")
            && (l.contains("rows=3") || l.contains("rows=4") || l.contains("rows=5"))
    });
    assert!(adopted, "tenant_2's 3 rows not handed over by adoption:\n{log}");
}

/// A tenant table that does not fit the pattern's columns stops `--backfill` with one line
/// naming the column, rather than seeding the others and leaving its rows out.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_table_that_does_not_fit_stops_the_seed_naming_the_column() {
    use crate::cases::several_tables::{tenant_rows, tenant_table};
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&(tenant_table("tenant_1") + &tenant_rows("tenant_1", 0, 3)));
    pg.psql(
        "CREATE SCHEMA tenant_2; \
         CREATE TABLE tenant_2.outbox (id bigserial PRIMARY KEY, aggregate_type text, \
           aggregate_id text, payload jsonb NOT NULL, created_at timestamptz DEFAULT now()); \
         INSERT INTO tenant_2.outbox (aggregate_type, aggregate_id, payload) \
           VALUES ('o', '1', '{}');",
    );
    let args = [
        "--table",
        "tenant_*.outbox",
        "--subject-template",
        "tenants.{$schema}.{event_type}",
        "--backfill",
    ];
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    let status = app.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "the seed ran without tenant_2's rows:\n{}", app.log());
    let log = app.log();
    let line = log.lines().find(|l| l.contains("tenant_2.outbox") && l.contains("event_type"));
    assert!(line.is_some(), "no line naming tenant_2.outbox and event_type:\n{log}");
    let js = jetstream(&nats.url()).await;
    assert_eq!(count(&js, "OUTBOX").await, 0, "rows seeded before the refusal");
    assert_no_seed_slot(&pg, &log);
}

/// No `<slot>_seed` slot is left to pin WAL by a seed that stopped for good.
fn assert_no_seed_slot(pg: &Postgres, log: &str) {
    let left = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pgoutbox_seed'";
    assert_eq!(pg.psql(left), "0", "the seed's temporary slot is left, pinning WAL:\n{log}");
}

/// A recovery that cannot tell where the missing rows begin (none of the stream's last
/// messages has its row in the table any more) stops, saying to use `--backfill`, and drops
/// the temporary slot it made: it would pin WAL until someone noticed it.
#[tokio::test(flavor = "multi_thread")]
async fn a_recovery_without_an_anchor_stops_and_leaves_no_slot_pinning_wal() {
    let pg = Postgres::start();
    let nats = Nats::start();
    slot_dropped_with_rows_in_the_gap(&pg, &nats, 10).await;
    // The streamed rows are gone, and a row of the gap is older than the stream's tail.
    pg.psql(
        "DELETE FROM outbox WHERE (payload->>'n')::int < 100; \
         UPDATE outbox SET created_at = now() - interval '1 hour' \
         WHERE (payload->>'n')::int = 100",
    );
    let mut app = Pgoutbox::run(&pg, &nats, &["--recover"]);
    let status = app.wait_exit(Duration::from_secs(60));
    let log = app.log();
    assert!(!status.success(), "{log}");
    assert!(log.contains("use --backfill instead"), "{log}");
    assert_no_seed_slot(&pg, &log);
}

/// A seed stopped by SIGTERM halfway drops its temporary slot (the next `--recover` makes a
/// new one from a new snapshot anyway), and that next run stores every row once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_seed_stopped_halfway_drops_its_slot_and_the_next_recovery_finishes() {
    let pg = Postgres::builder().conf("track_commit_timestamp = on").start();
    let nats = Nats::start();
    slot_dropped_with_rows_in_the_gap(&pg, &nats, 50_000).await;
    let mut app = Pgoutbox::run(&pg, &nats, &["--recover"]);
    wait_for(&nats, 1_000, "part of the gap stored").await;
    app.sigterm();
    let status = app.wait_exit(Duration::from_secs(30));
    let log = app.log();
    assert!(status.success(), "{log}");
    assert!(count(&jetstream(&nats.url()).await, "OUTBOX").await < 50_100, "stopped too late");
    assert_no_seed_slot(&pg, &log);

    let app = Pgoutbox::run(&pg, &nats, &["--recover"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(50_100, 50_200, 10));
    assert_exactly_once_in_order(&nats, 50_200, &app.log()).await;
}

/// `teardown --yes` also drops the slot a seed killed halfway left (`<slot>_seed`): it is
/// pgoutbox's slot, and nothing else would ever drop it.
#[tokio::test(flavor = "multi_thread")]
async fn teardown_drops_the_slot_a_killed_seed_left() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let setup = command(&pg, &nats).arg("setup").output().expect("setup runs");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));
    pg.psql("SELECT pg_create_logical_replication_slot('pgoutbox_seed', 'pgoutput')");
    let teardown = command(&pg, &nats).args(["teardown", "--yes"]).output().expect("runs");
    let said = String::from_utf8_lossy(&teardown.stdout);
    assert!(teardown.status.success(), "{}", String::from_utf8_lossy(&teardown.stderr));
    assert!(said.contains("pgoutbox_seed"), "teardown did not say it dropped it: {said}");
    assert_eq!(pg.psql("SELECT count(*) FROM pg_replication_slots"), "0", "{said}");
}

/// SIGTERM while a recovery is still beginning (its slot made, the stream's 60,000 messages
/// being read to learn which rows it holds) drops the slot too: it exits without leaving
/// one to pin WAL.
#[tokio::test(flavor = "multi_thread")]
async fn a_seed_stopped_while_it_begins_drops_its_slot() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 60_000, 1_000));
    wait_for(&nats, 60_000, "60,000 rows stored").await;
    stop_and_wait_released(&pg, app).await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql(&numbered_rows(60_000, 60_010, 10));
    let mut app = Pgoutbox::run(&pg, &nats, &["--recover", "--recover-margin", "1h"]);
    let made = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pgoutbox_seed'";
    eventually(Duration::from_secs(30), "the seed's slot made", || async {
        (pg.psql(made) == "1").then_some(())
    })
    .await;
    app.sigterm();
    let status = app.wait_exit(Duration::from_secs(30));
    let log = app.log();
    assert!(status.success(), "{log}");
    assert!(!log.contains("seed finished"), "the seed finished before SIGTERM:\n{log}");
    assert_no_seed_slot(&pg, &log);
}

/// Dropping the unfinished seed's slot never holds up the exit: with Postgres black-holed
/// (connections open, nothing gets through) a SIGTERM halfway through a recovery still
/// ends pgoutbox within the drop's limit (15 s), saying the slot was not dropped.
#[tokio::test(flavor = "multi_thread")]
async fn a_seed_stopped_with_postgres_black_holed_exits_within_the_limit() {
    use crate::support::proxy::FaultProxy;
    let pg = Postgres::builder().conf("track_commit_timestamp = on").start();
    let nats = Nats::start();
    slot_dropped_with_rows_in_the_gap(&pg, &nats, 50_000).await;
    let proxy = FaultProxy::start_bytes(pg.port()).await;
    let mut cmd = command(&pg, &nats);
    let via_proxy = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    cmd.env("PGOUTBOX_DATABASE_URL", via_proxy).args(["run", "--recover"]);
    let mut app = Pgoutbox::spawn(cmd);
    wait_for(&nats, 1_000, "part of the gap stored").await;
    proxy.blackhole();
    app.sigterm();
    let stopped = std::time::Instant::now();
    app.wait_exit(Duration::from_secs(40));
    let log = app.log();
    assert!(stopped.elapsed() < Duration::from_secs(30), "took {:?}:\n{log}", stopped.elapsed());
    assert!(log.contains("could not drop the unfinished seed's slot"), "{log}");
}

/// A SIGTERM that comes once Postgres has made the seed's slot but before its answer
/// reached pgoutbox still drops the slot: the slot is kept by the server from the moment it
/// is made, whether or not anyone heard. Here the making waits on an open transaction,
/// then its answer is held up on the way back by a slow link while the SIGTERM comes.
#[tokio::test(flavor = "multi_thread")]
async fn a_seed_stopped_before_the_answer_of_its_slot_arrives_drops_the_slot() {
    use crate::support::proxy::FaultProxy;
    let pg = Postgres::start();
    let nats = Nats::start();
    slot_dropped_with_rows_in_the_gap(&pg, &nats, 10).await;
    let (blocker, connection) =
        tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    blocker.batch_execute("BEGIN; SELECT txid_current()").await.expect("an open transaction");
    let proxy = FaultProxy::start_bytes(pg.port()).await;
    let mut cmd = command(&pg, &nats);
    let via_proxy = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    cmd.env("PGOUTBOX_DATABASE_URL", via_proxy).args(["run", "--recover"]);
    let mut app = Pgoutbox::spawn(cmd);
    let making = "SELECT count(*) FROM pg_stat_activity \
                  WHERE backend_type = 'walsender' AND wait_event = 'transactionid'";
    eventually(Duration::from_secs(30), "the slot's making waiting on the transaction", || async {
        (pg.psql(making) == "1").then_some(())
    })
    .await;
    proxy.set_latency(Duration::from_secs(5));
    blocker.batch_execute("COMMIT").await.expect("commit");
    // Made, and let go by its walsender once its answer is sent (while being made it is held).
    let answered = "SELECT count(*) FROM pg_replication_slots \
                    WHERE slot_name = 'pgoutbox_seed' AND active_pid IS NULL";
    eventually(Duration::from_secs(30), "the slot made and its answer sent", || async {
        (pg.psql(answered) == "1").then_some(())
    })
    .await;
    app.sigterm();
    app.wait_exit(Duration::from_secs(60));
    let log = app.log();
    assert!(!log.contains("seed finished"), "the seed finished before SIGTERM:\n{log}");
    assert_no_seed_slot(&pg, &log);
}
