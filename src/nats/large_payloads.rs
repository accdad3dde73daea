//! Payloads too large for a message (`--object-store`, issue 48): stored in a JetStream
//! Object Store bucket, and the message, in its place in the chain, carries a pointer in
//! headers instead of the payload.
//!
//! The object is complete (every chunk and its metadata acknowledged) before the pointer is
//! published, so no pointer is ever stored without its object. Its name is the message's
//! position and id: a kill -9 between the object and the pointer decodes the row again at
//! the same position, and the put under the same name replaces the object, whose old
//! chunks the Object Store purges, so one copy stays. Chunks of a put cut short belong to
//! no object: `run` purges them at start ([`sweep_orphan_chunks`]).

use std::time::Duration;

use async_nats::jetstream::{self, ErrorCode, object_store, stream};
use base64::Engine;

use sha2::Digest;

use crate::domain::outbox::MAX_SUBJECT_BYTES;
use crate::domain::progress::Position;
use crate::nats::api_error::is_final_answer;
use crate::nats::publisher::PublisherError;

/// The bucket that holds the object.
pub const BUCKET_HEADER: &str = "Pgoutbox-Object-Bucket";
/// The object's name in it.
pub const NAME_HEADER: &str = "Pgoutbox-Object-Name";
/// The payload's size in bytes.
pub const SIZE_HEADER: &str = "Pgoutbox-Object-Size";
/// The payload's SHA-256, in lowercase hex.
pub const DIGEST_HEADER: &str = "Pgoutbox-Object-Sha256";

/// Where and when payloads go to the Object Store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LargePayloads {
    pub bucket: String,
    /// Payloads larger than this go to the bucket even when their message would fit.
    pub over: Option<usize>,
    /// Payloads larger than this are not stored: the row is a dead letter.
    pub max_size: Option<usize>,
    /// The replicas of a bucket pgoutbox creates; `None`: the stream's.
    pub replicas: Option<usize>,
    /// The expiry of a bucket pgoutbox creates; `None`: the stream's `max_age`.
    pub max_age: Option<Duration>,
}

/// What the message carries in the payload's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    pub bucket: String,
    pub name: String,
    pub size: usize,
    pub sha256: String,
}

impl Pointer {
    /// The pointer's headers, in the order they are added to the message.
    pub fn headers(&self) -> [(&'static str, String); 4] {
        [
            (BUCKET_HEADER, self.bucket.clone()),
            (NAME_HEADER, self.name.clone()),
            (SIZE_HEADER, self.size.to_string()),
            (DIGEST_HEADER, self.sha256.clone()),
        ]
    }
}

impl LargePayloads {
    /// Why a payload of `len` bytes is not stored: over `--object-store-max-size`.
    pub fn refuses(&self, len: usize) -> Option<String> {
        let max = self.max_size.filter(|max| len > *max)?;
        Some(format!(
            "the payload is {len} bytes, over --object-store-max-size ({max} bytes): not stored \
             as an object"
        ))
    }

