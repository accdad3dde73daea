//! What JetStream's answers mean for the attempt: each ack fed to the publish protocol,
//! a duplicate's origin read when the protocol asks, refusals and overdue acks, and the
//! acks a shutdown waits for.

use std::time::Duration;

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use tracing::{debug, info, warn};

use super::{Pipeline, lsn};
use crate::domain::horizon::Stored;
use crate::domain::outbox::{RefusedRows, Rejection};
use crate::domain::progress::Position;
use crate::domain::publishing::{Answer, Outcome};
use crate::domain::source::Source;
use crate::nats::outbound::Ack;
use crate::service::error::{NatsFailure, NatsFailureKind, PipelineError};
use crate::service::traces;

/// How long a shutdown waits for acks of messages already sent.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// JetStream's answer as the publish protocol reads it: an ack by its sequence and flag, a
/// refusal by its API code (kept by async-nats as the error's source).
fn answer_of(ack: &Ack) -> Answer {
    match ack {
        Ok(stored) => Answer::acked(stored.sequence, stored.duplicate),
        Err(err) => {
            let api = std::error::Error::source(err)
                .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>());
            Answer::refused(api.map(|api| api.error_code().0))
        }
    }
}

impl Pipeline<'_> {
    pub(super) async fn on_ack(&mut self, ack: Ack) -> Result<(), PipelineError> {
        let Some(mut done) = self.in_flight.pop_oldest() else {
            // Nothing was in flight: the publishing connection itself ended.
            let err = ack.err().map(|err| err.to_string()).unwrap_or_default();
            return Err(NatsFailure::new(NatsFailureKind::Request, err).into());
        };
        if let Some(span) = done.span.take() {
            traces::acknowledged(span, &ack);
        }
        let answer = answer_of(&ack);
        self.last_ack_at = std::time::Instant::now();
        if ack.is_ok() && self.memory.row_waiting.is_some_and(|row| row <= done.position) {
            self.memory.row_waiting = None;
        }
        let mut outcome = self.protocol.on_answer(answer);
        if let Outcome::CheckDuplicate { sequence } = outcome {
            let same_row = self.on_duplicate(done.position, sequence).await?;
            outcome = self.protocol.on_duplicate_origin(done.position, same_row);
        }
        match outcome {
            Outcome::EndAttempt if self.memory.ids_taken.contains(&done.position) => {
                return Err(NatsFailure::new(
                    NatsFailureKind::Other,
                    format!(
                        "the row at {} has the id of an older message in the stream; its dead \
                         letter goes in its place",
                        done.position
                    ),
                )
                .into());
            }
            Outcome::EndAttempt => {
                return Err(match ack {
                    Err(err) => self.refused(done.position, &err),
                    Ok(_) => NatsFailure::new(
                        NatsFailureKind::Other,
                        "JetStream answered 'duplicate' without a sequence: the row's id is \
                         held by a refused publish until the duplicate window ends \
                         (nats-server 2.10/2.11, replicated stream)",
                    )
                    .into(),
                });
            }
            Outcome::Collision => return self.collided(done.position).await,
            Outcome::Replayed => {
                self.pointer_acknowledged(done.position, None);
                debug!(position = %done.position, "stored by an earlier run; not stored again");
                done.counters.duplicates.increment(1);
            }
            Outcome::CheckDuplicate { .. } => {
                return Err(PipelineError::Protocol("a duplicate's origin was not checked"));
            }
            Outcome::AlreadyInPlace | Outcome::Stored => {
                done.counters.rows_published.increment(1);
                done.counters.bytes_published.increment(done.bytes as u64);
                if let Ok(stored) = &ack {
                    let (sequence, position) = (stored.sequence, done.position);
                    self.memory.stored = Some(Stored { sequence, position });
                    self.memory.acknowledged(position);
                    self.pointer_acknowledged(position, Some(sequence));
                }
            }
        }
        if let Some((index, total)) = self.replays.acknowledged(done.position) {
            self.replay_progress(index, total);
        }
        self.acks_unrecorded += 1;
        self.observe_confirmed();
        Ok(())
    }

    /// Stops taking changes and waits (bounded) for the acks of what was sent. A drain that
    /// cannot finish is an error that ends `run` non-zero: what was not acknowledged was not
    /// confirmed and is published again on the next start, and the exit status says so.
    pub(super) async fn drain(&mut self) -> Result<(), PipelineError> {
        let waiting = self.in_flight.len();
        self.in_flight.wake_on_each_ack(true);
        let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
        while !self.in_flight.is_empty() {
            let left = self.in_flight.len();
            let acked = match tokio::time::timeout_at(deadline, self.in_flight.oldest()).await {
                Ok(ack) => self.on_ack(ack).await,
                Err(_) => Err(NatsFailure::new(
                    NatsFailureKind::Timeout,
                    format!("no ack within {DRAIN_TIMEOUT:?}"),
                )
                .into()),
            };
            if let Err(cause) = acked {
                return Err(PipelineError::DrainIncomplete { left, cause: Box::new(cause) });
            }
        }
        info!(
            drained = waiting,
            confirmed = %lsn(self.protocol.confirmed()),
            "shutdown: drained in-flight messages"
        );
        Ok(())
    }

    /// JetStream answered that an older message, at `sequence`, has the id of the row at
    /// `position`: whether it is this very row (a replay), read from that message's
    /// headers. Another row's is a collision: remembered, so that the next attempt publishes
    /// the row's dead letter in its place, named by position.
    async fn on_duplicate(
        &mut self,
        position: Position,
        sequence: u64,
    ) -> Result<bool, PipelineError> {
        if self.replays.is_replayed(position) {
            // Published again on purpose: the older message is this row, stored before.
            warn!(%position, sequence, "a replayed row's id is still in the stream's duplicate \
                window: JetStream keeps the copy it stored before and not this one");
            return Ok(true);
        }
        let read = self.publisher.origin_of(sequence);
        let origin = match tokio::time::timeout(self.outbound.ack_timeout(), read).await {
            Ok(Ok(origin)) => origin,
            Ok(Err(err)) => {
                let why = format!("reading the message a duplicate points at: {err}");
                return Err(NatsFailure::new(NatsFailureKind::Request, why).into());
            }
            Err(_) => {
                let why = "reading the message a duplicate points at: no answer";
                return Err(NatsFailure::new(NatsFailureKind::Timeout, why).into());
            }
        };
        // A message deleted while its id is in the duplicate window cannot say whose it
        // was. Of a row the stream acknowledged before, it was this row, removed since by
        // its TTL or the stream's limits (a restart within the durability horizon publishes
        // such rows again). Of another, the row goes to the dead-letter subject, where it is
        // seen, rather than being taken as stored.
        let Some(origin) = origin else {
            if self.memory.acknowledged_before(position) {
                debug!(%position, sequence, "stored before and removed by the stream since");
                return Ok(true);
            }
            return Ok(self.collision(position, sequence, "an unknown position (or was deleted)"));
        };
        let same_writer = origin
            .source
            .as_deref()
            .is_none_or(|s| s.parse::<Source>().is_ok_and(|s| s.same_writer(&self.source)));
        let same_row = same_writer && origin.position == Some(position);
        if !same_row {
            let theirs = origin.position.map_or("an unknown position".into(), |p| p.to_string());
            self.collision(position, sequence, &theirs);
        }
        Ok(same_row)
    }

    /// The row at `position` has the id of another's message at `sequence`, written from
    /// `theirs`: remembered, so that its dead letter goes in its place. Returns `false`,
    /// the row's not being the same.
    fn collision(&mut self, position: Position, sequence: u64, theirs: &str) -> bool {
        warn!(%position, sequence, written_at = %theirs,
            "an older message in the stream has this row's id: a collision (a table truncated \
             with its sequence restarted, a restored backup?); the row goes to the dead-letter \
             subject in its place");
        let why = format!(
            "the row's id is taken by the message at stream sequence {sequence}, written from \
             {theirs}"
        );
        self.memory.refused.insert(position, Rejection(why));
        if self.memory.ids_taken.len() >= RefusedRows::CAPACITY {
            self.memory.ids_taken.clear();
        }
        self.memory.ids_taken.insert(position);
        false
    }

    /// The row at `position` collided alone in flight: its dead letter goes in its place now,
    /// with the reason `on_duplicate` remembered, and the attempt goes on.
    async fn collided(&mut self, position: Position) -> Result<(), PipelineError> {
        let row = self.last_sent.take().filter(|row| row.position == position);
        let reason = self.memory.refused.get(&position).cloned();
        let (Some(row), Some(reason)) = (row, reason) else {
            return Err(PipelineError::Protocol("a collision's row was not kept"));
        };
        self.memory.published = self.memory.published.saturating_sub(1);
        self.publish_dead_letter(&row, &reason).await?;
        // Counted as what it would have become: its transaction's end is still to go out
        // (it would be in flight behind it, and the row not alone).
        if let Some(transaction) =
            self.transaction.as_mut().filter(|t| t.commit_lsn == position.commit_lsn)
        {
            let was = super::publish::became_before(&row.mapping, &row.tuple, false);
            transaction.counts.became_dead_letter(was);
        }
        self.last_sent = Some(row);
        Ok(())
    }

    /// A refusal of the newest ack (see [`Window::refused_newest`]) or an ack overdue for
    /// the oldest ends the attempt within a tick.
    pub(super) fn check_acks(&mut self) -> Result<(), PipelineError> {
        if let Some((position, err)) = self.in_flight.refused_newest() {
            return Err(self.refused(position, &err));
        }
        match self.in_flight.overdue(self.outbound.ack_timeout()) {
            Some(position) => {
                Err(self.refused(position, &PublishError::new(PublishErrorKind::TimedOut)))
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nats::outbound::ack_of;

    fn answer(reply: &str) -> Answer {
        answer_of(&ack_of(None, reply.as_bytes()))
    }

    #[test]
    fn acks_and_refusals_read_as_the_protocol_needs() {
        assert_eq!(answer(r#"{"stream":"S","seq":7}"#), Answer::Stored { sequence: 7 });
        let duplicate = r#"{"stream":"S","seq":7,"duplicate":true}"#;
        assert_eq!(answer(duplicate), Answer::Duplicate { sequence: 7 });
        let wrong =
            r#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"}}"#;
        assert_eq!(answer(wrong), Answer::NotStored);
        assert_eq!(answer("-ERR"), Answer::NotStored);
    }

    /// nats-server 2.10 answers a staged id "duplicate, sequence 0", 2.11 and 2.12 with
    /// 10158: both are the id held by a refused publish, not a lost answer.
    #[test]
    fn a_staged_id_reads_as_staged_on_every_version() {
        assert_eq!(answer(r#"{"stream":"S","seq":0,"duplicate":true}"#), Answer::Staged);
        let in_process = r#"{"error":{"code":400,"err_code":10158,"description":"duplicate message id is in process"}}"#;
        assert_eq!(answer(in_process), Answer::Staged);
    }
}
