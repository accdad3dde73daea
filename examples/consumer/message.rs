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
    pub payload: Vec<u8>,
}

/// Why a message was not handed over: one that pgoutbox's headers do not describe is
/// skipped (and reported); a reader that cannot read, or a payload that cannot be fetched,
/// ends the consumer.
pub enum Malformed {
    Skipped(Error),
    Fatal(Error),
}

/// What pgoutbox's headers say of a message, with its payload. A payload that cannot be
/// read (an object that does not come, or does not match its pointer) ends the consumer:
/// applied without it the event would be wrong, and a restart reads it again.
pub async fn event(
    js: &jetstream::Context,
    lane: usize,
    message: &jetstream::Message,
) -> Result<Event, Malformed> {
    let mut event = described(lane, message).map_err(Malformed::Skipped)?;
    event.payload = payload_of(js, message).await.map_err(Malformed::Fatal)?;
    Ok(event)
}

/// What pgoutbox's headers say of a message, its payload left to [`payload_of`].
fn described(lane: usize, message: &jetstream::Message) -> Result<Event, Error> {
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
        payload: Vec::new(),
    })
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

/// The message's payload, or the object its pointer names (`--object-store`), checked
/// against the pointer's SHA-256.
async fn payload_of(
    js: &jetstream::Context,
    message: &jetstream::Message,
) -> Result<Vec<u8>, Error> {
    let header = |name| message.headers.as_ref()?.get(name).map(|v| v.as_str().to_owned());
    let Some(bucket) = header("Pgoutbox-Object-Bucket") else {
        return Ok(message.payload.to_vec());
    };
    let name = header("Pgoutbox-Object-Name").ok_or("a pointer without an object name")?;
    let mut bytes = Vec::new();
    let mut object = js.get_object_store(&bucket).await?.get(&name).await?;
    tokio::io::AsyncReadExt::read_to_end(&mut object, &mut bytes).await?;
    let digest: String =
        sha2::Sha256::digest(&bytes).iter().map(|byte| format!("{byte:02x}")).collect();
    if header("Pgoutbox-Object-Sha256").as_deref() != Some(digest.as_str()) {
        return Err(format!("object {name} of bucket {bucket}: not the pointer's SHA-256").into());
    }
    Ok(bytes)
}
