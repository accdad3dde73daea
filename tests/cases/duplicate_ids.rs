//! A row that repeats an earlier row's id inside JetStream's duplicate window is a collision,
//! not a replay: the stored message with that id came from another position. It becomes a
//! dead letter in its place, named by position, and every other row arrives once, in commit
//! order. Each costs one more attempt (the rows behind it were chained to its id), never a
//! loop. Before, the repeats were dropped as duplicates and the slot confirmed past them.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{Stored, assert_rows_and_letters, count, jetstream, read_all};
use crate::support::{
    BIGSERIAL_OUTBOX, Lcg, Nats, Postgres, eventually, metric, numbered_rows, wait_until_streaming,
};

#[tokio::test(flavor = "multi_thread")]
async fn repeated_ids_in_a_big_transaction_become_dead_letters_in_place() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(
        "CREATE TABLE outbox (id text PRIMARY KEY, aggregate_type text, aggregate_id text, \
             event_type text, payload jsonb, headers jsonb, created_at timestamptz DEFAULT now())",
    );
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    // One transaction of 5,000 rows; rows 1000, 2000 and 3000 reuse the ids of rows 0, 1, 2
    // (the table's key is made unique by a suffix JetStream never sees: the id column is
    // the key, so the repeats get ids that differ only in the table, as after a restore).
    pg.psql("ALTER TABLE outbox DROP CONSTRAINT outbox_pkey");
    pg.psql(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         SELECT CASE WHEN n IN (1000, 2000, 3000) THEN 'row-' || (n / 1000 - 1) ELSE 'row-' || n END, \
                'order', n::text, 'created', jsonb_build_object('n', n) \
         FROM generate_series(0, 4999) AS n",
    );
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), "5,000 messages stored", || async {
        (count(&js, "OUTBOX").await >= 5_000).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(stored.len(), 5_000, "rows or letters stored twice");
    for (n, message) in stored.iter().enumerate() {
        if [1000, 2000, 3000].contains(&n) {
            assert_eq!(message.subject, "outbox.dead_letter", "row {n}");
            let id = message.header("Nats-Msg-Id").unwrap_or_default();
            assert!(id.starts_with("dead-letter:") && id.contains('/'), "named by position: {id}");
            let reason = message.header("Pgoutbox-Dead-Letter-Reason").unwrap_or_default();
            assert!(reason.contains("id is taken"), "{reason}");
            assert_eq!(message.json()["row"]["aggregate_id"], n.to_string());
        } else {
            assert_eq!(message.json()["n"], n, "rows lost, duplicated or out of order");
        }
    }
    let port = app.http_port();
    assert_eq!(metric(port, "pgoutbox_dead_letters_total{table=\"public.outbox\"} "), Some(3.0));
    assert_eq!(metric(port, "pgoutbox_duplicates_total{table=\"public.outbox\"} "), Some(0.0));
    let attempts = app.log().matches(" streaming ").count();
    assert!(attempts <= 4, "{attempts} attempts for 3 repeated ids:\n{}", app.log());
}

/// A `bigserial` outbox streamed by pgoutbox: `first` rows stored, the table truncated with
/// its sequence restarted, then `then` (SQL). Returns every message once the stream holds
/// `total`, and pgoutbox's log.
async fn truncated_and_refilled(first: usize, then: &str, total: usize) -> (Vec<Stored>, String) {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(BIGSERIAL_OUTBOX);
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, first, first));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "the first rows stored", || async {
        (count(&js, "OUTBOX").await == first as u64).then_some(())
    })
    .await;
    pg.psql("TRUNCATE outbox RESTART IDENTITY");
    pg.psql(then);
    eventually(Duration::from_secs(60), "every event stored", || async {
        (count(&js, "OUTBOX").await >= total as u64).then_some(())
    })
    .await;
    let log = app.log();
    assert_eq!(
        metric(app.http_port(), "pgoutbox_dead_letters_total{table=\"public.outbox\"} "),
        Some(10.0),
        "{log}"
    );
    (read_all(&js, "OUTBOX").await, log)
}

/// The reviewer's case: `id bigserial`, 10 rows, `TRUNCATE outbox RESTART IDENTITY`, 10 new
/// rows with ids 1-10 again. Before, the stream held 10 of 20 events and the metrics said 20.
#[tokio::test(flavor = "multi_thread")]
async fn ids_reused_after_a_truncate_become_dead_letters_not_lost_events() {
    let (stored, log) = truncated_and_refilled(10, &numbered_rows(10, 20, 5), 20).await;
    assert_eq!(stored.len(), 20, "{log}");
    assert_rows_and_letters(&stored, 10, |_| true, &log);
}

