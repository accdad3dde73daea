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
    /// When JetStream stored it, in nanoseconds since the Unix epoch.
    pub stored_at_nanos: i128,
}

impl Stored {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).expect("payload is JSON")
    }
}

/// Creates the stream pgoutbox writes by default (`OUTBOX`) before pgoutbox does, with a
/// short duplicate window, so that a test need not wait two minutes for ids to expire.
pub async fn create_outbox_stream(js: &jetstream::Context, duplicate_window: Duration) {
    js.create_stream(jetstream::stream::Config {
        name: "OUTBOX".into(),
        subjects: vec!["outbox.*.*".into(), "outbox.dead_letter".into()],
        duplicate_window,
        ..Default::default()
    })
    .await
    .expect("create stream OUTBOX with a short duplicate window");
}

/// The stream pgoutbox writes with `--schedule-column` (nats-server 2.12+), made before it:
/// schedules allowed, held rows on `schedules.OUTBOX.>`, a 1 s duplicate window.
pub async fn create_scheduled_outbox_stream(js: &jetstream::Context) {
    js.create_stream(jetstream::stream::Config {
        name: "OUTBOX".into(),
        subjects: vec![
            "outbox.*.*".into(),
            "outbox.dead_letter".into(),
            "schedules.OUTBOX.>".into(),
        ],
        duplicate_window: Duration::from_secs(1),
        allow_message_schedules: true,
        ..Default::default()
    })
    .await
    .expect("a stream with schedules and a 1 s duplicate window");
}

/// A client of the server (or comma-separated servers) at `nats_url`.
pub async fn jetstream(nats_url: &str) -> jetstream::Context {
    let servers: Vec<async_nats::ServerAddr> =
        nats_url.split(',').map(|url| url.parse().expect("a NATS URL")).collect();
    let client = async_nats::connect(servers).await.expect("test client connects to NATS");
    jetstream::new(client)
}

/// How many messages the stream holds (0 if it does not exist yet).
pub async fn count(js: &jetstream::Context, stream: &str) -> u64 {
    match js.get_stream(stream).await {
        Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    }
}

/// From message `from` on, event `n` is at place `n`, in commit order: as its dead letter
/// (on `outbox.dead_letter`, the row's `aggregate_id` reading `n`) where `is_letter(n)`,
/// else as its message (on `outbox.order.created`, its payload's `n`).
pub fn assert_rows_and_letters(
    stored: &[Stored],
    from: usize,
    is_letter: impl Fn(usize) -> bool,
    log: &str,
) {
    for (n, message) in stored.iter().enumerate().skip(from) {
        let (subject, field) = match is_letter(n) {
            true => ("outbox.dead_letter", message.json()["row"]["aggregate_id"].clone()),
            false => ("outbox.order.created", message.json()["n"].to_string().into()),
        };
        assert_eq!(message.subject, subject, "event {n}:\n{log}");
        assert_eq!(field, n.to_string(), "event {n} in commit order:\n{log}");
    }
}

/// The object a pointer names, read from its bucket and checked against the pointer's
/// size and digest; what is wrong, if anything.
/// The SHA-256 of `bytes` in lowercase hex, as `Pgoutbox-Object-Sha256` gives it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

pub async fn fetch_object(js: &jetstream::Context, pointer: &Stored) -> Result<Vec<u8>, String> {
    use tokio::io::AsyncReadExt;
    let header = |name: &str| pointer.header(name).ok_or_else(|| format!("no {name} header"));
    if !pointer.payload.is_empty() {
        return Err(format!("a pointer with a body of {} bytes", pointer.payload.len()));
    }
    let bucket = header("Pgoutbox-Object-Bucket")?;
    let name = header("Pgoutbox-Object-Name")?;
    let store = js.get_object_store(bucket).await.map_err(|e| format!("bucket {bucket}: {e}"))?;
    let mut object = store.get(name).await.map_err(|e| format!("object {name}: {e}"))?;
    let mut bytes = Vec::new();
    object.read_to_end(&mut bytes).await.map_err(|e| format!("object {name}'s chunks: {e}"))?;
    let size = bytes.len().to_string();
    if size != header("Pgoutbox-Object-Size")? {
        return Err(format!("object {name} holds {size} bytes, the pointer says otherwise"));
    }
    if sha256_hex(&bytes) != header("Pgoutbox-Object-Sha256")? {
        return Err(format!("object {name}'s digest is not the pointer's"));
    }
    Ok(bytes)
}

