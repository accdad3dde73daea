//! Prints every message of the outbox stream as it is stored: `cargo run --example tail`.
//! Used by `scripts/first-look.sh`; handy when trying pgoutbox out.

// An example, printing what it reads: println! is fine here (clippy.toml forbids it in src/).
#![allow(clippy::disallowed_macros)]

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures_util::StreamExt;

#[tokio::main]
async fn main() -> Result<(), async_nats::Error> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let stream = std::env::var("PGOUTBOX_STREAM").unwrap_or_else(|_| "OUTBOX".into());
    let js = jetstream::new(async_nats::connect(&url).await?);
    let consumer = js.get_stream(&stream).await?.create_consumer(OrderedConfig::default()).await?;
    let mut messages = consumer.messages().await?;
    println!("waiting for messages on stream {stream} at {url} (Ctrl-C to stop)");
    while let Some(message) = messages.next().await {
        let message = message?;
        let id = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.to_string())
            .unwrap_or_default();
        println!("{}  id={}  {}", message.subject, id, String::from_utf8_lossy(&message.payload));
    }
    Ok(())
}
