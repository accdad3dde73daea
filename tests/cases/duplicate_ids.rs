//! A row that repeats an earlier row's id inside JetStream's duplicate window is a collision,
//! not a replay: the stored message with that id came from another position. It becomes a
//! dead letter in its place, named by position, and every other row arrives once, in commit
//! order. Each costs one more attempt (the rows behind it were chained to its id), never a
//! loop. Before, the repeats were dropped as duplicates and the slot confirmed past them.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, metric, numbered_rows, wait_until_streaming};

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
    assert_eq!(metric(port, "pgoutbox_dead_letters_total "), Some(3.0));
    assert_eq!(metric(port, "pgoutbox_duplicates_total "), Some(0.0));
    let attempts = app.log().matches(" streaming ").count();
    assert!(attempts <= 4, "{attempts} attempts for 3 repeated ids:\n{}", app.log());
}

/// The reviewer's case: `id bigserial`, 10 rows, `TRUNCATE outbox RESTART IDENTITY`, 10 new
/// rows with ids 1-10 again. Before, the stream held 10 of 20 events and the metrics said 20.
#[tokio::test(flavor = "multi_thread")]
async fn ids_reused_after_a_truncate_become_dead_letters_not_lost_events() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(
        "CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_type text, aggregate_id text, \
             event_type text, payload jsonb, headers jsonb, created_at timestamptz DEFAULT now())",
    );
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 10, 5));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "the first 10 rows stored", || async {
        (count(&js, "OUTBOX").await == 10).then_some(())
    })
    .await;
    pg.psql("TRUNCATE outbox RESTART IDENTITY");
    pg.psql(&numbered_rows(10, 20, 5));
    eventually(Duration::from_secs(60), "20 messages stored", || async {
        (count(&js, "OUTBOX").await >= 20).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(stored.len(), 20, "{}", app.log());
    for (n, message) in stored.iter().enumerate().skip(10) {
        assert_eq!(message.subject, "outbox.dead_letter", "row {n}:\n{}", app.log());
        assert_eq!(message.json()["row"]["aggregate_id"], n.to_string(), "in commit order");
    }
}
