//! What pgoutbox's headers say of a message: its event, the id to apply it once by, and its
//! payload, fetched from the Object Store where the message is a pointer.

use async_nats::jetstream;
use sha2::Digest;

use crate::Error;

/// One event, as a reader hands it over.
pub struct Event {
    pub lane: usize,
    pub sequence: u64,
    /// When the stream stored it, in nanoseconds since the epoch.
    pub stored_at: i64,
    pub id: String,
    /// The commit LSN of its transaction (or, for an event outside any, its position).
    pub transaction: String,
    pub index: u32,
    /// On the transaction's last event: how many events it has.
    pub rows: Option<usize>,
    pub subject: String,
    /// The message's payload, or, once [`fetched`], the object its pointer names.
    pub payload: Vec<u8>,
    /// Where the payload is, until fetched, when the message is a pointer.
    pub pointer: Option<Pointer>,
}

/// An object of the Object Store (`--object-store`), as a pointer names it.
pub struct Pointer {
    bucket: String,
    name: String,
    sha256: Option<String>,
}

/// `event` with its payload: the object its pointer names, fetched and checked against the
/// pointer's SHA-256. A payload that cannot be read (an object that does not come, or does
/// not match its pointer) ends the consumer: applied without it the event would be wrong,
/// and a restart reads it again. Each fetch is a consumer of the bucket's stream for a
/// moment (nats-server 2.15 allows a stream 1,000): an event applied before is not fetched
/// again.
pub async fn fetched(js: &jetstream::Context, mut event: Event) -> Result<Event, Error> {
    let Some(Pointer { bucket, name, sha256 }) = event.pointer.take() else { return Ok(event) };
    let mut bytes = Vec::new();
    let mut object = js.get_object_store(&bucket).await?.get(&name).await?;
    tokio::io::AsyncReadExt::read_to_end(&mut object, &mut bytes).await?;
    let digest: String =
        sha2::Sha256::digest(&bytes).iter().map(|byte| format!("{byte:02x}")).collect();
    if sha256.as_deref() != Some(digest.as_str()) {
        return Err(format!("object {name} of bucket {bucket}: not the pointer's SHA-256").into());
    }
    event.payload = bytes;
    Ok(event)
}

/// What pgoutbox's headers say of a message, a pointer's object left to [`fetched`], for
/// an event not applied before. An error: a message pgoutbox's headers do not describe,
/// which the readers report and skip.
pub fn event(lane: usize, message: &jetstream::Message) -> Result<Event, Error> {
    let header = |name| message.headers.as_ref()?.get(name).map(|v| v.as_str().to_owned());
    let position = header("Pgoutbox-Position").ok_or("a message without Pgoutbox-Position")?;
    let (commit, index) = position.split_once(':').ok_or("a malformed Pgoutbox-Position")?;
    let last = header("Pgoutbox-Transaction-Last");
    let id = event_id(message).ok_or("a message without Nats-Msg-Id")?;
    let (transaction, rows) = match last.as_deref() {
        // A seeded row: the table does not say which rows were one transaction, and each
        // seed numbers positions from 0/0:0.
        None => (format!("seed:{id}"), Some(1)),
        Some("true") => {
            let rows = header("Pgoutbox-Transaction-Rows").ok_or("a last event without rows")?;
            (commit.to_owned(), Some(rows.parse()?))
        }
        Some(_) => (commit.to_owned(), None),
    };
    Ok(Event {
        lane,
        sequence: message.info()?.stream_sequence,
        stored_at: message.info()?.published.unix_timestamp_nanos() as i64,
        id,
        transaction,
        index: index.parse()?,
        rows,
        subject: message.subject.to_string(),
        payload: message.payload.to_vec(),
        pointer: pointer(message)?,
    })
}

/// The pointer a message is, if it is one.
fn pointer(message: &jetstream::Message) -> Result<Option<Pointer>, Error> {
    let header = |name| message.headers.as_ref()?.get(name).map(|v| v.as_str().to_owned());
    let Some(bucket) = header("Pgoutbox-Object-Bucket") else { return Ok(None) };
    let name = header("Pgoutbox-Object-Name").ok_or("a pointer without an object name")?;
    Ok(Some(Pointer { bucket, name, sha256: header("Pgoutbox-Object-Sha256") }))
}

/// The key to apply a message's event once by, as `examples/consumer/` reads it.
fn event_id(message: &async_nats::jetstream::Message) -> Option<String> {
    let header = |name| message.headers.as_ref()?.get(name).map(|v| v.as_str().to_owned());
    if let Some(id) = header("Pgoutbox-Event-Id") {
        return Some(id); // a scheduled row, delivered without Nats-Msg-Id
    }
    let msg_id = header("Nats-Msg-Id")?;
    match msg_id.strip_prefix("replay:").and_then(|rest| rest.split_once(':')) {
        Some((_replay_and_n, id)) => Some(id.to_owned()),
        None => Some(msg_id),
    }
}
