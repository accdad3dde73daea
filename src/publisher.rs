//! JetStream: the stream pgoutbox writes to, and pipelined publishing.
//!
//! `publish` hands a message to the client and returns the ack as a future; the pipeline keeps
//! those futures in a FIFO and awaits the oldest, so thousands of messages are in flight while
//! acks are still consumed in order. Each message also carries `Nats-Expected-Last-Sequence`:
//! if message k is lost, k+1 is refused by the server instead of being stored before it.
//! That guard assumes the stream is written only by this pgoutbox.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishAckFuture, stream};
use bytes::Bytes;

use crate::progress::Position;
use crate::source::{SOURCE_HEADER, TailOrigin};

/// Header carrying the row's [`Position`].
pub const POSITION_HEADER: &str = "Pgoutbox-Position";

/// How many publishes may await their ack at once.
pub const MAX_IN_FLIGHT: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    #[error("JetStream is not enabled on the NATS server (start nats-server with -js)")]
    JetStreamDisabled,
    #[error(
        "stream {stream} exists but its subjects {existing:?} do not cover {wanted}; \
         pgoutbox never changes an existing stream: add the subject to it or use --stream"
    )]
    SubjectsNotCovered { stream: String, existing: Vec<String>, wanted: String },
    #[error("JetStream request failed: {0}")]
    Request(String),
    #[error("stream {0} has no leader (an election is under way, or quorum is lost)")]
    NoLeader(String),
}

/// The end of the stream when pgoutbox starts or resumes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamTail {
    pub last_sequence: u64,
    /// Where the last stored message came from, as far as its headers say.
    pub origin: TailOrigin,
}

#[derive(Clone)]
pub struct Publisher {
    js: jetstream::Context,
    client: async_nats::Client,
    stream: String,
    ack_timeout: Duration,
}

impl Publisher {
    pub fn new(client: async_nats::Client, stream: &str, ack_timeout: Duration) -> Self {
        let js = jetstream::context::ContextBuilder::new()
            .timeout(ack_timeout)
            .max_ack_inflight(MAX_IN_FLIGHT)
            .backpressure_on_inflight(true)
            .build(client.clone());
        Publisher { js, client, stream: stream.to_owned(), ack_timeout }
    }

    /// The same stream with a window of [`MAX_IN_FLIGHT`] acks of its own. A failed attempt
    /// abandons its unacknowledged publishes, and async-nats keeps each one's slot in the
    /// window until its ack times out: the next attempt must not wait behind them (it did,
    /// for 20 s after a leader election, before each attempt got its own window).
    pub fn with_fresh_ack_window(&self) -> Publisher {
        Publisher::new(self.client.clone(), &self.stream, self.ack_timeout)
    }

    /// The JetStream context, for the stream claims (`crate::claim`).
    pub fn context(&self) -> &jetstream::Context {
        &self.js
    }

    /// Creates the stream if it is missing; an existing stream is only checked, never changed.
    pub async fn ensure_stream(
        &self,
        subjects: &[String],
        replicas: usize,
    ) -> Result<(), PublisherError> {
        match self.js.get_stream(&self.stream).await {
            Ok(mut existing) => {
                let info = existing.info().await.map_err(request_error)?;
                if info.config.num_replicas != replicas {
                    tracing::warn!(stream = %self.stream, replicas = info.config.num_replicas,
                        asked = replicas, "the existing stream keeps its replica count");
                }
                let have = &info.config.subjects;
                match subjects.iter().find(|want| !have.iter().any(|h| subject_covers(h, want))) {
                    Some(wanted) => Err(PublisherError::SubjectsNotCovered {
                        stream: self.stream.clone(),
                        existing: have.clone(),
                        wanted: wanted.clone(),
                    }),
                    None => Ok(()),
                }
            }
            Err(err) if is_stream_not_found(&err) => {
                let config = stream::Config {
                    name: self.stream.clone(),
                    subjects: subjects.to_vec(),
                    storage: stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                };
                match self.js.create_stream(config).await {
                    Ok(_) => {
                        tracing::info!(stream = %self.stream, ?subjects, "stream created");
                        Ok(())
                    }
                    // Another instance created it first: check it like any existing stream.
                    Err(err) if err.to_string().contains("already in use") => {
                        Box::pin(self.ensure_stream(subjects, replicas)).await
                    }
                    Err(err) => Err(classify(err.to_string())),
                }
            }
            Err(err) => Err(classify(err.to_string())),
        }
    }

