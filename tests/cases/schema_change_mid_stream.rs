//! Schema changes between transactions: an added column, a dropped column and a changed
//! type. pgoutput re-sends the Relation, pgoutbox rebuilds its mapping, and the rows before
//! and after map correctly.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn rows_before_and_after_alter_table_map_correctly() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    let row = |n: i32| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ('order', '{n}', 'created', '{{\"n\": {n}}}', '{{\"Step\": \"{n}\"}}');"
        )
    };
    pg.psql(&row(0));
    pg.psql("ALTER TABLE outbox ADD COLUMN tenant text DEFAULT 'acme'");
    pg.psql(&row(1));
    pg.psql("ALTER TABLE outbox DROP COLUMN created_at");
    pg.psql(&row(2));
    pg.psql("ALTER TABLE outbox ALTER COLUMN payload TYPE text");
    pg.psql(&row(3));
    pg.psql("ALTER TABLE outbox DROP COLUMN headers");
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', '4', 'created', '{\"n\": 4}')",
    );

    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "5 messages stored", || async {
        (count(&js, "OUTBOX").await >= 5).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    assert_eq!(messages.len(), 5, "{messages:?}");
    for (n, m) in messages.iter().enumerate() {
        assert_eq!(m.subject, "outbox.order.created");
        assert_eq!(m.json()["n"], n);
        assert_eq!(m.header("Outbox-Aggregate-Id"), Some(n.to_string().as_str()));
        let step = (n < 4).then(|| n.to_string());
        assert_eq!(m.header("Step"), step.as_deref(), "headers of row {n}");
        assert_eq!(m.header("Outbox-Created-At").is_some(), n < 2, "created_at of row {n}");
    }
}
