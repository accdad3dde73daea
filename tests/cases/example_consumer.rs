//! The example consumer (`examples/consumer/`, issue 48) against real servers: pgoutbox
//! spreads 1,000 random transactions of 1-50 events (41 aggregates, some events emitted
//! with `pg_logical_emit_message`) over 4 partitions; the consumer is killed with -9 twice
//! while it applies them, pgoutbox once. In the consumer's own database every event is
//! applied once, each transaction whole in one transaction, and each aggregate's events in
//! commit order.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, example_consumer_binary};
use crate::support::{
    Lcg, Nats, Postgres, numbered_rows, stop_and_wait_released, wait_until_streaming,
};

const PARTITIONS: &str = "4";
const AGGREGATES: u64 = 41;
/// Where pgoutbox puts the transactions' ends, and the example reads them by default.
const ENDS: &str = "outbox.transactions";

fn start_consumer(pg: &Postgres, nats: &Nats) -> Pgoutbox {
    start_consumer_with(pg, nats, &[])
}

/// The consumer with settings `env` besides the servers' and the partitions'.
fn start_consumer_with(pg: &Postgres, nats: &Nats, env: &[(&str, &str)]) -> Pgoutbox {
    let mut cmd = Command::new(example_consumer_binary());
    cmd.env("NATS_URL", nats.url())
        .env("PARTITIONS", PARTITIONS)
        .env("CONSUMER_DATABASE_URL", pg.url_for("postgres", None, "consumer"))
        .envs(env.iter().copied());
    Pgoutbox::spawn(cmd) // a child process with its log: the consumer's
}

/// 1,000 transactions of 1-50 events numbered in commit order, each event's aggregate its
/// number modulo [`AGGREGATES`]; every seventh transaction emits one event instead of
/// inserting it, and every 97th has one of 1.5 MB, over the server's `max_payload` (stored
/// in the Object Store). Returns the SQL and each transaction's events.
fn transactions(random: &mut Lcg) -> (String, Vec<Vec<u64>>) {
    let (mut sql, mut made, mut n) = (String::new(), Vec::new(), 0u64);
    for t in 0..1_000 {
        let events: Vec<u64> = (n..n + random.between(1, 51)).collect();
        sql.push_str("BEGIN;\n");
        for &e in &events {
            let aggregate = e % AGGREGATES;
            if t % 7 == 3 && e == events[0] {
                sql.push_str(&format!(
                    "SELECT pg_logical_emit_message(true, 'outbox', '{{\"id\":\"e{e}\",\
                     \"aggregate_type\":\"order\",\"aggregate_id\":\"{aggregate}\",\
                     \"event_type\":\"created\",\"payload\":{{\"n\":{e}}}}}');\n"
                ));
            } else if t % 97 == 5 && e == events[0] {
                // Too large for a message: stored in the Object Store, fetched by the consumer.
                sql.push_str(&format!(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                     VALUES ('order', '{aggregate}', 'created', \
                     jsonb_build_object('n', {e}, 'pad', repeat('x', 1500000)));\n"
                ));
            } else {
                sql.push_str(&format!(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                     VALUES ('order', '{aggregate}', 'created', '{{\"n\": {e}}}');\n"
                ));
            }
        }
        sql.push_str("COMMIT;\n");
        n += events.len() as u64;
        made.push(events);
    }
    (sql, made)
}

