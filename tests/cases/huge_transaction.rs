//! One transaction of 1,000,000 rows streams through with pgoutbox's resident memory well
//! under 100 MB: rows are published as they arrive, never held per transaction.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream};
use crate::support::{
    Nats, Postgres, eventually, numbered_rows, peak_rss_bytes, wait_until_streaming,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_million_row_transaction_streams_in_bounded_memory() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    let total = 1_000_000u64;
    pg.psql(&numbered_rows(0, total as usize, total as usize));
    let js = jetstream(&nats.url()).await;
    // A debug build on two shared cores; the test is about memory, not speed.
    eventually(Duration::from_secs(600), "a million rows stored", || async {
        (count(&js, "OUTBOX").await >= total).then_some(())
    })
    .await;
    let peak = peak_rss_bytes(app.pid());
    eprintln!("peak RSS: {} MB", peak / 1_000_000);
    assert!(peak < 100_000_000, "peak RSS {peak} bytes");
    assert_eq!(count(&js, "OUTBOX").await, total, "duplicates stored");
    // Order and exactly-once on a million rows: check the ends and a sample by sequence.
    let stream = js.get_stream("OUTBOX").await.expect("stream");
    for seq in [1, 2, 500_000, 999_999, 1_000_000] {
        let message = stream.get_raw_message(seq).await.expect("message");
        let body: serde_json::Value = serde_json::from_slice(&message.payload).expect("JSON");
        assert_eq!(body["n"], seq - 1, "message {seq} out of order");
    }
}

/// Rows of ~900 KB each, at full speed: the bytes awaiting acks are bounded by
/// `--max-in-flight-bytes`, so resident memory stays within that budget plus 32 MB.
#[tokio::test(flavor = "multi_thread")]
async fn large_rows_stream_within_the_in_flight_byte_budget() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let budget = 16 << 20;
    let app = Pgoutbox::run(&pg, &nats, &["--max-in-flight-bytes", "16MiB"]);
    wait_until_streaming(&pg, &app).await;

    let rows = 300u64;
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', n::text, 'created', jsonb_build_object('n', n, 'pad', repeat(md5(n::text), 28000)) \
         FROM generate_series(0, {}) AS n",
        rows - 1
    ));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(120), "300 large rows stored", || async {
        (count(&js, "OUTBOX").await >= rows).then_some(())
    })
    .await;
    let peak = peak_rss_bytes(app.pid());
    eprintln!("peak RSS with 900 KB rows: {} MB (budget 16 MiB + 32 MB)", peak / 1_000_000);
    assert!(peak < budget + 32_000_000, "peak RSS {peak} bytes");
    assert_eq!(count(&js, "OUTBOX").await, rows, "duplicates stored");
}