/// Issue 28, F1: more rows after the truncate than before it. Row 11 was chained to the id
/// `10`, which the old tail also has, so it was stored behind the ten refused duplicates
/// and the next attempt skipped through row 20: the stream held 20 of 30 events.
#[tokio::test(flavor = "multi_thread")]
async fn a_reused_id_at_the_tail_lets_no_later_row_pass_it() {
    let then = numbered_rows(10, 30, 20) + &numbered_rows(30, 31, 1);
    let (stored, log) = truncated_and_refilled(10, &then, 31).await;
    assert_eq!(stored.len(), 31, "events lost or doubled:\n{log}");
    assert_rows_and_letters(&stored, 10, |n| n < 20, &log);
}

/// F1 with text ids: `a` stored, then one transaction deletes `a` and inserts `a` and `b`.
/// The new `a` is a dead letter in its place and `b` is stored behind it.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_and_reinserted_id_becomes_a_dead_letter_before_the_next_row() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(
        "CREATE TABLE outbox (id text PRIMARY KEY, aggregate_type text, aggregate_id text, \
             event_type text, payload jsonb, headers jsonb, created_at timestamptz DEFAULT now())",
    );
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let insert = |id: &str, n: u32| {
        format!(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('{id}', 'order', '{n}', 'created', '{{\"n\": {n}}}');"
        )
    };
    pg.psql(&insert("a", 0));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "a stored", || async {
        (count(&js, "OUTBOX").await == 1).then_some(())
    })
    .await;
    pg.psql(&format!(
        "BEGIN; DELETE FROM outbox WHERE id = 'a'; {} {} COMMIT;",
        insert("a", 1),
        insert("b", 2)
    ));
    eventually(Duration::from_secs(30), "3 messages stored", || async {
        (count(&js, "OUTBOX").await >= 3).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    let log = app.log();
    assert_eq!(stored.len(), 3, "{log}");
    assert_eq!(stored[1].subject, "outbox.dead_letter", "the new a:\n{log}");
    assert_eq!(stored[1].json()["row"]["aggregate_id"], "1", "{log}");
    assert_eq!(stored[2].subject, "outbox.order.created", "{log}");
    assert_eq!(stored[2].json()["n"], 2, "{log}");
}

/// F1 as a class: reused and fresh ids mixed at random in transactions of random sizes.
/// Every row is in the stream once, in commit order: a fresh id as its message, a reused
/// one as its dead letter. Before, dozens were lost per run, fresh ones among them.
#[tokio::test(flavor = "multi_thread")]
async fn reused_and_fresh_ids_mixed_at_random_each_arrive_once_in_order() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(
        "CREATE TABLE outbox (id text, aggregate_type text, aggregate_id text, \
             event_type text, payload jsonb, headers jsonb, created_at timestamptz DEFAULT now())",
    );
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    let row = |id: &str, n: usize| {
        format!(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('{id}', 'order', '{n}', 'created', '{{\"n\": {n}}}');"
        )
    };
    const OLD: usize = 30;
    pg.psql(&(0..OLD).map(|n| row(&format!("k{n}"), n)).collect::<String>());
    eventually(Duration::from_secs(20), "the first rows stored", || async {
        (count(&js, "OUTBOX").await == OLD as u64).then_some(())
    })
    .await;
    let mut random = Lcg(28);
    let mut sql = String::new();
    let mut reused = Vec::new();
    // Ids in the order they were used: a reuse picks one of the last five, so that it is
    // often the id of the stream's last message, which is where a chain by id is ambiguous.
    let mut used: Vec<String> = (0..OLD).map(|n| format!("k{n}")).collect();
    let mut n = OLD;
    while n < OLD + 200 {
        sql.push_str("BEGIN;");
        for _ in 0..random.between(1, 12) {
            let reuse = random.between(0, 3) == 0;
            reused.push(reuse);
            let id = match reuse {
                true => used[used.len() - random.between(1, 6) as usize].clone(),
                false => format!("f{n}"),
            };
            used.push(id.clone());
            sql.push_str(&row(&id, n));
            n += 1;
        }
        sql.push_str("COMMIT;");
    }
    pg.psql(&sql);
    eventually(Duration::from_secs(90), "every row or its dead letter stored", || async {
        (count(&js, "OUTBOX").await >= n as u64).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    let log = app.log();
    assert_eq!(stored.len(), n, "events lost or doubled:\n{log}");
    assert_rows_and_letters(&stored, OLD, |n| reused[n - OLD], &log);
}
