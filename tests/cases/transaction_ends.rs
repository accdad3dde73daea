//! `--transaction-subject` (issue 57): each committed transaction ends with one message of
//! its own that counts what a consumer of the event subjects sees in its place, by
//! partition, and what went elsewhere (dead letters, scheduled rows). The end comes after
//! the transaction's last message in the stream, once, through kill -9, so that a consumer
//! of one partition knows its part is whole from its own filter and the end alone.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{Stored, count, jetstream, read_all};
use crate::support::{Lcg, Nats, Postgres, eventually, wait_until_streaming};

const ENDS: &str = "outbox.transactions";

/// What one generated transaction should end with: its rows in place and its dead letters
/// (a NULL aggregate id has no partition).
#[derive(Debug, PartialEq, Eq)]
struct Made {
    events: u64,
    dead_letters: u64,
}

/// `count` transactions of 1-12 rows over 40 aggregates; every ninth row has a NULL
/// aggregate id, every fifth transaction also writes a table pgoutbox does not stream,
/// and every twentieth writes only that table (no end: nothing of ours).
fn transactions(random: &mut Lcg, count: usize) -> (String, Vec<Made>) {
    let (mut sql, mut made, mut n) = (String::new(), Vec::new(), 0u64);
    for t in 0..count {
        sql.push_str("BEGIN;\n");
        if t % 20 == 7 {
            sql.push_str("INSERT INTO elsewhere VALUES (1);\nCOMMIT;\n");
            continue;
        }
        let mut this = Made { events: 0, dead_letters: 0 };
        for _ in 0..random.between(1, 13) {
            n += 1;
            let aggregate = match n % 9 {
                0 => {
                    this.dead_letters += 1;
                    "NULL".to_owned()
                }
                _ => {
                    this.events += 1;
                    format!("'a{}'", random.between(0, 40))
                }
            };
            sql.push_str(&format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('order', {aggregate}, 'placed', '{{\"n\": {n}}}');\n"
            ));
        }
        if t % 5 == 0 {
            sql.push_str("INSERT INTO elsewhere VALUES (1);\n");
        }
        sql.push_str("COMMIT;\n");
        made.push(this);
    }
    (sql, made)
}

fn commit_of(message: &Stored) -> String {
    let position = message.header("Pgoutbox-Position").unwrap_or_default();
    position.split(':').next().unwrap_or_default().to_owned()
}

/// Walks the stream as a consumer of every subject would: each end must come after every
/// message of its transaction, and count on each partition what that partition's filter
/// holds of it. Returns each end's body, in stream order.
fn check_ends(stored: &[Stored]) -> Vec<serde_json::Value> {
    let mut seen: BTreeMap<String, (BTreeMap<String, u64>, u64)> = BTreeMap::new();
    let (mut ended, mut ends) = (HashSet::new(), Vec::new());
    for message in stored {
        let commit = commit_of(message);
        assert!(!ended.contains(&commit), "a message of {commit} after its end: {message:?}");
        if message.subject == ENDS {
            let body = message.json();
            assert_eq!(message.header("Pgoutbox-Transaction-End"), Some(commit.as_str()));
            assert_eq!(body["commit_lsn"], commit.as_str());
            let id = message.header("Nats-Msg-Id").unwrap_or_default();
            assert!(id.starts_with("transaction:") && id.ends_with(&commit), "{id}");
            let (partitions, letters) = seen.remove(&commit).unwrap_or_default();
            let counted: BTreeMap<String, u64> = body["partitions"]
                .as_object()
                .expect("partitions")
                .iter()
                .map(|(p, n)| (p.clone(), n.as_u64().unwrap_or(u64::MAX)))
                .collect();
            assert_eq!(counted, partitions, "{commit}: each partition's part");
            assert_eq!(body["dead_letters"], letters, "{commit}");
            assert_eq!(body["events"], partitions.values().sum::<u64>(), "{commit}");
            ended.insert(commit);
            ends.push(body);
            continue;
        }
        let (partitions, letters) = seen.entry(commit).or_default();
        match message.subject.split('.').collect::<Vec<_>>()[..] {
            ["orders", partition, "placed"] => {
                *partitions.entry(partition.to_owned()).or_default() += 1
            }
            ["outbox", "dead_letter"] => *letters += 1,
            _ => panic!("a message on an unexpected subject: {message:?}"),
        }
    }
    assert!(seen.is_empty(), "transactions without an end: {:?}", seen.keys());
    ends
}