    /// Whether a payload of `len` bytes goes to the bucket, when a message may carry
    /// `fits` bytes of payload and headers and these headers take `headers`.
    pub fn takes(&self, len: usize, headers: usize, fits: usize) -> bool {
        len + headers > fits || self.over.is_some_and(|over| len > over)
    }
}

/// A bucket name the Object Store refuses (`--object-store`).
#[derive(Debug, thiserror::Error)]
#[error("a bucket name is letters, digits, '-' and '_'")]
pub struct InvalidBucketName;

/// `--object-store`'s value, checked as the Object Store checks a bucket's name.
pub fn bucket_name(name: &str) -> Result<String, InvalidBucketName> {
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    match !name.is_empty() && name.chars().all(valid) {
        true => Ok(name.to_owned()),
        false => Err(InvalidBucketName),
    }
}

/// The object's name: the message's position and id, the same each time the row is decoded.
/// An id too long for the subject that names the object (`$O.<bucket>.M.<name in
/// base64>`, within the control line nats-server reads: [`MAX_SUBJECT_BYTES`]) is named by
/// its SHA-256 instead; before, the put of such a row was tried again without end.
pub fn object_name(bucket: &str, id: &str, position: Position) -> String {
    let name = format!("{position}/{id}");
    let subject = "$O..M.".len() + bucket.len() + name.len().div_ceil(3) * 4;
    if subject <= MAX_SUBJECT_BYTES {
        return name;
    }
    let digest = sha2::Sha256::digest(id.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{position}/sha256:{hex}")
}

/// Why the bucket cannot be used: one line saying what to do.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    #[error(
        "Object Store bucket {bucket} expires objects after {bucket_age}, before stream \
         {stream}'s messages ({stream_age}): pointers would outlive their payloads; use a \
         bucket that keeps them at least as long, or another --object-store"
    )]
    ExpiresFirst { bucket: String, bucket_age: String, stream: String, stream_age: String },
    #[error(
        "cannot create Object Store bucket {bucket}: {why}; create it as a user that may \
         (nats object add {bucket}), or lift the limit JetStream names"
    )]
    NotCreated { bucket: String, why: String },
    #[error(
        "this NATS user may not use Object Store bucket {bucket}: the server refused a publish \
         to {subject} (Permissions Violation); create the bucket as a user that may (nats \
         object add {bucket}), or grant the permission"
    )]
    NotPermitted { bucket: String, subject: String },
    #[error(
        "this NATS user may not store objects in bucket {bucket}: the server refused a publish \
         to {subject} (Permissions Violation); grant it publish on $O.{bucket}.> (besides \
         the stream's subjects, $JS.API.> and $KV.pgoutbox_writers.>)"
    )]
    MayNotStore { bucket: String, subject: String },
    /// JetStream did not answer, or refused to say what the bucket is.
    #[error("reading Object Store bucket: {0}")]
    Stream(#[source] PublisherError),
}

fn age(max_age: Duration) -> String {
    match max_age.is_zero() {
        true => "never".to_owned(),
        false => format!("{max_age:?}"),
    }
}

/// Creates the bucket when missing, expiring with the stream (`stream.max_age`, or
/// `large.max_age`), with the stream's replicas (or `large.replicas`); refuses a bucket,
/// found or asked for, that expires objects before the stream expires their pointers.
pub async fn ensure_bucket(
    js: &jetstream::Context,
    large: &LargePayloads,
    stream: &stream::Config,
) -> Result<(), BucketError> {
    let bucket = &large.bucket;
    let expires_first = |bucket_age: Duration| {
        let sooner =
            !bucket_age.is_zero() && (stream.max_age.is_zero() || bucket_age < stream.max_age);
        sooner.then(|| BucketError::ExpiresFirst {
            bucket: bucket.clone(),
            bucket_age: age(bucket_age),
            stream: stream.name.clone(),
            stream_age: age(stream.max_age),
        })
    };
    // A request the user may not send gets no answer: the server only says why, apart.
    let unanswered = |api: &str, err: &(dyn std::error::Error + 'static)| {
        let subject = format!("$JS.API.STREAM.{api}.OBJ_{bucket}");
        match crate::nats::connect::publish_denied(&subject) {
            true => BucketError::NotPermitted { bucket: bucket.clone(), subject },
            false => unanswered(err),
        }
    };
    match js.get_stream(format!("OBJ_{bucket}")).await {
        Ok(mut existing) => {
            let info = existing.info().await.map_err(|err| unanswered("INFO", &err))?;
            expires_first(info.config.max_age).map_or(Ok(()), Err)?;
            say_if_objects_outlive_pointers(bucket, &info.config, stream);
            may_store(js, bucket).await
        }
        Err(err) if crate::nats::api_error::is_stream_not_found(&err) => {
            let max_age = large.max_age.unwrap_or(stream.max_age);
            if let Some(refused) = expires_first(max_age) {
                return Err(refused);
            }
            let config = object_store::Config {
                bucket: bucket.clone(),
                description: Some(format!("payloads too large for stream {}", stream.name)),
                max_age,
                num_replicas: large.replicas.unwrap_or(stream.num_replicas).max(1),
                ..Default::default()
            };
            match js.create_object_store(config).await {
                Ok(_) => {
                    tracing::info!(%bucket, ?max_age, "Object Store bucket created");
                    let made = stream::Config { max_age, ..Default::default() };
                    say_if_objects_outlive_pointers(bucket, &made, stream);
                    may_store(js, bucket).await
                }
                Err(err) if is_final_answer(&err) => {
                    Err(BucketError::NotCreated { bucket: bucket.clone(), why: err.to_string() })
                }
                Err(err) => Err(unanswered("CREATE", &err)),
            }
        }
        Err(err) => Err(unanswered("INFO", &err)),
    }
}

