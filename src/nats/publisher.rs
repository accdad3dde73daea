//! JetStream: the stream pgoutbox writes to, and the opening of pipelined publishing
//! ([`crate::nats::outbound`]). Each message carries a guard naming its predecessor
//! (`crate::domain::publishing`): if message k is lost, k+1 is refused by the server instead
//! of being stored before it. That guard assumes the stream is written only by this pgoutbox,
//! and by the server itself delivering pgoutbox's scheduled rows (`--schedule-column`): a
//! delivery ends the attempt it overtakes, and the next one reads the tail past it.

use std::time::Duration;

use async_nats::jetstream::context::CreateStreamErrorKind;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::{self, ErrorCode, stream};

use crate::domain::outbox::ScheduleColumn;
use crate::nats::api_error::{is_final_answer, is_stream_not_found};
use crate::nats::handshake::{Dialer, OpenError};
use crate::nats::outbound::{self, Acks, Outbound};

mod features;
mod overlap;
mod read_back;
mod replay_board;
mod tail;
pub use features::StreamFeatures;
pub use overlap::SubjectsTaken;
pub use read_back::ReadFrom;
pub use replay_board::ReplayRecord;
pub use tail::StreamTail;

/// Header carrying the row's [`Position`].
pub const POSITION_HEADER: &str = "Pgoutbox-Position";

/// Room left in every message for the headers the pipeline adds to it after the row was
/// mapped (`Pgoutbox-Position: <lsn>:<index>` and `Pgoutbox-Source: <system id>/<timeline>/
/// <database>/<slot>`, whose names Postgres caps at 63 bytes: about 250 bytes at most; the
/// transaction marks, 75 bytes at most; with traces on, a dead letter's `traceparent` line,
/// 70 bytes, and no `tracestate`), so a
/// dead letter built to `message_limit` minus this, less the guard's own line
/// (`Guard::header_bytes`: it repeats the previous message's id), still fits.
pub const ADDED_HEADERS_ROOM: usize = 512;

/// JetStream API error codes that refuse a message for what it is, whatever the stream's
/// state: sending it again gets the same answer. 10054 (`JSStreamMessageExceedsMaximumErr`,
/// "message size exceeds maximum allowed") is the stream's `max_msg_size`; 10097
/// (`JSStreamHeaderExceedsMaximumErr`) is a header block over 64 KiB.
const REFUSED_FOR_ITSELF: [ErrorCode; 2] =
    [ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM, ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM];

#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    #[error("JetStream is not enabled on the NATS server (start nats-server with -js)")]
    JetStreamDisabled,
    #[error(
        "stream {stream} exists but its subjects {existing:?} do not cover {wanted}; \
         pgoutbox never changes an existing stream: add the subject to it or use --stream"
    )]
    SubjectsNotCovered { stream: String, existing: Vec<String>, wanted: String },
    /// Another stream holds subjects the stream to create needs (JetStream's 10065).
    #[error("{0}")]
    SubjectsTaken(SubjectsTaken),
    /// JetStream answered with a refusal that asking again will not change.
    #[error("JetStream request failed: {0}")]
    Request(String),
    /// No answer (timed out, connection lost) or "temporarily unavailable": worth waiting for.
    #[error("JetStream did not answer ({0}): a leader election, quorum lost, or NATS restarting?")]
    Unanswered(String),
    #[error("stream {0} has no leader (an election is under way, or quorum is lost)")]
    NoLeader(String),
    /// JetStream's 10026, to a read back through a consumer of pgoutbox's own.
    #[error(
        "the stream holds as many consumers as it may (JetStream 10026; nats-server 2.15 \
         allows a stream 1,000 unless its max_consumers says otherwise), and pgoutbox reads \
         the stream back through a consumer of its own for a moment: delete the consumers \
         no one reads from, or raise the stream's max_consumers"
    )]
    ConsumerLimit,
    /// The settings ask for something this server or the existing stream cannot do.
    #[error("{0}")]
    Unsupported(String),
}