    /// Reads the stream's last sequence and the position of its last message. On a cluster,
    /// a server without the stream's leader may still answer from its own copy: that answer
    /// is refused, since publishing cannot succeed without a leader and may be stale.
    pub async fn tail(&self) -> Result<StreamTail, PublisherError> {
        let mut stream = self.js.get_stream(&self.stream).await.map_err(request_error)?;
        let info = stream.info().await.map_err(request_error)?;
        if let Some(cluster) = &info.cluster
            && cluster.name.is_some()
            && cluster.leader.as_deref().is_none_or(str::is_empty)
        {
            return Err(PublisherError::NoLeader(self.stream.clone()));
        }
        let last_sequence = info.state.last_sequence;
        if last_sequence == 0 {
            return Ok(StreamTail::default());
        }
        let origin = match stream.get_raw_message(last_sequence).await {
            Ok(message) => {
                let header = |name| message.headers.get(name).map(|v| v.as_str().to_owned());
                TailOrigin {
                    source: header(SOURCE_HEADER),
                    position: header(POSITION_HEADER).and_then(|p| p.parse::<Position>().ok()),
                }
            }
            // The last message was deleted or purged: nothing to skip by.
            Err(_) => TailOrigin::default(),
        };
        Ok(StreamTail { last_sequence, origin })
    }

    /// Sends one message; the returned future resolves when JetStream stored it.
    pub async fn publish(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<PublishAckFuture, jetstream::context::PublishError> {
        self.js.publish_with_headers(subject, headers, payload).await
    }

    /// How many messages the stream holds on one subject (the dead letters, for `status`).
    pub async fn count_on_subject(&self, subject: &str) -> Result<u64, PublisherError> {
        use futures_util::TryStreamExt;
        let stream = self.js.get_stream(&self.stream).await.map_err(request_error)?;
        let mut subjects = stream.info_with_subjects(subject).await.map_err(request_error)?;
        let mut total = 0;
        while let Some((_, count)) = subjects.try_next().await.map_err(request_error)? {
            total += count as u64;
        }
        Ok(total)
    }

    /// The stream's message count, bytes, last sequence and dedup window, for `status`.
    pub async fn stream_info(&self) -> Result<stream::Info, PublisherError> {
        let mut stream = self.js.get_stream(&self.stream).await.map_err(request_error)?;
        stream.info().await.cloned().map_err(request_error)
    }
}

fn is_stream_not_found(err: &jetstream::context::GetStreamError) -> bool {
    matches!(
        err.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(e)
            if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

fn request_error(err: impl std::fmt::Display) -> PublisherError {
    classify(err.to_string())
}

/// Without JetStream, nothing answers on `$JS.API`: async-nats reports that missing
/// responder as "requested JetStream resource does not exist".
fn classify(message: String) -> PublisherError {
    let no_responder = message.contains("no responders")
        || message.contains("requested JetStream resource does not exist");
    if no_responder || message.contains("not enabled") {
        PublisherError::JetStreamDisabled
    } else {
        PublisherError::Request(message)
    }
}

/// Whether the stream subject filter `filter` matches every subject `wanted` can match.
pub fn subject_covers(filter: &str, wanted: &str) -> bool {
    let mut filter = filter.split('.');
    let mut wanted = wanted.split('.');
    loop {
        match (filter.next(), wanted.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(w)) if w != ">" => {}
            (Some(f), Some(w)) if f == w => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::subject_covers;

    #[test]
    fn subject_coverage_follows_nats_wildcards() {
        assert!(subject_covers("outbox.*.*", "outbox.*.*"));
        assert!(subject_covers("outbox.>", "outbox.*.*"));
        assert!(subject_covers(">", "outbox.dead_letter"));
        assert!(subject_covers("outbox.*.created", "outbox.order.created"));
        assert!(!subject_covers("outbox.*", "outbox.*.*"));
        assert!(!subject_covers("outbox.order.*", "outbox.*.*"));
        assert!(!subject_covers("outbox.*.*", "outbox.>"));
        assert!(!subject_covers("outbox.*.*.x", "outbox.*.*"));
    }
}