/// pgoutbox's arguments for the example: 4 partitions in the subject, payloads too large for
/// a message in the Object Store, and `extra`.
fn partitioned_with(extra: &[&'static str]) -> Vec<&'static str> {
    let template = "outbox.{$partition}.{aggregate_type}.{event_type}";
    let args = ["--partitions", PARTITIONS, "--subject-template", template];
    let emitted = ["--message-prefix", "outbox"];
    [&args[..], &["--object-store", "PAYLOADS"], &emitted[..], extra].concat()
}

/// `(event, the order the consumer applied it in)`, by event: each aggregate's events
/// (event number modulo [`AGGREGATES`]) applied in commit order.
fn assert_each_aggregate_in_commit_order(applied: impl Iterator<Item = (u64, u64)> + Clone) {
    for aggregate in 0..AGGREGATES {
        let orders: Vec<u64> =
            applied.clone().filter(|(n, _)| n % AGGREGATES == aggregate).map(|(_, o)| o).collect();
        assert!(orders.is_sorted(), "aggregate {aggregate} applied out of commit order");
    }
}

/// How many events the consumer applied.
fn applied(pg: &Postgres) -> u64 {
    let made = pg.psql_db("consumer", "SELECT to_regclass('consumer_events') IS NOT NULL");
    if made != "t" {
        return 0;
    }
    pg.psql_db("consumer", "SELECT count(*) FROM consumer_events").parse().unwrap_or(0)
}

/// Waits (2 min at most) until the consumer applied `at_least` events; fails with its log.
async fn wait_applied(pg: &Postgres, consumer: &Pgoutbox, at_least: u64, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while applied(pg) < at_least {
        let log = consumer.log();
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {} applied; consumer:\n{log}",
            applied(pg)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_consumer_applies_each_transaction_once_whole_and_in_key_order() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE DATABASE consumer");
    let args = partitioned_with(&[]);
    let mut first = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &first).await;
    let (sql, made) = transactions(&mut Lcg::from_time());
    let total: u64 = made.iter().map(|t| t.len() as u64).sum();
    let writer = pg.psql_in_background(sql);

    let mut consumer = start_consumer(&pg, &nats);
    wait_applied(&pg, &consumer, total / 3, "a third applied").await;
    consumer.kill9();
    first.kill9();
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    consumer = start_consumer(&pg, &nats);
    wait_applied(&pg, &consumer, total * 2 / 3, "two thirds applied").await;
    consumer.kill9();
    consumer = start_consumer(&pg, &nats);
    writer.join().expect("the writer").expect("the transactions commit");
    wait_applied(&pg, &consumer, total, "every event applied").await;
    assert!(consumer.is_running(), "the consumer exited: {}", consumer.log());
    assert!(app.is_running(), "pgoutbox exited: {}", app.log());

    // Each event: in which consumer transaction it was applied, and in which order.
    let rows = pg.psql_db(
        "consumer",
        "SELECT convert_from(payload, 'UTF8')::json->>'n', applied_in, applied_order \
         FROM consumer_events",
    );
    let mut events: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for line in rows.lines() {
        let fields: Vec<u64> = line.split('|').filter_map(|f| f.trim().parse().ok()).collect();
        let [n, applied_in, order] = fields[..] else { panic!("a row of three numbers: {line}") };
        assert!(events.insert(n, (applied_in, order)).is_none(), "event {n} applied twice");
    }
    assert_eq!(events.len() as u64, total, "events applied, of {total}");
    let mut sizes: BTreeMap<u64, usize> = BTreeMap::new();
    for &(applied_in, _) in events.values() {
        *sizes.entry(applied_in).or_default() += 1;
    }
    for transaction in &made {
        let (applied_in, _) = events[&transaction[0]];
        let together = transaction.iter().all(|e| events[e].0 == applied_in);
        assert!(together && sizes[&applied_in] == transaction.len(), "{transaction:?} not whole");
    }
    assert_each_aggregate_in_commit_order(events.iter().map(|(n, e)| (*n, e.1)));
}

/// Rows seeded by a `--backfill`, then by a `--recover` after the slot was dropped: every
/// seed numbers its positions from `0/0:0`. Before, the example named a seeded row's
/// transaction by its position, so the second seed's rows were transactions "applied
/// before" and skipped in silence (10 of 15 applied).
#[tokio::test(flavor = "multi_thread")]
async fn the_example_consumer_applies_the_rows_of_every_seed_once() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE DATABASE consumer");
    // One transaction each: the recovery reads from the last row the stream holds, so its
    // positions start again where the backfill's did.
    pg.psql(&numbered_rows(0, 10, 1));
    let template = "outbox.{$partition}.{aggregate_type}.{event_type}";
    let args = [["--partitions", PARTITIONS], ["--subject-template", template]].concat();
    let app = Pgoutbox::run(&pg, &nats, &[&args[..], &["--backfill"]].concat());
    wait_until_streaming(&pg, &app).await;
    let consumer = start_consumer(&pg, &nats);
    wait_applied(&pg, &consumer, 10, "the backfill applied").await;

    stop_and_wait_released(&pg, app).await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql(&numbered_rows(10, 15, 1));
    let recovery = ["--recover", "--recover-margin", "0s"];
    let app = Pgoutbox::run(&pg, &nats, &[&args[..], &recovery].concat());
    wait_applied(&pg, &consumer, 15, "the recovery applied").await;
    let n = "(convert_from(payload, 'UTF8')::json->>'n')::int";
    let ns = pg.psql_db("consumer", &format!("SELECT {n} FROM consumer_events ORDER BY {n}"));
    let ns: Vec<u64> = ns.lines().filter_map(|n| n.trim().parse().ok()).collect();
    assert_eq!(ns, (0..15).collect::<Vec<_>>(), "{}", consumer.log());
    stop_and_wait_released(&pg, app).await;
}

/// One process for all partitions, a transaction over partitions 0 and 1 (its last event
/// on 1), 3,000 events on partition 1 before it, and a seeded row on partition 0 after it.
/// Before, each partition had a reader of its own: partition 0's reached the seeded row
/// long before partition 1's reached the transaction's last event, took the transaction
/// for one cut by the lost slot, applied its first event alone and skipped the last as of
/// a transaction applied before (the consumer soak on nats-server 2.9, 30 minutes: 2,747
/// events never applied). Now one reader reads the stream in order.
#[tokio::test(flavor = "multi_thread")]
async fn one_process_for_all_partitions_cuts_no_transaction_whose_events_are_still_on_their_way() {
    const BEHIND: usize = 3_000;
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE DATABASE consumer");
    // FNV-1a's last bit: aggregate "a" is on partition 0 of 2, "b" on partition 1.
    let template = "outbox.{$partition}.{aggregate_type}.{event_type}";
    let args = ["--partitions", "2", "--subject-template", template];
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let row = |aggregate: &str, n: usize| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', '{aggregate}', 'created', '{{\"n\": {n}}}');\n"
        )
    };
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', 'b', 'created', jsonb_build_object('n', n) \
         FROM generate_series(0, {}) n",
        BEHIND - 1
    ));
    pg.psql(&format!("BEGIN;\n{}{}COMMIT;", row("a", BEHIND), row("b", BEHIND + 1)));
    let js = crate::support::stream::jetstream(&nats.url()).await;
    let stored = BEHIND as u64 + 2;
    crate::support::eventually(Duration::from_secs(60), "every row stored", || async {
        (crate::support::stream::count(&js, "OUTBOX").await >= stored).then_some(())
    })
    .await;
    stop_and_wait_released(&pg, app).await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql(&row("a", BEHIND + 2));
    let recovery = ["--recover", "--recover-margin", "0s"];
    let app = Pgoutbox::run(&pg, &nats, &[&args[..], &recovery].concat());
    crate::support::eventually(Duration::from_secs(60), "the seeded row stored", || async {
        (crate::support::stream::count(&js, "OUTBOX").await > stored).then_some(())
    })
    .await;

    let consumer = start_consumer_with(&pg, &nats, &[("PARTITIONS", "2")]);
    wait_applied(&pg, &consumer, BEHIND as u64 + 3, "every event applied").await;
    let whole = pg.psql_db(
        "consumer",
        &format!(
            "SELECT count(*) FROM consumer_events WHERE (convert_from(payload, 'UTF8')::json->>'n')::int \
             IN ({BEHIND}, {}) GROUP BY transaction",
            BEHIND + 1
        ),
    );
    assert_eq!(whole, "2", "the transaction applied whole\n{}", consumer.log());
    assert!(!consumer.log().contains("no last"), "{}", consumer.log());
    stop_and_wait_released(&pg, app).await;
}