/// Every message of the stream, in stream order.
pub async fn read_all(js: &jetstream::Context, stream: &str) -> Vec<Stored> {
    let stream = js.get_stream(stream).await.expect("stream exists");
    let total = stream.get_info().await.expect("stream info").state.messages as usize;
    // On a cluster just after a server was killed or quorum came back, the consumer request
    // can go unanswered, or the consumer stall, while the meta leader settles: the reader
    // starts over, under a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        match read_once(&stream, total).await {
            Ok(messages) => return messages,
            Err(why) if std::time::Instant::now() < deadline => {
                eprintln!("{why}; reading the stream again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(why) => panic!("{why}"),
        }
    }
}

/// One read of the first `total` messages with an ordered consumer of its own.
async fn read_once(
    stream: &jetstream::stream::Stream,
    total: usize,
) -> Result<Vec<Stored>, String> {
    let consumer = stream
        .create_consumer(OrderedConfig::default())
        .await
        .map_err(|err| format!("ordered consumer not created ({err})"))?;
    let mut messages = consumer.messages().await.map_err(|err| format!("consume: {err}"))?;
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let next = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .map_err(|_| "stream read stalled".to_owned())?
            .ok_or("consumer ended")?
            .map_err(|err| format!("message: {err}"))?;
        let headers = next
            .headers
            .as_ref()
            .map(|h| {
                h.iter()
                    .flat_map(|(k, vs)| vs.iter().map(move |v| (k.to_string(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let stored_at_nanos = next
            .info()
            .map_err(|err| format!("message metadata: {err}"))?
            .published
            .unix_timestamp_nanos();
        out.push(Stored {
            subject: next.subject.to_string(),
            headers,
            payload: next.payload.to_vec(),
            stored_at_nanos,
        });
    }
    Ok(out)
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

/// Asserts that `messages` hold rows 0..n each once, in order; `context` is shown if not.
pub fn assert_once_in_order(messages: &[Stored], n: usize, context: &str) {
    let report = audit(messages, n);
    assert_eq!(
        (report.stored, report.duplicates, report.order_violations, report.lost),
        (n, 0, 0, 0),
        "{report:?}\n{context}"
    );
}

/// Checks the rule that the slot is never confirmed past a row JetStream has not stored:
/// for each sample of `confirmed_flush_lsn` taken at time t, every message whose commit LSN
/// is below it must have been stored before t. Returns the violations found.
pub fn confirmed_ahead_of_stored(
    samples: &[super::ConfirmedSample],
    messages: &[Stored],
) -> Vec<String> {
    let mut by_commit: Vec<(u64, i128)> = messages
        .iter()
        .filter_map(|m| {
            let position = m.header("Pgoutbox-Position")?;
            Some((super::parse_lsn(position.split(':').next()?), m.stored_at_nanos))
        })
        .collect();
    by_commit.sort_unstable();
    let mut latest_store = Vec::with_capacity(by_commit.len());
    let mut latest = i128::MIN;
    for (_, stored_at) in &by_commit {
        latest = latest.max(*stored_at);
        latest_store.push(latest);
    }
    samples
        .iter()
        .filter_map(|sample| {
            let below = by_commit.partition_point(|(commit, _)| *commit < sample.confirmed);
            let stored_by = *latest_store.get(below.checked_sub(1)?)?;
            (stored_by > sample.taken_at_nanos).then(|| {
                format!(
                    "confirmed {:X} at {} ns, but a message below it was stored at {stored_by} ns",
                    sample.confirmed, sample.taken_at_nanos
                )
            })
        })
        .collect()
}
