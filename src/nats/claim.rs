//! Which source writes a stream: one record per stream in a JetStream key-value bucket.
//!
//! The chain that orders the messages (`crate::domain::publishing`) and the tail skip rest
//! on one writer per stream. Two pgoutbox sources on one stream (two databases left on the default
//! `--stream`) break both, and rows are lost. So before it streams, a source claims its
//! stream with an atomic create; a stream claimed by another source is refused before
//! anything is confirmed, at start and on every reconnection. The claim also remembers that
//! this source has written the stream, which decides whether a missing slot is a first run
//! or a lost slot, even after the stream was purged or its messages expired.

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::{self, LastRawMessageErrorKind};
use async_nats::jetstream::{self};
use bytes::Bytes;

use crate::domain::source::Source;
use crate::nats::api_error::{is_final_answer, is_stream_not_found};

/// The bucket holding one key per stream, valued with its writer ([`Source::writer`]). It is
/// laid out as a JetStream key-value bucket (stream `KV_<bucket>`, subjects
/// `$KV.<bucket>.<key>`), so `nats kv get pgoutbox_writers OUTBOX` shows a claim; it is
/// written with plain publishes because async-nats' key-value API cannot read
/// nats-server 2.9's answers.
pub const BUCKET: &str = "pgoutbox_writers";

#[derive(Debug, thiserror::Error)]
#[error("the stream claims in JetStream key-value bucket {BUCKET}: {detail}")]
pub struct ClaimError {
    detail: String,
    /// JetStream refused; otherwise it did not answer, and waiting may mend it.
    refused: bool,
}

impl ClaimError {
    fn from(err: impl std::error::Error + 'static) -> Self {
        ClaimError { detail: err.to_string(), refused: is_final_answer(&err) }
    }

    pub fn is_transient(&self) -> bool {
        !self.refused
    }
}

/// Who writes a stream, as the bucket says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This source; `new` when it claimed the stream just now (it never wrote it before).
    Ours { new: bool },
    /// Another source, as its claim names it.
    Theirs(String),
    /// Nobody yet.
    Free,
}

pub struct Claims {
    js: jetstream::Context,
    /// The bucket's stream, created again should an operator delete it.
    bucket: stream::Config,
}

/// The key-value header that marks a key deleted (`nats kv del`) or purged.
const KV_OPERATION: &str = "KV-Operation";

impl Claims {
    /// Opens the bucket, creating it with `replicas` copies when missing.
    pub async fn open(js: &jetstream::Context, replicas: usize) -> Result<Claims, ClaimError> {
        let config = stream::Config {
            name: format!("KV_{BUCKET}"),
            description: Some("pgoutbox: which source writes each stream".to_owned()),
            subjects: vec![format!("$KV.{BUCKET}.>")],
            max_messages_per_subject: 1,
            discard: stream::DiscardPolicy::New,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            storage: stream::StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        };
        let claims = Claims { js: js.clone(), bucket: config };
        claims.stream().await?;
        Ok(claims)
    }

    /// The bucket's stream, created when missing (an operator may have deleted it).
    async fn stream(&self) -> Result<stream::Stream, ClaimError> {
        self.js.get_or_create_stream(self.bucket.clone()).await.map_err(ClaimError::from)
    }

    /// Who writes `stream`, as seen from `ours`, without changing anything.
    pub async fn holder(&self, stream: &str, ours: &Source) -> Result<Claim, ClaimError> {
        Ok(self.read(stream, ours).await?.0)
    }

    /// The claim, and the sequence of the key's last record (0 when it has none), which a
    /// new claim must expect.
    async fn read(&self, stream: &str, ours: &Source) -> Result<(Claim, u64), ClaimError> {
        read(&self.stream().await?, stream, ours).await
    }

    /// Claims `stream` for `ours` unless another source holds it. Atomic: of two sources
    /// claiming at once, one wins and the other sees [`Claim::Theirs`].
    pub async fn claim(&self, stream: &str, ours: &Source) -> Result<Claim, ClaimError> {
        match self.read(stream, ours).await? {
            (Claim::Free, last) => {
                let mut only_if_unclaimed = HeaderMap::new();
                only_if_unclaimed
                    .insert("Nats-Expected-Last-Subject-Sequence", last.to_string().as_str());
                match self.write(stream, ours, only_if_unclaimed).await {
                    Ok(()) => Ok(Claim::Ours { new: true }),
                    Err(err) if err.kind() == PublishErrorKind::WrongLastSequence => {
                        Box::pin(self.claim(stream, ours)).await
                    }
                    Err(err) => Err(ClaimError::from(err)),
                }
            }
            (held, _) => Ok(held),
        }
    }

    /// Makes `ours` the writer of `stream`, whoever held it: the operator's decision
    /// (`--recreate-slot`) after the source that held it is gone for good.
    pub async fn take_over(&self, stream: &str, ours: &Source) -> Result<(), ClaimError> {
        self.write(stream, ours, HeaderMap::new()).await.map_err(ClaimError::from)
    }

    async fn write(
        &self,
        stream: &str,
        ours: &Source,
        headers: HeaderMap,
    ) -> Result<(), jetstream::context::PublishError> {
        let value = Bytes::from(ours.writer());
        self.js.publish_with_headers(subject(stream), headers, value).await?.await?;
        Ok(())
    }
}

/// Who writes `stream`, as seen from `ours`, read without creating anything: for `status`,
/// which must not change what it looks at. No bucket means nobody claimed any stream.
pub async fn holder_if_any(
    js: &jetstream::Context,
    stream: &str,
    ours: &Source,
) -> Result<Claim, ClaimError> {
    match js.get_stream(format!("KV_{BUCKET}")).await {
        Ok(bucket) => Ok(read(&bucket, stream, ours).await?.0),
        Err(err) if is_stream_not_found(&err) => Ok(Claim::Free),
        Err(err) => Err(ClaimError::from(err)),
    }
}

/// The claim in `bucket`, and the sequence of the key's last record (0 when it has none).
async fn read(
    bucket: &stream::Stream,
    stream: &str,
    ours: &Source,
) -> Result<(Claim, u64), ClaimError> {
    let message = match bucket.get_last_raw_message_by_subject(&subject(stream)).await {
        Ok(message) => message,
        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {
            return Ok((Claim::Free, 0));
        }
        Err(err) => return Err(ClaimError::from(err)),
    };
    // `nats kv del` or `purge` releases the claim: the key's record is then a marker.
    let released = message.headers.get(KV_OPERATION).is_some();
    let claim = if released {
        Claim::Free
    } else if *message.payload == *ours.writer().as_bytes() {
        Claim::Ours { new: false }
    } else {
        Claim::Theirs(String::from_utf8_lossy(&message.payload).into_owned())
    };
    Ok((claim, message.sequence))
}

fn subject(stream: &str) -> String {
    format!("$KV.{BUCKET}.{}", key(stream))
}

/// A key-value key for a stream name: keys allow fewer characters than stream names, so
/// anything but ASCII letters, digits, `-` and `_` is written as `=XX` per byte.
fn key(stream: &str) -> String {
    let mut key = String::with_capacity(stream.len());
    for byte in stream.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            key.push(byte as char);
        } else {
            key.push_str(&format!("={byte:02X}"));
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::key;

    #[test]
    fn stream_names_become_valid_distinct_keys() {
        assert_eq!(key("OUTBOX"), "OUTBOX");
        assert_eq!(key("a:b"), "a=3Ab");
        assert_eq!(key("é"), "=C3=A9");
        assert_ne!(key("a:b"), key("a=3Ab"));
    }
}