impl PublisherError {
    /// Whether waiting may mend it: NATS was reachable but JetStream gave no final answer.
    pub fn is_transient(&self) -> bool {
        // Ephemeral consumers expire: a limit they fill frees itself.
        matches!(self, Self::Unanswered(_) | Self::NoLeader(_) | Self::ConsumerLimit)
    }
}

#[derive(Clone)]
pub struct Publisher {
    js: jetstream::Context,
    client: async_nats::Client,
    stream: String,
    ack_timeout: Duration,
    /// The tables' `--schedule-column`s: which subjects hold pgoutbox's schedules.
    schedules: Vec<ScheduleColumn>,
}

impl Publisher {
    pub fn new(client: async_nats::Client, stream: &str, ack_timeout: Duration) -> Self {
        let js =
            jetstream::context::ContextBuilder::new().timeout(ack_timeout).build(client.clone());
        Publisher { js, client, stream: stream.to_owned(), ack_timeout, schedules: Vec::new() }
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The same publisher, knowing the subjects that hold pgoutbox's scheduled rows: the
    /// tail is read past the messages the server delivered from them.
    pub fn with_schedules(mut self, schedules: Vec<ScheduleColumn>) -> Self {
        self.schedules = schedules;
        self
    }

    /// Pipelined publishing for one attempt, on a connection and a reply subscription of
    /// its own: acks of messages a failed attempt abandoned never reach the next one.
    pub async fn outbound(&self, dialer: &Dialer<'_>) -> Result<(Outbound, Acks), OpenError> {
        outbound::open(dialer, &self.client.new_inbox(), self.ack_timeout).await
    }

    /// The version the connected nats-server announced.
    pub fn server_version(&self) -> String {
        self.client.server_info().version
    }

    /// The JetStream context, for the stream claims (`crate::nats::claim`).
    pub fn context(&self) -> &jetstream::Context {
        &self.js
    }

    /// Creates the stream if it is missing, allowing what `features` need; an existing
    /// stream is only checked, never changed.
    pub async fn ensure_stream(
        &self,
        subjects: &[String],
        replicas: usize,
        features: StreamFeatures,
    ) -> Result<(), PublisherError> {
        let version = self.server_version();
        if let Some(why) = features.refusal(&version, &self.stream, None) {
            return Err(PublisherError::Unsupported(why));
        }
        match self.js.get_stream(&self.stream).await {
            Ok(mut existing) => {
                let info = existing.info().await.map_err(request_error)?;
                if let Some(why) = features.refusal(&version, &self.stream, Some(&info.config)) {
                    return Err(PublisherError::Unsupported(why));
                }
                if let Some(why) = tail_may_vanish(&info.config) {
                    tracing::warn!(stream = %self.stream, "{why}");
                }
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
                    allow_message_ttl: features.message_ttl,
                    allow_message_schedules: features.message_schedules,
                    ..Default::default()
                };
                match self.js.create_stream(config).await {
                    Ok(_) => {
                        tracing::info!(stream = %self.stream, ?subjects, "stream created");
                        Ok(())
                    }
                    // Another instance created it first: check it like any existing stream.
                    Err(err)
                        if matches!(err.kind(), CreateStreamErrorKind::JetStream(e)
                            if e.error_code() == jetstream::ErrorCode::STREAM_NAME_EXIST) =>
                    {
                        Box::pin(self.ensure_stream(subjects, replicas, features)).await
                    }
                    Err(err) if err.kind() == CreateStreamErrorKind::JetStreamUnavailable => {
                        Err(PublisherError::JetStreamDisabled)
                    }
                    // JetStream names neither the subjects nor the stream that has them.
                    Err(err)
                        if matches!(err.kind(), CreateStreamErrorKind::JetStream(e)
                            if e.error_code() == ErrorCode::STREAM_SUBJECT_OVERLAP) =>
                    {
                        let taken = SubjectsTaken::find(&self.js, &self.stream, subjects).await;
                        Err(PublisherError::SubjectsTaken(taken))
                    }
                    Err(err) => Err(request_error(err)),
                }
            }
            Err(err) => Err(request_error(err)),
        }
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

    /// The stream's message count, bytes, last sequence and dedup window, for `status`;
    /// `None` when JetStream answered that the stream does not exist.
    pub async fn stream_info(&self) -> Result<Option<stream::Info>, PublisherError> {
        let mut stream = match self.js.get_stream(&self.stream).await {
            Ok(stream) => stream,
            Err(err) if is_stream_not_found(&err) => return Ok(None),
            Err(err) => return Err(request_error(err)),
        };
        stream.info().await.cloned().map(Some).map_err(request_error)
    }
}

/// Why the stream's last message may be gone by design when pgoutbox next starts, if it
/// may: then the restart skip cannot read where pgoutbox stopped, and only the duplicate
/// window keeps the rows sent again from being stored twice.
fn tail_may_vanish(config: &stream::Config) -> Option<String> {
    let why = if config.retention != stream::RetentionPolicy::Limits {
        format!("its retention is {:?}: consumed messages are removed", config.retention)
    } else if !config.max_age.is_zero() {
        format!("its messages expire after {:?} (max_age)", config.max_age)
    } else if config.max_messages_per_subject > 0 {
        format!("it keeps {} messages per subject", config.max_messages_per_subject)
    } else {
        return None;
    };
    Some(format!(
        "the stream's last message may be gone when pgoutbox restarts, since {why}; a restart \
         then skips nothing by the stream's end and relies on the duplicate window \
         (docs/guarantees.md)"
    ))
}

/// Why a publish was refused for the message itself, if it was: too large for the server
/// (checked by the client before sending) or refused by JetStream with one of
/// [`REFUSED_FOR_ITSELF`] (the API error travels as the source of a `PublishErrorKind::Other`).
/// Such a refusal repeats on every retry, so the row must become a dead letter; any other
/// error (no responders, timeout, lost connection, wrong last sequence) is worth retrying.
pub fn refused_for_itself(err: &PublishError) -> Option<String> {
    match err.kind() {
        PublishErrorKind::MaxPayloadExceeded => {
            Some(format!("the message exceeds the NATS server's max_payload: {err}"))
        }
        PublishErrorKind::Other => {
            let source = std::error::Error::source(err)?;
            let api = source.downcast_ref::<jetstream::Error>()?;
            REFUSED_FOR_ITSELF
                .contains(&api.error_code())
                .then(|| format!("JetStream refused the message: {api}"))
        }
        _ => None,
    }
}

/// The message asked for is not in the stream (deleted, purged, expired).
fn is_no_message(err: &stream::RawMessageError) -> bool {
    match err.kind() {
        stream::RawMessageErrorKind::NoMessageFound => true,
        stream::RawMessageErrorKind::JetStream(api) => {
            api.error_code() == ErrorCode::NO_MESSAGE_FOUND
        }
        _ => false,
    }
}

/// Sorts a failed JetStream request by its kind and API error code, never its words.
/// Without JetStream nothing answers on `$JS.API` (no responders), or the server says
/// JetStream is not enabled (for the account).
fn request_error(err: impl std::error::Error + 'static) -> PublisherError {
    use async_nats::jetstream::context::{RequestError, RequestErrorKind};
    let disabled_code = |code| {
        code == jetstream::ErrorCode::JETSTREAM_NOT_ENABLED
            || code == jetstream::ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(error) = cause {
        let disabled = if let Some(request) = error.downcast_ref::<RequestError>() {
            request.kind() == RequestErrorKind::NoResponders
        } else if let Some(request) = error.downcast_ref::<async_nats::RequestError>() {
            request.kind() == async_nats::RequestErrorKind::NoResponders
        } else if let Some(api) = error.downcast_ref::<jetstream::Error>() {
            disabled_code(api.error_code())
        } else if let Some(get) = error.downcast_ref::<jetstream::context::GetStreamError>() {
            matches!(get.kind(), jetstream::context::GetStreamErrorKind::JetStream(api)
                if disabled_code(api.error_code()))
        } else {
            false
        };
        if disabled {
            return PublisherError::JetStreamDisabled;
        }
        let consumer_limit =
            error.downcast_ref::<jetstream::stream::ConsumerError>().is_some_and(|create| {
                matches!(create.kind(),
                jetstream::stream::ConsumerErrorKind::JetStream(api)
                    if api.error_code() == jetstream::ErrorCode::MAXIMUM_CONSUMERS_LIMIT)
            });
        if consumer_limit {
            return PublisherError::ConsumerLimit;
        }
        cause = error.source();
    }
    if is_final_answer(&err) {
        PublisherError::Request(err.to_string())
    } else {
        PublisherError::Unanswered(err.to_string())
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
    use super::*;

    /// An API error as async-nats parses it from the server's JSON answer.
    fn api(err_code: u64, description: &str) -> jetstream::Error {
        let answer =
            serde_json::json!({"code": 400, "err_code": err_code, "description": description});
        serde_json::from_value(answer).unwrap()
    }

    /// A refused ack as async-nats builds it.
    fn refused_ack(err_code: u64, description: &str) -> PublishError {
        PublishError::with_source(PublishErrorKind::Other, api(err_code, description))
    }

    #[test]
    fn refusals_of_the_message_itself_are_told_apart_by_code() {
        let too_big = refused_ack(10054, "message size exceeds maximum allowed");
        let why = refused_for_itself(&too_big).unwrap();
        assert!(why.contains("10054") && why.contains("message size"), "{why}");
        assert!(refused_for_itself(&refused_ack(10097, "header size exceeds")).is_some());
        let oversized = PublishError::with_source(PublishErrorKind::MaxPayloadExceeded, "x");
        assert!(refused_for_itself(&oversized).unwrap().contains("max_payload"));
        // Worth retrying: the stream's state or the connection, not the message.
        for retryable in [
            refused_ack(10071, "wrong last sequence"),
            refused_ack(10077, "maximum bytes exceeded"),
            PublishError::new(PublishErrorKind::TimedOut),
            PublishError::new(PublishErrorKind::StreamNotFound),
            PublishError::new(PublishErrorKind::BrokenPipe),
            PublishError::new(PublishErrorKind::Other),
        ] {
            assert_eq!(refused_for_itself(&retryable), None, "{retryable}");
        }
    }

    #[test]
    fn start_up_waits_only_for_what_time_mends() {
        use async_nats::jetstream::context::{GetStreamError, GetStreamErrorKind};
        let no_quorum =
            GetStreamError::new(GetStreamErrorKind::JetStream(api(10008, "unavailable")));
        assert!(request_error(no_quorum).is_transient());
        let refused = GetStreamError::new(GetStreamErrorKind::JetStream(api(10003, "bad request")));
        assert!(!request_error(refused).is_transient());
        assert!(!PublisherError::JetStreamDisabled.is_transient());
        assert!(PublisherError::NoLeader("OUTBOX".into()).is_transient());
    }

    #[test]
    fn only_a_missing_message_means_nothing_to_skip_by() {
        use stream::{RawMessageError, RawMessageErrorKind};
        assert!(is_no_message(&RawMessageError::new(RawMessageErrorKind::NoMessageFound)));
        let missing = RawMessageErrorKind::JetStream(api(10037, "no message found"));
        assert!(is_no_message(&RawMessageError::new(missing)));
        let no_quorum = RawMessageErrorKind::JetStream(api(10008, "unavailable"));
        assert!(!is_no_message(&RawMessageError::new(no_quorum)));
        assert!(!is_no_message(&RawMessageError::new(RawMessageErrorKind::Other)));
    }

    #[test]
    fn streams_whose_tail_vanishes_by_design_are_named() {
        let limits = stream::Config::default();
        assert_eq!(tail_may_vanish(&limits), None);
        let work_queue =
            stream::Config { retention: stream::RetentionPolicy::WorkQueue, ..Default::default() };
        assert!(tail_may_vanish(&work_queue).unwrap().contains("WorkQueue"));
        let aging = stream::Config { max_age: Duration::from_secs(3600), ..Default::default() };
        assert!(tail_may_vanish(&aging).unwrap().contains("max_age"));
        let per_subject = stream::Config { max_messages_per_subject: 1, ..Default::default() };
        assert!(tail_may_vanish(&per_subject).unwrap().contains("per subject"));
    }

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