/// Objects expire with the bucket's `max_age`, never before the stream's (see
/// [`ensure_bucket`]). A stream that also drops messages by count or size drops pointers
/// whose objects a bucket without its own bound keeps for good: said once, at start.
fn say_if_objects_outlive_pointers(bucket: &str, kept: &stream::Config, stream: &stream::Config) {
    let drops =
        stream.max_messages > 0 || stream.max_bytes > 0 || stream.max_messages_per_subject > 0;
    let bounded = !kept.max_age.is_zero() || kept.max_bytes > 0;
    if drops && !bounded {
        tracing::warn!(%bucket, stream = %stream.name,
            "stream {} drops messages by count or size (max_msgs, max_bytes or \
             max_msgs_per_subject), and Object Store bucket {bucket} keeps the objects of the \
             pointers it drops for good: give the bucket a max_age or max_bytes (nats stream \
             edit OBJ_{bucket} --max-age ...), or pass --object-store-max-age when pgoutbox \
             creates it", stream.name);
    }
}

/// The subject of the empty chunk [`may_store`] stores and purges.
fn permission_probe(bucket: &str) -> String {
    chunk_subject(bucket, "pgoutbox-permission-check")
}

/// Whether this NATS user may publish an object's chunks to `bucket`, asked by storing an
/// empty chunk no object names (and purging it): a put the server refuses gets no answer
/// but the server's `-ERR`, so without this every large row would be tried again without
/// end. A user that may not is one line at start. (A refusal of the object's name, on
/// `$O.<bucket>.M.>`, is found by the put: the row becomes a dead letter.)
async fn may_store(js: &jetstream::Context, bucket: &str) -> Result<(), BucketError> {
    let subject = permission_probe(bucket);
    let stored = async {
        js.publish(subject.clone(), bytes::Bytes::new()).await?.await?;
        let stream = bucket_stream(js, bucket).await?;
        stream.purge().filter(subject.as_str()).await?;
        Ok::<_, async_nats::Error>(())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, stored).await {
        Ok(Ok(())) => Ok(()),
        _ if crate::nats::connect::publish_denied(&subject) => {
            Err(BucketError::MayNotStore { bucket: bucket.to_owned(), subject })
        }
        Ok(Err(err)) => Err(unanswered(&*err)),
        Err(_) => Err(BucketError::Stream(PublisherError::Unanswered(format!(
            "no answer to a chunk stored in bucket {bucket} within {PROBE_TIMEOUT:?}"
        )))),
    }
}