const ORDERS_TEMPLATE: &str = "orders.{$partition}.{aggregate_type}.{event_type}";

/// The README's way to the example consumer, as a reader follows it: `pgoutbox run` as the
/// quick start has it (stream `OUTBOX`, subjects `outbox.*.*`), then partitions. On that
/// stream the partitioned template is refused with one line (the README sent readers
/// there: pgoutbox never changes an existing stream); stopped and torn down, pgoutbox
/// streams into a stream of its own, and the consumer, told its stream and subjects'
/// root, applies every row, with no word of a stream made again.
#[tokio::test(flavor = "multi_thread")]
async fn the_readme_s_way_to_the_example_consumer_works_as_written() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE DATABASE consumer");
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 3, 1));
    stop_and_wait_released(&pg, app).await;

    let partitioned = "outbox.{$partition}.{aggregate_type}.{event_type}";
    let mut on_outbox = crate::support::pgoutbox::command(&pg, &nats);
    on_outbox.args(["run", "--partitions", PARTITIONS, "--subject-template", partitioned]);
    let refused = on_outbox.output().expect("pgoutbox run");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("do not cover"), "{said}");

    let mut teardown = crate::support::pgoutbox::command(&pg, &nats);
    let torn = teardown.args(["teardown", "--yes"]).output().expect("pgoutbox teardown");
    assert!(torn.status.success(), "{}", String::from_utf8_lossy(&torn.stderr));
    let ordered = [
        ["--stream", "ORDERS", "--partitions", PARTITIONS],
        ["--dead-letter-subject", "orders.dead_letter", "--subject-template", ORDERS_TEMPLATE],
    ];
    let app = Pgoutbox::run(&pg, &nats, &ordered.concat());
    wait_until_streaming(&pg, &app).await;
    let consumer = start_consumer_with(
        &pg,
        &nats,
        &[("PGOUTBOX_STREAM", "ORDERS"), ("SUBJECT_ROOT", "orders")],
    );
    pg.psql(&numbered_rows(3, 13, 1));
    wait_applied(&pg, &consumer, 10, "the rows applied from stream ORDERS").await;
    let log = app.log();
    assert!(!log.contains("created again"), "a new stream taken for one made again:\n{log}");
    stop_and_wait_released(&pg, app).await;
}

