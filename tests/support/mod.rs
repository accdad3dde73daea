//! Shared helpers for the integration tests: throwaway servers, the pgoutbox binary, and
//! readers that check what reached JetStream. Every test file includes it with `mod support;`
//! and uses a subset, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod nats;
pub mod pgoutbox;
pub mod postgres;
pub mod stream;

use std::future::Future;
use std::net::TcpListener;
use std::time::{Duration, Instant};

pub use nats::Nats;
pub use postgres::Postgres;

/// Polls `check` every 50 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// Waits until `app` holds the slot and streams (the slot is active).
pub async fn wait_until_streaming(pg: &Postgres, app: &pgoutbox::Pgoutbox) {
    wait_until_slot_active(pg, "pgoutbox", app).await;
}

pub async fn wait_until_slot_active(pg: &Postgres, slot: &str, app: &pgoutbox::Pgoutbox) {
    let query = format!("SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'");
    let deadline = Instant::now() + Duration::from_secs(30);
    while pg.try_psql(&query).as_deref() != Ok("t") {
        assert!(
            Instant::now() < deadline,
            "pgoutbox never started streaming; log:\n{}",
            app.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SQL inserting rows `from..to` in transactions of `per_tx` rows, each with payload
/// `{"n": n}`, so that `n` is the commit order (see `stream::audit`).
pub fn numbered_rows(from: usize, to: usize, per_tx: usize) -> String {
    let mut sql = String::new();
    let mut start = from;
    while start < to {
        let end = (start + per_tx).min(to) - 1;
        sql.push_str(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', n::text, 'created', jsonb_build_object('n', n) \
             FROM generate_series({start}, {end}) AS n;\n"
        ));
        start = end + 1;
    }
    sql
}