/// How long [`may_store`] waits for its chunk's ack: the server refuses a publish with
/// only an `-ERR`, so no answer by then, with that `-ERR` seen, is a refusal.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A refusal, or no answer, which `run` waits out (`PublisherError::is_transient`).
fn unanswered(err: &(dyn std::error::Error + 'static)) -> BucketError {
    BucketError::Stream(match is_final_answer(err) {
        true => PublisherError::Request(err.to_string()),
        false => PublisherError::Unanswered(err.to_string()),
    })
}

/// Why a payload was not stored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No answer, or a lost connection: the row is tried again with the next attempt.
    #[error("storing the payload in Object Store bucket {bucket}: {why}")]
    Unanswered { bucket: String, why: String },
    /// JetStream refused it (the bucket's size limit, permissions): asking again gets the
    /// same answer, so the row becomes a dead letter.
    #[error("Object Store bucket {bucket} refused the payload: {why}")]
    Refused { bucket: String, why: String },
}

/// Whether a put's error is JetStream's final answer (`api_error::is_final_code`: a full
/// bucket says "maximum bytes exceeded", 10077), which asking again would get again, not a
/// timeout or a "not now". async-nats keeps only the text of the answer: "<description>
/// (code <status>, error code <code>)".
fn is_refusal(error: &str) -> bool {
    let code = error.rsplit_once("error code ").and_then(|(_, rest)| {
        rest.split(|c: char| !c.is_ascii_digit()).next().and_then(|digits| digits.parse().ok())
    });
    code.is_some_and(|code| crate::nats::api_error::is_final_code(ErrorCode(code)))
}

/// The subject of an object's chunks, by the id its put gave them.
fn chunk_subject(bucket: &str, nuid: &str) -> String {
    format!("$O.{bucket}.C.{nuid}")
}

/// The stream behind `bucket`.
async fn bucket_stream(
    js: &jetstream::Context,
    bucket: &str,
) -> Result<stream::Stream, async_nats::Error> {
    Ok(js.get_stream(format!("OBJ_{bucket}")).await?)
}

/// How many chunks the bucket's stream holds on each chunk subject matching `filter`.
async fn chunk_counts(
    stream: &stream::Stream,
    filter: &str,
) -> Result<std::collections::HashMap<String, usize>, async_nats::Error> {
    use futures_util::TryStreamExt;
    Ok(stream.info_with_subjects(filter).await?.try_collect().await?)
}

/// Purges the chunks no object names: those of a put cut short (a kill -9, a lost
/// connection, a refusal midway) and a replaced object's, when the put stopped before it
/// purged them. Run when no put of this process is going on (at start, after a refusal):
/// one still going on is another process's (one paused and replaced), and [`store`] finds
/// its chunks missing.
/// Returns how many chunks were purged.
pub async fn sweep_orphan_chunks(
    js: &jetstream::Context,
    bucket: &str,
) -> Result<usize, async_nats::Error> {
    use futures_util::TryStreamExt;
    let stream = bucket_stream(js, bucket).await?;
    // Chunks first, names second: a put that finishes in between keeps its chunks.
    let chunks = chunk_counts(&stream, &chunk_subject(bucket, ">")).await?;
    let store = js.get_object_store(bucket).await?;
    let objects: Vec<_> = store.list().await?.try_collect().await?;
    let named: std::collections::HashSet<String> =
        objects.iter().map(|object| chunk_subject(bucket, &object.nuid)).collect();
    let mut purged = 0;
    for (subject, count) in chunks.into_iter().filter(|(subject, _)| !named.contains(subject)) {
        stream.purge().filter(subject).await?;
        purged += count;
    }
    Ok(purged)
}

/// The bytes `bucket` holds, as JetStream counts its stream; `None` when it did not say.
pub async fn bucket_bytes(js: &jetstream::Context, bucket: &str) -> Option<u64> {
    let mut stream = bucket_stream(js, bucket).await.ok()?;
    Some(stream.info().await.ok()?.state.bytes)
}

