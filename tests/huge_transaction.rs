//! One transaction of 1,000,000 rows streams through with pgoutbox's resident memory well
//! under 100 MB: rows are published as they arrive, never held per transaction.

mod support;

use std::time::Duration;

use support::pgoutbox::Pgoutbox;
use support::stream::{count, jetstream};
use support::{Nats, Postgres, eventually, numbered_rows, peak_rss_bytes, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn a_million_row_transaction_streams_in_bounded_memory() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    let total = 1_000_000u64;
    pg.psql(&numbered_rows(0, total as usize, total as usize));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(300), "a million rows stored", || async {
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