/// Each partition in a process of its own (`PARTITION=<p>`), reading its partition with
/// the transactions' ends (`--transaction-subject`, issue 57): the same 1,000 transactions,
/// one of the four processes killed with -9 twice and pgoutbox once. Every event applied
/// once; each transaction's part on a partition applied whole, in one transaction of the
/// consumer's database holding that part alone; each aggregate in commit order.
#[tokio::test(flavor = "multi_thread")]
async fn each_partition_s_own_consumer_applies_its_part_of_each_transaction_once_and_whole() {
    let pg = Postgres::start();
    let nats = Nats::start();
    if nats.release() < (2, 10) {
        return; // one consumer of several filter subjects: nats-server 2.10+
    }
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE DATABASE consumer");
    let args = partitioned_with(&["--transaction-subject", "outbox.transactions"]);
    let mut first = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &first).await;
    let (sql, made) = transactions(&mut Lcg::from_time());
    let total: u64 = made.iter().map(|t| t.len() as u64).sum();
    let writer = pg.psql_in_background(sql);
    let partition = |p: &str| start_consumer_with(&pg, &nats, &[("PARTITION", p)]);
    let mut consumers: Vec<Pgoutbox> = ["0", "1", "2", "3"].map(partition).into();

    wait_applied(&pg, &consumers[1], total / 3, "a third applied").await;
    consumers[1].kill9();
    first.kill9();
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    consumers[1] = partition("1");
    wait_applied(&pg, &consumers[1], total * 2 / 3, "two thirds applied").await;
    consumers[1].kill9();
    consumers[1] = partition("1");
    writer.join().expect("the writer").expect("the transactions commit");
    wait_applied(&pg, &consumers[1], total, "every event applied").await;
    for consumer in &mut consumers {
        assert!(consumer.is_running(), "a consumer exited: {}", consumer.log());
        assert!(!consumer.log().contains("applied as it is"), "{}", consumer.log());
    }
    assert!(app.is_running(), "pgoutbox exited: {}", app.log());

    let rows = pg.psql_db(
        "consumer",
        "SELECT convert_from(payload, 'UTF8')::json->>'n', applied_in, applied_order, \
         split_part(subject, '.', 2) FROM consumer_events",
    );
    // Each event: (the consumer transaction it was applied in, its order, its partition).
    let mut events: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    for line in rows.lines() {
        let fields: Vec<u64> = line.split('|').filter_map(|f| f.trim().parse().ok()).collect();
        let [n, applied_in, order, p] = fields[..] else { panic!("four numbers: {line}") };
        assert!(events.insert(n, (applied_in, order, p)).is_none(), "event {n} applied twice");
    }
    assert_eq!(events.len() as u64, total, "events applied, of {total}");
    let mut sizes: BTreeMap<u64, usize> = BTreeMap::new();
    for &(applied_in, _, _) in events.values() {
        *sizes.entry(applied_in).or_default() += 1;
    }
    for transaction in &made {
        let mut parts: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for e in transaction {
            parts.entry(events[e].2).or_default().push(*e);
        }
        for (p, part) in parts {
            let applied_in = events[&part[0]].0;
            let together = part.iter().all(|e| events[e].0 == applied_in);
            assert!(together && sizes[&applied_in] == part.len(), "{part:?} on {p} not whole");
        }
    }
    assert_each_aggregate_in_commit_order(events.iter().map(|(n, e)| (*n, e.1)));
}

/// One row of `outbox` for aggregate `n`, with a TTL (`--ttl-column`) and a due time
/// (`--schedule-column`) when given.
fn row(n: u32, ttl: &str, deliver_at: &str) -> String {
    format!(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, ttl, \
         deliver_at) VALUES ('00000000-0000-0000-0000-{n:012}', 'order', '{n}', 'created', \
         '{{\"n\": {n}}}', {ttl}, {deliver_at});\n"
    )
}

