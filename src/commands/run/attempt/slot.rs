//! Where an attempt starts: what the stream's tail lets it skip, and the slot's state.

use tracing::{info, warn};

use crate::domain::source::{Source, TailRow, TailVerdict, judge_tail, parse_timeline_history};
use crate::nats::publisher::StreamTail;
use crate::postgres::ReplicationConnection;
use crate::postgres::admin::WalStatus;
use crate::service::error::PipelineError;
use crate::service::pipeline::Memory;
use crate::settings::config::Config;

/// What the stream's last message lets this attempt skip of what the slot sends again:
/// `None` when it is not this source's row in this server's WAL, or while seeding.
pub(super) async fn what_the_tail_skips(
    conn: &mut ReplicationConnection,
    config: &Config,
    source: &Source,
    wal_end: u64,
    tail: &StreamTail,
    memory: &Memory,
) -> Result<Option<TailRow>, PipelineError> {
    let history = match tail.origin.source.as_deref().and_then(|s| s.parse::<Source>().ok()) {
        Some(theirs) if theirs.timeline < source.timeline => {
            parse_timeline_history(&conn.timeline_history(source.timeline).await?)
        }
        _ => Vec::new(),
    };
    let skip_through = match judge_tail(source, wal_end, &history, &tail.origin) {
        // A seed starts before every row the slot sends: nothing to skip.
        _ if memory.seed.is_some() => None,
        TailVerdict::SkipThrough(row) if memory.tail_not_in_wal.as_ref() == Some(&row) => {
            warn!(stream = %config.stream, tail = %row,
                "the stream's last message is not in this server's WAL; nothing is skipped");
            None
        }
        TailVerdict::SkipThrough(row) => Some(row),
        TailVerdict::NothingToSkip(why) => {
            if let Some(why) = why {
                warn!(stream = %config.stream, "{why}");
            }
            None
        }
        // The claim is ours, so the tail is the previous source's, from before the
        // operator moved the stream to this one (`--recreate-slot`).
        TailVerdict::OtherWriter(theirs) => {
            warn!(stream = %config.stream, previous = %theirs,
                "the stream's last message is another source's; nothing is skipped");
            None
        }
    };
    Ok(skip_through)
}

/// The slot as the attempt finds it: where it resumes, and whether it is a failover slot.
pub(super) struct SlotStart {
    /// Its confirmed position, where replication starts.
    pub start: u64,
    /// `failover` (17+; `None` before).
    pub failover: Option<bool>,
}

impl SlotStart {
    /// Reads the slot; a missing or invalidated one ends the attempt.
    pub async fn read(
        conn: &mut ReplicationConnection,
        slot: &str,
    ) -> Result<SlotStart, PipelineError> {
        let rows = conn
            .simple_query(&format!(
                "SELECT confirmed_flush_lsn::pg_catalog.text, wal_status, active, \
                        pg_catalog.to_jsonb(s) ->> 'failover', \
                        pg_catalog.to_jsonb(s) ->> 'invalidation_reason' \
                 FROM pg_catalog.pg_replication_slots s \
                 WHERE slot_name = {}",
                postgres_protocol::escape::escape_literal(slot)
            ))
            .await?;
        let Some(row) = rows.first() else {
            return Err(PipelineError::SlotMissing { slot: slot.to_owned() });
        };
        let reason = row.get(4).and_then(Option::as_deref);
        if row.get(1).and_then(Option::as_deref).and_then(WalStatus::parse) == Some(WalStatus::Lost)
            || reason.is_some()
        {
            return Err(PipelineError::slot_invalidated(slot, reason));
        }
        let start = row
            .first()
            .and_then(Option::as_deref)
            .and_then(|lsn| lsn.parse::<tokio_postgres::types::PgLsn>().ok())
            .map(u64::from)
            .unwrap_or(0);
        let failover = match row.get(3).and_then(Option::as_deref) {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => None,
        };
        Ok(SlotStart { start, failover })
    }
}

/// `--failover` on an existing slot made without it (17+; refused below that at setup).
pub(super) async fn turn_failover_on(
    conn: &mut ReplicationConnection,
    slot: &str,
) -> Result<(), PipelineError> {
    conn.simple_query(&format!(
        "ALTER_REPLICATION_SLOT {} ( FAILOVER true )",
        postgres_protocol::escape::escape_identifier(slot)
    ))
    .await
    .map_err(|err| PipelineError::from_start_replication(slot, err))?;
    info!(%slot, "failover turned on for the existing slot");
    Ok(())
}
