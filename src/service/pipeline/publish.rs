//! Handing messages to NATS: each one chained to the previous by sequence and kept in
//! flight, a dead letter in a row's place, and what a refusal means for the attempt.

use async_nats::jetstream::context::PublishError;
use tracing::warn;

use super::Pipeline;
use super::window::Resend;
use crate::domain::outbox::{DeadLetter, OutboxEvent, Rejection};
use crate::domain::progress::Position;
use crate::domain::source::SOURCE_HEADER;
use crate::nats::publisher::{EXPECTED_LAST_SEQUENCE_HEADER, POSITION_HEADER, refused_for_itself};
use crate::nats::wire::HeaderBlock;
use crate::service::error::{NatsFailure, PipelineError};

impl Pipeline<'_> {
    /// Publishes a row's dead letter in its place. It was built to fit, so only a transient
    /// error can keep it from being sent; that one is retried like any other.
    pub(super) async fn publish_dead_letter(
        &mut self,
        letter: DeadLetter,
        position: Position,
    ) -> Result<(), PipelineError> {
        let DeadLetter { event, reason, payload_omitted, row_id } = letter;
        warn!(position = %position, id = %event.id, reason = %reason, payload_omitted,
            subject = %event.subject, "row sent to the dead-letter subject");
        let sent = match self.dispatch(event.clone(), position).await {
            Ok(sent) => sent,
            Err(err) => {
                self.unsent_row = true;
                return Err(match refused_for_itself(&err) {
                    Some(why) => PipelineError::DeadLetter(why),
                    None => PipelineError::Nats(NatsFailure::unacknowledged(&err)),
                });
            }
        };
        self.track(sent, position, Resend::Letter(event));
        if payload_omitted && let Some(id) = row_id {
            // Kept before its ack can move `published_up_to` past it.
            self.memory.kept_rows.keep(id);
        }
        self.memory.dead_letters += 1;
        self.metrics.dead_letters.increment(1);
        Ok(())
    }

    /// The error that ends an attempt whose publish at `position` was not acknowledged.
    /// A refusal of the message itself is remembered in [`Memory::refused`], so that the
    /// next attempt publishes the row's dead letter in its place (the slot sends the row
    /// again, since nothing past it was confirmed): the row is retried once, not forever.
    /// Refused again, it was the dead letter that was refused, and pgoutbox stops.
    pub(super) fn refused(&mut self, position: Position, err: &PublishError) -> PipelineError {
        let failure = NatsFailure::unacknowledged(err);
        match refused_for_itself(err) {
            Some(why) if self.memory.refused.get(&position).is_some() => {
                PipelineError::DeadLetter(format!("{why} (position {position})"))
            }
            Some(why) => {
                warn!(position = %position, reason = %why,
                    "JetStream refused the row; its dead letter goes in its place on retry");
                self.memory.refused.insert(position, Rejection(why));
                failure.into()
            }
            None => failure.into(),
        }
    }

    /// Hands one message to JetStream, chained to the previous one by sequence, and returns
    /// its ack and payload size; [`Pipeline::track`] then keeps it in flight.
    pub(super) async fn dispatch(
        &mut self,
        event: OutboxEvent,
        position: Position,
    ) -> Result<(u64, usize), PublishError> {
        let OutboxEvent { subject, headers, payload, .. } = event;
        let bytes = payload.len();
        let (source, expected) = (&self.source_header, self.expected_last_sequence);
        let header_block = |block: &mut HeaderBlock<'_>| {
            block.add_lines(headers.lines());
            block.add_display(POSITION_HEADER, position);
            block.add(SOURCE_HEADER, source);
            block.add_display(EXPECTED_LAST_SEQUENCE_HEADER, expected);
        };
        let token = self.outbound.send(&subject, header_block, &payload)?;
        self.expected_last_sequence += 1;
        Ok((token, bytes))
    }

    /// Keeps a message just dispatched in flight, as one more sent message.
    pub(super) fn track(
        &mut self,
        (token, payload): (u64, usize),
        position: Position,
        resend: Resend,
    ) {
        self.in_flight.push(token, position, payload, resend);
        self.tracker.on_sent();
    }
}
