//! Prints every message of the outbox stream as it is stored, with its headers, so you can
//! see what a consumer gets without a `nats` CLI: `cargo run --example tail`. Used by
//! `scripts/first-look.sh`; handy when trying pgoutbox out. `NATS_URL` and
//! `PGOUTBOX_STREAM` say where to read.

use std::io::Write;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures_util::StreamExt;

#[tokio::main]
async fn main() -> Result<(), async_nats::Error> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let stream = std::env::var("PGOUTBOX_STREAM").unwrap_or_else(|_| "OUTBOX".into());
    let js = jetstream::new(async_nats::connect(&url).await?);
    let consumer = js.get_stream(&stream).await?.create_consumer(OrderedConfig::default()).await?;
    let mut messages = consumer.messages().await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "waiting for messages on stream {stream} at {url} (Ctrl-C to stop)")?;
    while let Some(message) = messages.next().await {
        let message = message?;
        if let Err(err) = print(&mut out, &message) {
            // A reader that went away (`| head`) ends the tail quietly.
            if err.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(err.into());
        }
    }
    Ok(())
}

/// One message: its subject and stream sequence, each header on a line, then the body.
fn print(out: &mut impl Write, message: &jetstream::Message) -> std::io::Result<()> {
    let sequence = message.info().map(|info| info.stream_sequence).unwrap_or_default();
    writeln!(out, "\n{}  (stream sequence {sequence})", message.subject)?;
    if let Some(headers) = &message.headers {
        for (name, values) in headers.iter() {
            for value in values {
                writeln!(out, "  {name}: {value}")?;
            }
        }
    }
    writeln!(out, "  {}", String::from_utf8_lossy(&message.payload))?;
    out.flush()
}
