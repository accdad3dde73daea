//! A seed publishes a transaction's rows in the order the transaction inserted them, which
//! is not their place in the table: a page with room left takes a later, smaller row
//! (issue 45, found by the soak with tenants on nats-server 2.15: rows of one transaction
//! came out of a recovery's seed before rows their transaction had inserted first).

use std::time::Duration;

use super::several_tables::tenant_table;
use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{assert_once_in_order, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, stop_and_wait_released, wait_until_streaming};

/// Room a page has besides its header (8 KiB pages, 24-byte page header).
const PAGE_ROOM: i64 = 8192 - 24;
/// Padding of the transaction's first (larger) and second (smaller) row.
const FIRST_PAD: i64 = 1_500;
const SECOND_PAD: i64 = 200;

/// A row of `table` numbered `n` whose payload holds `pad` bytes of padding.
fn row(table: &str, n: i64, pad: i64) -> String {
    format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) VALUES \
         ('order', '{n}', 'created', jsonb_build_object('n', {n}, 'pad', repeat('x', {pad})));\n"
    )
}

/// Rows 0-3, each transaction in its own session, laid out so that the last transaction's
/// second row lands on an earlier page than its first: page 0 keeps room for the second
/// row only, page 1 for the first row and not the second after it, and the free-space map
/// knows both (`VACUUM`), payloads stored uncompressed. Asserts the layout took.
fn rows_out_of_heap_order(pg: &Postgres, table: &str) {
    let row = |n: i64, pad: i64| row(table, n, pad);
    pg.psql(&format!("ALTER TABLE {table} ALTER payload SET STORAGE PLAIN"));
    // What a row costs beside its padding: measured, then the table emptied.
    pg.psql(&row(-1, 1_000));
    let size = format!("SELECT pg_column_size(o.*) - 1000 FROM {table} o");
    let overhead: i64 = pg.psql(&size).parse().unwrap();
    pg.psql(&format!("TRUNCATE {table}"));
    let used = |pad: i64| (overhead + pad + 7) / 8 * 8 + 4; // aligned tuple and its pointer
    let (first, second) = (used(FIRST_PAD), used(SECOND_PAD));
    let filler = |room_left: i64| PAGE_ROOM - room_left - 4 - overhead - 8;
    pg.psql(&row(0, filler(second + 64)));
    pg.psql(&row(1, filler(first + second - 64)));
    pg.psql(&format!("VACUUM {table}"));
    pg.psql(&format!("BEGIN;\n{}{}COMMIT;", row(2, FIRST_PAD), row(3, SECOND_PAD)));
    let page = |n: i64| -> i64 {
        let sql = format!("SELECT (ctid::text::point)[0] FROM {table} WHERE payload->>'n' = '{n}'");
        pg.psql(&sql).parse().unwrap()
    };
    assert!(page(3) < page(2), "the layout did not put the second row on an earlier page");
}

/// Waits for the stream to hold 4 messages, then asserts they are rows 0-3 once, in order.
async fn assert_rows_in_order(nats: &Nats, app: &Pgoutbox) {
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), "the 4 rows stored", || async {
        (count(&js, "OUTBOX").await >= 4).then_some(())
    })
    .await;
    assert_once_in_order(&read_all(&js, "OUTBOX").await, 4, &app.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backfill_publishes_a_transactions_rows_in_insert_order_not_table_order() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    rows_out_of_heap_order(&pg, "outbox");
    let app = Pgoutbox::run(&pg, &nats, &["--backfill"]);
    wait_until_streaming(&pg, &app).await;
    assert_rows_in_order(&nats, &app).await;
}

/// The same layout in a tenant's table made while pgoutbox was stopped: adopted at start.
#[tokio::test(flavor = "multi_thread")]
async fn an_adoption_hands_a_transactions_rows_over_in_insert_order() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let tenants = ["--table", "tenant_*.outbox", "--subject-template", "tenants.{$schema}.x"];
    pg.psql(&tenant_table("tenant_a"));
    let app = Pgoutbox::run(&pg, &nats, &tenants);
    wait_until_streaming(&pg, &app).await;
    stop_and_wait_released(&pg, app).await;
    pg.psql(&tenant_table("tenant_b"));
    rows_out_of_heap_order(&pg, "tenant_b.outbox");
    let app = Pgoutbox::run(&pg, &nats, &tenants);
    wait_until_streaming(&pg, &app).await;
    assert_rows_in_order(&nats, &app).await;
    assert!(app.log().contains("joined the publication"), "not adopted:\n{}", app.log());
}
