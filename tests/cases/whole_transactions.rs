//! Each message says whether it is the last of its transaction, and the last says how many
//! messages the transaction has (issue 48): a consumer knows it has a whole transaction
//! without waiting for the next one. 1,000 transactions of 1-50 rows, some with a row of a
//! table pgoutbox does not stream and an emitted event among them, while pgoutbox is killed
//! with -9 and started again: every transaction is reassembled exactly from the stream.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{Stored, assert_once_in_order, count, jetstream, read_all};
use crate::support::{Lcg, Nats, Postgres, eventually, wait_until_streaming};

/// The transactions: `n` numbers the events in commit order; each transaction is the
/// events it holds. Every fifth also inserts into a table outside the publication, every
/// seventh emits one of its events with `pg_logical_emit_message`.
fn transactions(random: &mut Lcg, count: usize) -> (String, Vec<Vec<u64>>) {
    let (mut sql, mut made, mut n) = (String::new(), Vec::new(), 0u64);
    for t in 0..count {
        let rows = random.between(1, 51);
        let events: Vec<u64> = (n..n + rows).collect();
        sql.push_str("BEGIN;\n");
        for &e in &events {
            if t % 7 == 3 && e == events[events.len() / 2] {
                sql.push_str(&format!(
                    "SELECT pg_logical_emit_message(true, 'outbox', '{{\"id\":\"e{e}\",\
                     \"aggregate_type\":\"order\",\"aggregate_id\":\"{e}\",\
                     \"event_type\":\"created\",\"payload\":{{\"n\":{e}}}}}');\n"
                ));
            } else {
                sql.push_str(&format!(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                     VALUES ('order', '{e}', 'created', '{{\"n\": {e}}}');\n"
                ));
            }
            if t % 5 == 0 && e == events[0] {
                sql.push_str("INSERT INTO elsewhere VALUES (1);\n");
            }
        }
        sql.push_str("COMMIT;\n");
        n += rows;
        made.push(events);
    }
    (sql, made)
}

/// The stream's messages grouped by transaction (the commit LSN of `Pgoutbox-Position`),
/// in stream order.
fn by_transaction(stored: &[Stored]) -> BTreeMap<String, Vec<&Stored>> {
    let mut groups: BTreeMap<String, Vec<&Stored>> = BTreeMap::new();
    for message in stored {
        let position = message.header("Pgoutbox-Position").unwrap_or_default();
        let commit = position.split(':').next().unwrap_or_default().to_owned();
        groups.entry(commit).or_default().push(message);
    }
    groups
}

#[tokio::test(flavor = "multi_thread")]
async fn every_transaction_is_reassembled_whole_through_kill_9() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE TABLE elsewhere (x int)");
    let first = Pgoutbox::run(&pg, &nats, &["--message-prefix", "outbox"]);
    wait_until_streaming(&pg, &first).await;
    drop(first);

    let mut random = Lcg::from_time();
    let (sql, made) = transactions(&mut random, 1_000);
    let total: usize = made.iter().map(Vec::len).sum();
    let writer = pg.psql_in_background(sql);
    let js = jetstream(&nats.url()).await;
    let mut app = Pgoutbox::run(&pg, &nats, &["--message-prefix", "outbox"]);
    let part = (total / 3) as u64;
    eventually(Duration::from_secs(60), "a third of the events stored", || async {
        (count(&js, "OUTBOX").await >= part).then_some(())
    })
    .await;
    app.kill9();
    let app = Pgoutbox::run(&pg, &nats, &["--message-prefix", "outbox"]);
    writer.join().expect("writer").expect("transactions");
    eventually(Duration::from_secs(90), "every event stored", || async {
        (count(&js, "OUTBOX").await >= total as u64).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_once_in_order(&stored, total, &app.log());

    let groups = by_transaction(&stored);
    assert_eq!(groups.len(), made.len(), "transactions in the stream");
    let mut reassembled: Vec<Vec<u64>> = Vec::new();
    for (commit, messages) in &groups {
        let lasts: Vec<&str> =
            messages.iter().map(|m| m.header("Pgoutbox-Transaction-Last").unwrap_or("")).collect();
        let (last, before) = lasts.split_last().expect("a transaction has a message");
        assert_eq!(*last, "true", "transaction {commit}: {lasts:?}");
        assert!(before.iter().all(|l| *l == "false"), "transaction {commit}: {lasts:?}");
        let rows = messages.last().and_then(|m| m.header("Pgoutbox-Transaction-Rows"));
        assert_eq!(rows, Some(messages.len().to_string().as_str()), "transaction {commit}");
        let counted = messages.iter().filter(|m| m.header("Pgoutbox-Transaction-Rows").is_some());
        assert_eq!(counted.count(), 1, "transaction {commit}: only the last counts");
        reassembled
            .push(messages.iter().map(|m| m.json()["n"].as_u64().unwrap_or(u64::MAX)).collect());
    }
    reassembled.sort();
    assert_eq!(reassembled, made, "each transaction's events, exactly");
}