#[tokio::test(flavor = "multi_thread")]
async fn each_transaction_ends_once_counting_every_partition_s_part_and_its_dead_letters_through_kill_9()
 {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ALTER COLUMN aggregate_id DROP NOT NULL");
    pg.psql("CREATE TABLE elsewhere (x int)");
    let args = [
        "--subject-template",
        "orders.{$partition}.{event_type}",
        "--partitions",
        "4",
        "--transaction-subject",
        ENDS,
    ];
    let first = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &first).await;
    drop(first);

    let (sql, made) = transactions(&mut Lcg::from_time(), 400);
    let rows: u64 = made.iter().map(|m| m.events + m.dead_letters).sum();
    let total = rows + made.len() as u64;
    let writer = pg.psql_in_background(sql);
    let js = jetstream(&nats.url()).await;
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    eventually(Duration::from_secs(60), "a third of the messages stored", || async {
        (count(&js, "OUTBOX").await >= total / 3).then_some(())
    })
    .await;
    app.kill9();
    let app = Pgoutbox::run(&pg, &nats, &args);
    writer.join().expect("writer").expect("transactions");
    eventually(Duration::from_secs(90), "every row and every end stored", || async {
        (count(&js, "OUTBOX").await >= total).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(stored.len() as u64, total, "each once\n{}", app.log());
    let ends = check_ends(&stored);
    let ended: Vec<Made> = ends
        .iter()
        .map(|end| Made {
            events: end["events"].as_u64().unwrap_or(u64::MAX),
            dead_letters: end["dead_letters"].as_u64().unwrap_or(u64::MAX),
        })
        .collect();
    assert_eq!(ended, made, "one end per transaction with rows, in commit order");
    assert!(ends.iter().all(|end| end["scheduled"] == 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scheduled_row_is_counted_apart_and_its_transaction_ends_without_waiting_for_it() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN deliver_at timestamptz;");
    let args = ["--schedule-column=deliver_at", "--transaction-subject", ENDS];
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    if app.refused_before(&nats, (2, 12), "--schedule-column needs nats-server 2.12 or later") {
        return;
    }
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    // Its last row is due in 4 s: the end is stored before that, counting it apart.
    pg.psql(
        "BEGIN;
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
           VALUES ('order', '1', 'created', '{\"n\": 1}');
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, deliver_at)
           VALUES ('order', '2', 'created', '{\"n\": 2}', now() + interval '4 seconds');
         COMMIT;",
    );
    let on = |stored: &[Stored], subject: &str| -> Vec<Stored> {
        stored.iter().filter(|m| m.subject == subject).cloned().collect()
    };
    let ends = eventually(
        Duration::from_secs(3),
        "the transaction's end, before the due time",
        || async {
            let ends = on(&read_all(&js, "OUTBOX").await, ENDS);
            (!ends.is_empty()).then_some(ends)
        },
    )
    .await;
    let end = ends[0].json();
    assert_eq!((end["events"].as_u64(), end["scheduled"].as_u64()), (Some(1), Some(1)), "{end}");
    let stored = eventually(Duration::from_secs(30), "the scheduled row delivered", || async {
        let stored = read_all(&js, "OUTBOX").await;
        (on(&stored, "outbox.order.created").len() == 2).then_some(stored)
    })
    .await;
    let events = on(&stored, "outbox.order.created");
    let delivery = &events[1];
    let end_at = stored.iter().position(|m| m.subject == ENDS).expect("the end");
    let delivered_at = stored.iter().position(|m| m.header("Nats-Scheduler").is_some());
    assert!(delivered_at.is_some_and(|d| d > end_at), "the delivery, after the end: {stored:?}");
    // An event of its own: no Nats-Msg-Id from the server, the row's id in Pgoutbox-Event-Id.
    let held = stored
        .iter()
        .find(|m| m.subject.starts_with("schedules."))
        .map(|m| m.header("Nats-Msg-Id"));
    assert!(delivery.header("Pgoutbox-Event-Id").is_some());
    if let Some(held_id) = held {
        assert_eq!(delivery.header("Pgoutbox-Event-Id"), held_id, "{:?}", delivery.headers);
    }
    assert_eq!(on(&stored, ENDS).len(), 1, "one end, however late its scheduled row");
    drop(app);
}

/// A row JetStream refuses for itself (over the stream's `max_msg_size`) goes to the
/// dead-letter subject in its place; pgoutbox killed with -9 later in that transaction, the
/// restart skips what the stream holds of it, the letter included, and its end still counts
/// the row as a dead letter (before: counted again from its mapping, an event: the consumer
/// of its partition waited for an event that never comes).
#[tokio::test(flavor = "multi_thread")]
async fn a_row_refused_before_a_kill_9_in_its_transaction_is_counted_a_dead_letter_by_the_end() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "OUTBOX".into(),
        subjects: vec!["outbox.*.*".into(), "outbox.dead_letter".into(), ENDS.into()],
        max_message_size: 2048,
        ..Default::default()
    })
    .await
    .expect("create the stream with max_msg_size");
    let args = ["--transaction-subject", ENDS];
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    const ROWS: u64 = 100_000;
    let writer = pg.psql_in_background(format!(
        "BEGIN;
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
           VALUES ('order', '0', 'placed', jsonb_build_object('pad', repeat('x', 4000)));
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
           SELECT 'order', n::text, 'placed', jsonb_build_object('n', n)
           FROM generate_series(1, {ROWS}) n;
         COMMIT;"
    ));
    writer.join().expect("writer").expect("the transaction commits");
    eventually(Duration::from_secs(60), "the letter and rows behind it stored", || async {
        (count(&js, "OUTBOX").await >= 2_000).then_some(())
    })
    .await;
    app.kill9();
    let before = read_all(&js, "OUTBOX").await;
    assert!(before.iter().all(|m| m.subject != ENDS), "killed before the end");
    assert_eq!(before[0].subject, "outbox.dead_letter", "the refused row's letter first");

    let app = Pgoutbox::run(&pg, &nats, &args);
    let what = format!("the transaction's end\n{}", app.log());
    eventually(Duration::from_secs(120), &what, || async {
        (count(&js, "OUTBOX").await >= ROWS + 2).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(stored.len() as u64, ROWS + 2, "each row once, and the end\n{}", app.log());
    let ends: Vec<&Stored> = stored.iter().filter(|m| m.subject == ENDS).collect();
    assert_eq!(ends.len(), 1, "one end");
    let end = ends[0].json();
    let counted = (end["events"].as_u64(), end["dead_letters"].as_u64());
    assert_eq!(counted, (Some(ROWS), Some(1)), "{end}");
}
