//! Schema changes between transactions: an added column, a dropped column and a changed
//! type. pgoutput re-sends the Relation, pgoutbox rebuilds its mapping, and the rows before
//! and after map correctly.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream, read_all};
use crate::support::{
    Nats, Postgres, eventually, numbered_rows, stop_and_wait_released, wait_until_streaming,
};

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

/// A column added, and the subject template changed to use it, while rows from before the
/// column still wait in the slot. Where Postgres decodes them without the column (14, 15),
/// each becomes a dead letter saying so, in its place, and the rows after it flow. Before,
/// the older Relation was an error on every start, and pgoutbox crash-looped holding WAL.
#[tokio::test(flavor = "multi_thread")]
async fn rows_from_before_a_column_the_template_now_needs_become_dead_letters() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 5, 5));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "the first rows stored", || async {
        (count(&js, "OUTBOX").await == 5).then_some(())
    })
    .await;
    stop_and_wait_released(&pg, app).await;

    pg.psql(&numbered_rows(5, 10, 5));
    pg.psql("ALTER TABLE outbox ADD COLUMN tenant text NOT NULL DEFAULT 'acme'");
    pg.psql(&numbered_rows(10, 15, 5));
    let template = ["--subject-template", "outbox.{tenant}.{event_type}"];
    let app = Pgoutbox::run(&pg, &nats, &template);
    eventually(Duration::from_secs(20), "every row or its dead letter stored", || async {
        (count(&js, "OUTBOX").await >= 15).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    assert_eq!(messages.len(), 15, "{}", app.log());
    for (n, message) in messages.iter().enumerate().skip(5) {
        // PostgreSQL 14 and 15 decode the older rows with the older Relation, without the
        // column: dead letters. 16 and later send them with the added column's default.
        if message.subject == "outbox.dead_letter" {
            assert!(n < 10, "row {n} was written after the column was added");
            let reason = message.header("Pgoutbox-Dead-Letter-Reason").unwrap_or_default();
            assert!(reason.contains("before column \"tenant\""), "{reason}");
            assert_eq!(message.json()["row"]["aggregate_id"], n.to_string(), "in its place");
        } else {
            assert_eq!(message.subject, "outbox.acme.created", "row {n}");
            assert_eq!(message.json()["n"], n, "in its place");
        }
    }
    assert!(app.log().contains("streaming"), "{}", app.log());
}