/// Whether the object `name` of `bucket` is whole and what its pointer says: listed, of
/// `size` bytes with the SHA-256 `sha256` (lowercase hex), and every chunk its info counts
/// still in the bucket's stream (a power loss may keep an object's name and lose chunks
/// stored after the last sync). Read without fetching the object.
pub async fn object_intact(
    js: &jetstream::Context,
    bucket: &str,
    name: &str,
    size: Option<usize>,
    sha256: &str,
) -> Result<bool, async_nats::Error> {
    let store = js.get_object_store(bucket).await?;
    let info = match store.info(name).await {
        Ok(info) => info,
        Err(err) if err.kind() == object_store::InfoErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(err.into()),
    };
    let digest = info.digest.as_deref().and_then(|d| d.strip_prefix("SHA-256="));
    let digest = digest.and_then(|d| base64::engine::general_purpose::URL_SAFE.decode(d).ok());
    let hex: Option<String> = digest.map(|d| d.iter().map(|b| format!("{b:02x}")).collect());
    if info.deleted || size != Some(info.size) || hex.as_deref() != Some(sha256) {
        return Ok(false);
    }
    let stream = bucket_stream(js, bucket).await?;
    let kept = chunk_counts(&stream, &chunk_subject(bucket, &info.nuid)).await?;
    Ok(kept.values().sum::<usize>() == info.chunks)
}

/// Deletes the object `name` from `bucket`, if it is there.
pub async fn delete(
    js: &jetstream::Context,
    bucket: &str,
    name: &str,
) -> Result<(), async_nats::Error> {
    let store = js.get_object_store(bucket).await?;
    match store.delete(name).await {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == object_store::DeleteErrorKind::NotFound => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// Stores `payload` under `name` and returns the pointer to it. Every chunk is acknowledged
/// before the next is sent, so memory holds one chunk besides the payload. The object's
/// chunks are counted once it is named: a sweep of a process that took over from this one
/// (paused meanwhile) may have purged them, and the object is then stored again.
pub async fn store(
    js: &jetstream::Context,
    bucket: &str,
    name: &str,
    mut payload: &[u8],
) -> Result<Pointer, StoreError> {
    let unanswered = |why: String| StoreError::Unanswered { bucket: bucket.to_owned(), why };
    let store = js.get_object_store(bucket).await.map_err(|e| unanswered(e.to_string()))?;
    let stream = bucket_stream(js, bucket).await.map_err(|e| unanswered(e.to_string()))?;
    let began = std::time::Instant::now();
    let info = match store.put(name, &mut payload).await {
        Ok(info) => info,
        Err(err) => {
            let refused =
                match crate::nats::connect::publish_denied_under(&format!("$O.{bucket}."), began) {
                    Some(subject) => {
                        BucketError::MayNotStore { bucket: bucket.to_owned(), subject }.to_string()
                    }
                    None if is_refusal(&err.to_string()) => err.to_string(),
                    None => return Err(unanswered(err.to_string())),
                };
            // The chunks stored before the refusal would fill a full bucket for good.
            if let Err(why) = sweep_orphan_chunks(js, bucket).await {
                tracing::warn!(%bucket, %why, "could not purge the refused put's chunks");
            }
            return Err(StoreError::Refused { bucket: bucket.to_owned(), why: refused });
        }
    };
    let sha256 = info
        .digest
        .as_deref()
        .and_then(|digest| digest.strip_prefix("SHA-256="))
        .and_then(|encoded| base64::engine::general_purpose::URL_SAFE.decode(encoded).ok())
        .map(|bytes| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .ok_or_else(|| {
            unanswered(format!("no SHA-256 digest in the object's info: {:?}", info.digest))
        })?;
    let chunks = chunk_subject(bucket, &info.nuid);
    let kept = chunk_counts(&stream, &chunks).await.map_err(|e| unanswered(e.to_string()))?;
    let kept: usize = kept.values().sum();
    if kept != info.chunks {
        return Err(unanswered(format!(
            "{kept} of the object's {} chunks are left (purged by another pgoutbox's sweep)",
            info.chunks
        )));
    }
    Ok(Pointer { bucket: bucket.to_owned(), name: name.to_owned(), size: info.size, sha256 })
}

#[cfg(test)]
mod tests;
