//! Rows that repeat an earlier row's id inside JetStream's duplicate window are not stored
//! again, and they cost nothing else: the attempt goes on (no reconnection, no second
//! decoding of the transaction), and every other row arrives once, in commit order.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn duplicate_ids_in_a_big_transaction_do_not_end_the_attempt() {
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
    eventually(Duration::from_secs(30), "4,997 rows stored", || async {
        (count(&js, "OUTBOX").await >= 4_997).then_some(())
    })
    .await;
    // Rows behind the duplicates were all acknowledged before this point, so nothing
    // that could still end the attempt is in flight.
    let stored = read_all(&js, "OUTBOX").await;
    let numbers: Vec<u64> = stored.iter().filter_map(|m| m.json()["n"].as_u64()).collect();
    let expected: Vec<u64> = (0..5_000).filter(|n| ![1000, 2000, 3000].contains(n)).collect();
    assert_eq!(numbers, expected, "rows lost, duplicated or out of order");
    let attempts = app.log().matches(" streaming ").count();
    assert_eq!(attempts, 1, "duplicates ended the attempt:\n{}", app.log());
}
