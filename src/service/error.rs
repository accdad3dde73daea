//! The pipeline's error, split by what the caller must do about it.

use tokio_postgres::error::SqlState;

use crate::postgres::pgoutput::DecodeError;
use crate::postgres::{ConnectionError, ServerError};

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Postgres went away or the walsender ended: reconnect and resume from the slot.
    #[error(transparent)]
    Postgres(#[from] ConnectionError),
    /// NATS did not acknowledge (timeout, lost connection, refused as out of order):
    /// reconnect and resume from the slot and the stream's tail.
    #[error("NATS: {0}")]
    Nats(String),
    /// Another connection streams from the slot; wait and try again (hot standby).
    #[error("replication slot {slot} is in use by another process")]
    SlotBusy { slot: String },
    #[error(
        "replication slot {slot} does not exist; it was dropped after pgoutbox set it up. \
             Events committed since may be lost. See docs/operations.md (slot lost) and run \
             `pgoutbox setup --recreate-slot` once you have decided how to recover"
    )]
    SlotMissing { slot: String },
    #[error(
        "replication slot {slot} was invalidated by Postgres ({detail}); the WAL it needed \
             is gone and events may be lost. See docs/operations.md (slot lost) and run \
             `pgoutbox setup --recreate-slot` once you have decided how to recover"
    )]
    SlotInvalidated { slot: String, detail: String },
    #[error(
        "stream {stream} is written by another pgoutbox source ({writer}: system id/database/slot), \
         and one stream takes one source; give this one a stream and subjects of its own, e.g. \
         --stream {stream}_{database_token} --subject-template 'outbox_{database_token}.{{aggregate_type}}.{{event_type}}' \
         --dead-letter-subject outbox_{database_token}.dead_letter; or, only if that source is \
         stopped for good (this database restored into a new cluster), take the stream over \
         with --recreate-slot (see docs/guarantees.md, one writer per stream)"
    )]
    StreamClaimed { stream: String, writer: String, database_token: String },
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
}

impl PipelineError {
    /// The refusal to write a stream that another source writes; `database` names ours.
    pub fn stream_claimed(stream: &str, writer: String, database: &str) -> Self {
        let database_token: String = database
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
            .collect();
        Self::StreamClaimed { stream: stream.to_owned(), writer, database_token }
    }

    /// Whether reconnecting may help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Postgres(_) | Self::Nats(_) | Self::SlotBusy { .. })
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
