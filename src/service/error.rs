//! The pipeline's error, split by what the caller must do about it.

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use tokio_postgres::error::SqlState;

use crate::domain::retry::Failure;
use crate::postgres::pgoutput::DecodeError;
use crate::postgres::{ConnectionError, ServerError};

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Postgres went away or the walsender ended: reconnect and resume from the slot.
    #[error(transparent)]
    Postgres(#[from] ConnectionError),
    /// NATS did not acknowledge (timeout, lost connection, refused as out of order) or did
    /// not answer: reconnect and resume from the slot and the stream's tail.
    #[error("NATS: {0}")]
    Nats(#[from] NatsFailure),
    /// Another connection streams from the slot; wait and try again (hot standby).
    #[error("replication slot {slot} is in use by another process")]
    SlotBusy { slot: String },
    /// The server is a standby, or one being promoted: nothing about the slot can be
    /// judged until it accepts writes (a missing slot there is no dropped slot).
    #[error(
        "Postgres is in recovery (a standby, or a standby being promoted); waiting until it \
         accepts writes before using slot {slot}"
    )]
    InRecovery { slot: String },
    #[error(
        "replication slot {slot} does not exist; it was dropped after pgoutbox set it up, and \
             events committed since were not streamed. Run `pgoutbox run --recover` to publish \
             them from the table and go on, or `--recreate-slot` to go on without them (see \
             docs/runbooks/slot-lost.md)"
    )]
    SlotMissing { slot: String },
    #[error(
        "replication slot {slot} was invalidated by Postgres: {detail}; events committed \
             since were not streamed. Run `pgoutbox run --recover` to publish them from the \
             table and go on, or `--recreate-slot` to go on without them (see \
             docs/runbooks/slot-lost.md)"
    )]
    SlotInvalidated { slot: String, detail: String },
    #[error(
        "stream {stream} is written by another pgoutbox source ({writer}: system id/database/slot), \
         and one stream takes one source; give this one a stream and subjects of its own, e.g. \
         --stream {stream}_{database_token} --subject-template 'outbox_{database_token}.{{aggregate_type}}.{{event_type}}' \
         --dead-letter-subject outbox_{database_token}.dead_letter; or, only if that source is \
         stopped for good (this database restored into a new cluster), take the stream over \
         with --recreate-slot (see docs/guarantees.md#one-source-per-stream). Meanwhile slot \
         {slot} keeps this database's rows and holds their WAL: drop it with `pgoutbox teardown` \
         if this database should not stream at all"
    )]
    StreamClaimed { stream: String, writer: String, database_token: String, slot: String },
    #[error("the pgoutput stream could not be decoded: {0}")]
    Decode(#[from] DecodeError),
    #[error("the pgoutput stream broke protocol: {0}")]
    Protocol(&'static str),
    #[error(transparent)]
    Mapping(#[from] crate::domain::outbox::MappingError),
    #[error(
        "shutdown: {left} messages were left unacknowledged ({cause}); they were not confirmed \
         and will be published again on the next start"
    )]
    DrainIncomplete { left: usize, cause: Box<PipelineError> },
    #[error("a row could not be published and neither could its dead letter: {0}")]
    DeadLetter(String),
    #[error(
        "JetStream refused a transaction's end message (--transaction-subject): {0}; let \
         pgoutbox's NATS user publish on that subject, or drop --transaction-subject"
    )]
    TransactionEnd(String),
    /// The outbox table or its publication changed: nothing more can be streamed as set up.
    #[error(transparent)]
    TableDrift(#[from] crate::postgres::outbox_table::TableDrift),
    /// The stream's tail was written from another history of this database: start again
    /// without skipping by it.
    #[error(transparent)]
    TailNotInWal(#[from] crate::domain::publishing::TailNotInWal),
    /// Seeding the stream from the table (`--recover`, `--backfill`) failed. Its words are
    /// in the message, so it is not also a source (printed twice with `{:#}`).
    #[error("seeding the stream from the table: {0}")]
    Seed(crate::service::seed::SeedError),
}

impl From<crate::service::seed::SeedError> for PipelineError {
    fn from(err: crate::service::seed::SeedError) -> PipelineError {
        PipelineError::Seed(err)
    }
}

impl PipelineError {
    /// The refusal to write a stream that another source writes; `database` names ours.
    pub fn stream_claimed(stream: &str, writer: String, database: &str, slot: &str) -> Self {
        let database_token: String = database
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
            .collect();
        Self::StreamClaimed {
            stream: stream.to_owned(),
            writer,
            database_token,
            slot: slot.to_owned(),
        }
    }

    /// A slot Postgres invalidated, said in words from its `invalidation_reason` (17+);
    /// before 17 only `wal_status = lost` tells, and WAL removal is the only cause.
    pub fn slot_invalidated(slot: &str, reason: Option<&str>) -> Self {
        let detail = match reason {
            None | Some("wal_removed") => {
                "the WAL it needed was removed (max_slot_wal_keep_size, wal_status = lost)".into()
            }
            Some("rows_removed") => {
                "catalog rows it needed were vacuumed away (rows_removed)".into()
            }
            Some("wal_level_insufficient") => {
                "wal_level on the primary is below logical (wal_level_insufficient)".into()
            }
            Some("idle_timeout") => {
                "it was idle longer than idle_replication_slot_timeout (idle_timeout)".into()
            }
            Some(other) => format!("invalidation_reason = {other}"),
        };
        Self::SlotInvalidated { slot: slot.to_owned(), detail }
    }

    /// What this failure means for the next attempt (`domain::retry::RetryPolicy`).
    pub fn failure(&self) -> Failure {
        match self {
            Self::SlotBusy { .. } => Failure::SlotBusy,
            Self::InRecovery { .. } => Failure::Recovery,
            Self::Nats(_) => Failure::Nats,
            Self::Postgres(_) | Self::TailNotInWal(_) => Failure::Postgres,
            Self::Seed(seed) => seed.failure(),
            _ => Failure::Fatal,
        }
    }

    /// Sorts a server error raised by START_REPLICATION by its SQLSTATE. An invalidated
    /// slot is told by `wal_status` before START_REPLICATION (run.rs), never by the
    /// message's words; one invalidated in between fails here as a retryable error and is
    /// told on the next attempt.
    pub fn from_start_replication(slot: &str, err: ConnectionError) -> Self {
        let code = match &err {
            ConnectionError::Server(ServerError { code, .. }) => SqlState::from_code(code),
            _ => return Self::Postgres(err),
        };
        if code == SqlState::UNDEFINED_OBJECT {
            Self::SlotMissing { slot: slot.to_owned() }
        } else if code == SqlState::OBJECT_IN_USE {
            Self::SlotBusy { slot: slot.to_owned() }
        } else {
            Self::Postgres(err)
        }
    }
}

/// What went wrong with NATS, with the kind that `pgoutbox_publish_errors_total{kind}` and
/// the retry policy read; the detail is for people.
#[derive(Debug, thiserror::Error)]
#[error("{detail}")]
pub struct NatsFailure {
    pub kind: NatsFailureKind,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatsFailureKind {
    /// An ack did not come within the ack timeout.
    Timeout,
    /// Nothing answers for the stream: a leader election, quorum lost, or the stream deleted.
    NoLeader,
    /// Refused by `Nats-Expected-Last-Sequence`: a message before it was lost.
    OutOfOrder,
    /// The connection was lost with acks awaited on it.
    Connection,
    /// Another refusal of a publish.
    Other,
    /// A request that is not a publish (the stream's tail, its claim) failed, or the
    /// connection was lost with nothing in flight: not a publish error.
    Request,
}

impl NatsFailureKind {
    pub const ALL: [NatsFailureKind; 6] = [
        Self::Timeout,
        Self::NoLeader,
        Self::OutOfOrder,
        Self::Connection,
        Self::Other,
        Self::Request,
    ];

    /// The `kind` label of `pgoutbox_publish_errors_total`, for publish errors.
    pub fn publish_error_label(self) -> Option<&'static str> {
        match self {
            Self::Timeout => Some("timeout"),
            Self::NoLeader => Some("no_leader"),
            Self::OutOfOrder => Some("out_of_order"),
            Self::Connection => Some("connection"),
            Self::Other => Some("other"),
            Self::Request => None,
        }
    }
}

impl NatsFailure {
    pub fn new(kind: NatsFailureKind, detail: impl Into<String>) -> Self {
        NatsFailure { kind, detail: detail.into() }
    }

    /// Why a publish was not acknowledged, in the words an operator needs.
    pub fn unacknowledged(err: &PublishError) -> Self {
        let kind = match err.kind() {
            PublishErrorKind::TimedOut => NatsFailureKind::Timeout,
            PublishErrorKind::StreamNotFound => NatsFailureKind::NoLeader,
            PublishErrorKind::WrongLastSequence | PublishErrorKind::WrongLastMessageId => {
                NatsFailureKind::OutOfOrder
            }
            PublishErrorKind::BrokenPipe => NatsFailureKind::Connection,
            _ => NatsFailureKind::Other,
        };
        let detail = match kind {
            // Nothing subscribes to the subject: on a cluster, the stream has no leader yet.
            NatsFailureKind::NoLeader => "publish not acknowledged: no JetStream server \
                answers for the stream (a leader election under way, quorum lost, or the \
                stream was deleted)"
                .to_owned(),
            _ => format!("publish not acknowledged: {err}"),
        };
        NatsFailure { kind, detail }
    }
}

#[cfg(test)]
mod tests {
    use super::PipelineError;

    #[test]
    fn an_invalidated_slot_names_the_reason_postgres_gave() {
        let said = |reason| PipelineError::slot_invalidated("s", reason).to_string();
        assert!(said(None).contains("WAL it needed was removed"), "{}", said(None));
        assert!(said(Some("wal_removed")).contains("WAL it needed was removed"));
        let vacuumed = said(Some("rows_removed"));
        assert!(vacuumed.contains("vacuumed") && !vacuumed.contains("WAL it needed"));
        assert!(said(Some("idle_timeout")).contains("idle_replication_slot_timeout"));
        assert!(said(Some("something_new")).contains("invalidation_reason = something_new"));
    }
}
