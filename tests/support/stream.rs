//! Reads a JetStream stream back and checks exactly-once delivery and order.

use std::collections::HashSet;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures_util::StreamExt;

/// One stored message.
#[derive(Debug, Clone)]
pub struct Stored {
    pub subject: String,
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Stored {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).expect("payload is JSON")
    }
}

pub async fn jetstream(nats_url: &str) -> jetstream::Context {
    let client = async_nats::connect(nats_url).await.expect("test client connects to NATS");
    jetstream::new(client)
}

/// How many messages the stream holds (0 if it does not exist yet).
pub async fn count(js: &jetstream::Context, stream: &str) -> u64 {
    match js.get_stream(stream).await {
        Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Every message of the stream, in stream order.
pub async fn read_all(js: &jetstream::Context, stream: &str) -> Vec<Stored> {
    let stream = js.get_stream(stream).await.expect("stream exists");
    let total = stream.get_info().await.expect("stream info").state.messages as usize;
    let consumer =
        stream.create_consumer(OrderedConfig::default()).await.expect("ordered consumer");
    let mut messages = consumer.messages().await.expect("consume");
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let next = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("stream read stalled")
            .expect("consumer ended")
            .expect("message");
        let headers = next
            .headers
            .as_ref()
            .map(|h| {
                h.iter()
                    .flat_map(|(k, vs)| vs.iter().map(move |v| (k.to_string(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Stored {
            subject: next.subject.to_string(),
            headers,
            payload: next.payload.to_vec(),
        });
    }
    out
}

/// What a fault test asserts on: each committed row exactly once, in commit order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Audit {
    pub stored: usize,
    pub duplicates: usize,
    pub order_violations: usize,
    pub lost: usize,
}

/// Audits messages whose payload carries `"n"`, the row's place in commit order (0..expected).
pub fn audit(messages: &[Stored], expected: usize) -> Audit {
    let mut seen = HashSet::new();
    let mut audit = Audit { stored: messages.len(), ..Audit::default() };
    let mut last = None;
    for m in messages {
        let n = m.json()["n"].as_u64().expect("payload has n") as usize;
        if !seen.insert(n) {
            audit.duplicates += 1;
            continue;
        }
        if last.is_some_and(|l| n < l) {
            audit.order_violations += 1;
        }
        last = Some(n);
    }
    audit.lost = (0..expected).filter(|n| !seen.contains(n)).count();
    audit
}