/// A partition's own consumer (`PARTITION=<p>`) meets a transaction's scheduled row and one
/// whose message expired (`Nats-TTL`) before it was read, as docs/how-to/consume.md says:
/// the part short of what its end counts is applied as it is, and said; the scheduled row,
/// counted apart by its end, is applied alone at its time under its own id; a kill -9 after
/// it applies nothing twice. The example reading every partition by the marks alone cannot
/// tell the expired message from one still to come: it says so on stderr, and waits on.
/// nats-server 2.12+ (schedules).
#[tokio::test(flavor = "multi_thread")]
async fn each_partition_s_consumer_applies_a_part_short_of_an_expired_message_and_a_scheduled_row()
{
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN ttl text, ADD COLUMN deliver_at timestamptz;");
    pg.psql("CREATE DATABASE consumer");
    let template = "outbox.{$partition}.{aggregate_type}.{event_type}";
    let args = [
        ["--partitions", "1", "--subject-template", template],
        ["--ttl-column", "ttl", "--schedule-column", "deliver_at"],
    ]
    .concat();
    let mut app =
        Pgoutbox::run(&pg, &nats, &[&args[..], &["--transaction-subject", ENDS]].concat());
    if app.refused_before(&nats, (2, 12), "--schedule-column needs nats-server 2.12 or later") {
        return;
    }
    wait_until_streaming(&pg, &app).await;
    // Row 2 lives 1 s, gone before any consumer reads partition 0.
    pg.psql(&format!(
        "BEGIN;\n{}{}{}COMMIT;",
        row(1, "NULL", "NULL"),
        row(2, "'1s'", "NULL"),
        row(3, "NULL", "NULL")
    ));
    let js = crate::support::stream::jetstream(&nats.url()).await;
    crate::support::eventually(Duration::from_secs(20), "row 2 expired", || async {
        // Rows 1 and 3 and the end.
        (crate::support::stream::count(&js, "OUTBOX").await == 3).then_some(())
    })
    .await;
    // Row 5 is due in 3 s.
    let due = "now() + interval '3 seconds'";
    pg.psql(&format!("BEGIN;\n{}{}COMMIT;", row(4, "NULL", "NULL"), row(5, "NULL", due)));

    let mut consumer = start_consumer_with(&pg, &nats, &[("PARTITION", "0")]);
    wait_applied(&pg, &consumer, 4, "rows 1, 3, 4 and the delivery of 5").await;
    let id = |n: u32| format!("00000000-0000-0000-0000-{n:012}");
    let commit_of = |n: u32| {
        let query = format!("SELECT transaction FROM consumer_events WHERE id = '{}'", id(n));
        pg.psql_db("consumer", &query)
    };
    let applied = pg.psql_db("consumer", "SELECT id FROM consumer_events ORDER BY applied_order");
    assert_eq!(
        applied.lines().collect::<Vec<_>>(),
        [id(1), id(3), id(4), id(5)],
        "{}",
        consumer.log()
    );
    let log = consumer.log();
    assert!(
        log.contains("has 2 events on partition 0, its end counts 3: applied as it is"),
        "{log}"
    );
    // The first part in one transaction of the consumer's database, the delivery alone.
    let together = "SELECT count(DISTINCT applied_in) FROM consumer_events WHERE id IN ($1, $2)";
    let together =
        together.replace("$1", &format!("'{}'", id(1))).replace("$2", &format!("'{}'", id(3)));
    assert_eq!(pg.psql_db("consumer", &together), "1");

    // All partitions in one process, by the marks alone: it cannot tell row 2 removed from
    // row 2 still to come, and says so rather than wait in silence.
    pg.psql("CREATE DATABASE whole");
    let whole_db = pg.url_for("postgres", None, "whole");
    let whole = [("PARTITIONS", "1"), ("REPORT_WAITING_AFTER", "1")];
    let mut whole = start_consumer_with(
        &pg,
        &nats,
        &[&whole[..], &[("CONSUMER_DATABASE_URL", &whole_db)]].concat(),
    );
    let said = format!("transaction {} has 2 of 3 events after 1s: still waiting", commit_of(1));
    crate::support::eventually(Duration::from_secs(20), &said, || async {
        whole.log().contains(&said).then_some(())
    })
    .await;
    assert!(whole.is_running(), "{}", whole.log());

    consumer.kill9();
    let consumer = start_consumer_with(&pg, &nats, &[("PARTITION", "0")]);
    pg.psql(&row(6, "NULL", "NULL"));
    wait_applied(&pg, &consumer, 5, "row 6, after the restart").await;
    let count = pg.psql_db("consumer", "SELECT count(*) FROM consumer_events");
    assert_eq!(count, "5", "nothing applied twice: {}", consumer.log());
    assert!(app.is_running(), "{}", app.log());
}
