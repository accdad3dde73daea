//! Handing messages to NATS: a row mapped to its message, each one with the guard
//! `domain::publishing` chains it by and kept in flight, a dead letter in a row's place,
//! and what a refusal means for the attempt.

use std::sync::Arc;

use async_nats::jetstream::context::PublishError;
use tracing::{debug, warn};

use super::{HeldRow, Pipeline, SentRow};
use crate::domain::outbox::{
    DeadLetter, OutboxEvent, Rejection, RowMapping, SCHEDULE_HEADER, held_at,
};
use crate::domain::progress::Position;
use crate::domain::publishing::{
    CHAIN_ANCHOR, CHAIN_HEADER, EXPECTED_LAST_MSG_ID_HEADER, EXPECTED_LAST_SEQUENCE_HEADER, RowStep,
};
use crate::domain::seed::REPLAY_HEADER;
use crate::domain::source::SOURCE_HEADER;
use crate::domain::transaction::{self, Became, InTransaction};
use crate::nats::large_payloads::{self, StoreError};
use crate::nats::publisher::{POSITION_HEADER, refused_for_itself};
use crate::nats::wire::HeaderBlock;
use crate::postgres::pgoutput::ColumnValue;
use crate::service::error::{NatsFailure, NatsFailureKind, PipelineError};
use crate::service::telemetry::{TableCounters, names};
use crate::service::traces;

/// What a message handed to NATS is, for its span.
#[derive(Clone, Copy)]
pub(super) enum Sending<'a> {
    /// A row's own message, mapped by this mapping.
    Row(&'a RowMapping),
    /// A row's dead letter, sent in its place for this reason.
    DeadLetter(&'a str),
    /// A transaction's end message (`--transaction-subject`).
    TransactionEnd,
}

impl Pipeline<'_> {
    /// Whether the writer (`.0`) and the window of unacknowledged messages (`.1`) have room
    /// for another row.
    pub(super) fn room(&self) -> (bool, bool) {
        let most = super::MAX_IN_FLIGHT.min(self.protocol.send_limit());
        (self.outbound.has_room(), self.in_flight.has_room(most, self.config.max_in_flight_bytes))
    }

    /// One row at `position`, to be published, or its dead letter when it cannot be
    /// published as it is (`rejected` says why when that is known before mapping it). In a
    /// transaction it is held, and the row held before it goes out, not the last of it; a
    /// seed's row goes out at once.
    pub(super) async fn on_row(
        &mut self,
        mapping: Arc<RowMapping>,
        tuple: Vec<ColumnValue>,
        position: Position,
        rejected: Option<Rejection>,
    ) -> Result<(), PipelineError> {
        let row = HeldRow { mapping, tuple, position, rejected };
        let Some(transaction) = self.transaction.as_mut() else {
            return self.publish_row(row, None).await.map(|_| ());
        };
        transaction.rows += 1;
        let Some(before) = transaction.held.replace(row) else { return Ok(()) };
        let became = self.publish_row(before, Some(InTransaction::NotLast)).await?;
        if let Some(transaction) = self.transaction.as_mut() {
            transaction.counts.add(became);
        }
        Ok(())
    }

    /// Whether what rows become is counted: only for transactions' ends
    /// (`--transaction-subject`), so that no row is mapped again or hashed for nothing.
    fn counting(&self) -> bool {
        self.config.transaction_subject.is_some()
    }

    /// Publishes one row, or its dead letter, saying its place in its transaction, and
    /// says what it became (for a row the stream held already, what it became then).
    pub(super) async fn publish_row(
        &mut self,
        row: HeldRow,
        in_transaction: Option<InTransaction>,
    ) -> Result<Became, PipelineError> {
        let HeldRow { mapping, tuple, position, rejected } = row;
        let row_id = mapping.row_id(&tuple);
        match self.protocol.on_row(position, row_id.as_deref()) {
            Ok(RowStep::Publish) => {}
            Ok(RowStep::Skip) => {
                let lettered = self
                    .transaction
                    .as_ref()
                    .is_some_and(|transaction| transaction.lettered_before.contains(&position));
                let refused = self.memory.refused.get(&position).is_some() || rejected.is_some();
                let became = match self.counting() {
                    true => became_before(&mapping, &tuple, refused || lettered),
                    false => Became::Event { partition: None },
                };
                if self.memory.objects_lost.remove(&position) {
                    self.store_object_again(&mapping, &tuple, position).await?;
                }
                return Ok(became);
            }
            Err(err) => return Err(self.tail_not_in_wal(err)),
        }
        let sent = match self.memory.refused.get(&position).cloned().or(rejected) {
            Some(refused) => Err(refused),
            None => self.send_row(&mapping, &tuple, position, in_transaction).await?,
        };
        let row = SentRow { mapping, tuple, position, in_transaction };
        let became = match sent {
            Ok(became) => became,
            Err(reason) => {
                self.publish_dead_letter(&row, &reason).await?;
                Became::DeadLetter
            }
        };
        // Kept while it is the newest in flight: a collision answered for it alone puts its
        // dead letter in its place (`Outcome::Collision`). Replacing the last one costs no
        // more than dropping it here would.
        self.last_sent = Some(row);
        Ok(became)
    }

    /// Maps the row and hands its message to NATS, saying what it became. `Err(why)`: it
    /// cannot go as it is (its mapping, the bucket, or JetStream refused it for itself), and
    /// its dead letter goes in its place; `Err` outside: no answer, and the attempt ends.
    async fn send_row(
        &mut self,
        mapping: &RowMapping,
        tuple: &[ColumnValue],
        position: Position,
        in_transaction: Option<InTransaction>,
    ) -> Result<Result<Became, Rejection>, PipelineError> {
        let event = match mapping.map(tuple) {
            Ok(event) => event,
            Err(reason) => return Ok(Err(reason)),
        };
        let became = match event.headers.get(SCHEDULE_HEADER) {
            Some(_) => Became::Scheduled,
            None if !self.counting() => Became::Event { partition: None },
            None => Became::Event { partition: mapping.partition_of(tuple) },
        };
        let event = match self.large_payload(event, position).await? {
            Ok(event) => event,
            Err(refused) => return Ok(Err(refused)),
        };
        let counters = self.counters.of(mapping.counted_as());
        let sending = Sending::Row(mapping);
        match self.dispatch(event, (position, in_transaction), counters, sending) {
            Ok(()) => {
                self.memory.published += 1;
                Ok(Ok(became))
            }
            Err(err) => match refused_for_itself(&err) {
                Some(why) => Ok(Err(Rejection(why))),
                None => {
                    self.unsent_row = Some(position);
                    Err(PipelineError::Nats(NatsFailure::unacknowledged(&err)))
                }
            },
        }
    }

    /// A payload too large for its message (`--object-store`) is stored in the bucket
    /// first, and the message carries the pointer instead (`nats::large_payloads`). `Err`:
    /// the bucket refused it, and the row's dead letter goes in its place; a bucket that did
    /// not answer ends the attempt, and the row is stored again under the same name.
    async fn large_payload(
        &mut self,
        mut event: OutboxEvent,
        position: Position,
    ) -> Result<Result<OutboxEvent, Rejection>, PipelineError> {
        let Some(large) = &self.config.large_payloads else { return Ok(Ok(event)) };
        let fits = self.letter_budget.saturating_sub(self.protocol.guard().header_bytes());
        if !large.takes(event.payload.len(), event.headers.wire_len(), fits) {
            return Ok(Ok(event));
        }
        if let Some(why) = large.refuses(event.payload.len()) {
            return Ok(Err(Rejection(why)));
        }
        let name = large_payloads::object_name(&large.bucket, &event.id, position);
        let js = self.publisher.context();
        match large_payloads::store(js, &large.bucket, &name, &event.payload).await {
            Ok(pointer) => {
                debug!(%position, bucket = %pointer.bucket, object = %pointer.name,
                    size = pointer.size, "payload stored as an object");
                metrics::counter!(names::OBJECTS_STORED).increment(1);
                if let Some(bytes) = large_payloads::bucket_bytes(js, &large.bucket).await {
                    metrics::gauge!(names::OBJECT_STORE_BYTES).set(bytes as f64);
                }
                for (header, value) in pointer.headers() {
                    event.headers.insert(header, &value);
                }
                self.memory.objects_lost.remove(&position);
                self.pointers_sent.push_back((position, pointer));
                event.payload = bytes::Bytes::new();
                Ok(Ok(event))
            }
            Err(refused @ StoreError::Refused { .. }) => Ok(Err(Rejection(refused.to_string()))),
            Err(unanswered) => {
                self.unsent_row = Some(position);
                let why = unanswered.to_string();
                Err(NatsFailure::new(NatsFailureKind::Request, why).into())
            }
        }
    }

    /// The row at `position`, whose message the stream holds, lost its object (a look found
    /// it missing, `pipeline::durability`): stored again under the same name, which the
    /// pointer names. The row's next look vouches for it before anything past it is confirmed.
    async fn store_object_again(
        &mut self,
        mapping: &RowMapping,
        tuple: &[ColumnValue],
        position: Position,
    ) -> Result<(), PipelineError> {
        let (Some(large), Ok(event)) = (&self.config.large_payloads, mapping.map(tuple)) else {
            return Ok(());
        };
        let name = large_payloads::object_name(&large.bucket, &event.id, position);
        let js = self.publisher.context();
        match large_payloads::store(js, &large.bucket, &name, &event.payload).await {
            Ok(_) => {
                // Its pointer waits in `Memory::pointers` for the next look.
                warn!(%position, bucket = %large.bucket, object = %name,
                    "a pointer's object was lost (its chunks, not its message): stored again \
                     from the row");
                Ok(())
            }
            Err(err) => {
                self.memory.objects_lost.insert(position);
                self.unsent_row = Some(position);
                Err(NatsFailure::new(NatsFailureKind::Request, err.to_string()).into())
            }
        }
    }

    /// A row whose id another message has goes as a dead letter named by its position: the
    /// object an earlier attempt may have stored for its payload has no pointer, and goes.
    /// (The table keeps the row, `--retention` included: the letter says so.)
    async fn drop_object_of(&self, mapping: &RowMapping, tuple: &[ColumnValue], at: Position) {
        let Some(large) = &self.config.large_payloads else { return };
        let Ok(event) = mapping.map(tuple) else { return };
        let name = large_payloads::object_name(&large.bucket, &event.id, at);
        if let Err(why) =
            large_payloads::delete(self.publisher.context(), &large.bucket, &name).await
        {
            warn!(bucket = %large.bucket, object = %name, %why,
                "could not delete the object of a row whose id was taken");
        }
    }

    /// Publishes a row's dead letter in its place, for `reason`. It is built to fit, so only
    /// a transient error can keep it from being sent; that one is retried like any other.
    /// A row whose id an older message has gets a letter named by its position.
    pub(super) async fn publish_dead_letter(
        &mut self,
        row: &SentRow,
        reason: &Rejection,
    ) -> Result<(), PipelineError> {
        let SentRow { mapping, tuple, position, in_transaction } = row;
        let (position, in_transaction) = (*position, *in_transaction);
        // The letter's acknowledgement is not a pointer's: a pointer sent for the row (its id
        // collided) has no object to look for.
        self.pointers_sent.retain(|(sent, _)| *sent != position);
        let subject = match mapping.dead_letter_subject() {
            "" => &self.config.defaults.dead_letter_subject,
            own => own,
        };
        // The guard repeats the previous message's id, which may be long.
        let budget = self.letter_budget.saturating_sub(self.protocol.guard().header_bytes());
        let mut letter = mapping.dead_letter(tuple, position, reason, subject, budget);
        if self.memory.ids_taken.contains(&position) {
            self.drop_object_of(mapping, tuple, position).await;
            letter = letter.named_by_position(position);
            if let Some(id) = letter.row_id.clone() {
                // The table holds the only copy of this event: retention keeps it.
                self.memory.kept_rows.keep(mapping.table(), id);
            }
        }
        let DeadLetter { event, reason, payload_omitted, row_id } = letter;
        warn!(position = %position, id = %event.id, reason = %reason, payload_omitted,
            subject = %event.subject, "row sent to the dead-letter subject");
        let counters = self.counters.of(mapping.counted_as());
        let sending = Sending::DeadLetter(&reason);
        let at = (position, in_transaction);
        if let Err(err) = self.dispatch(event, at, Arc::clone(&counters), sending) {
            self.unsent_row = Some(position);
            return Err(match refused_for_itself(&err) {
                Some(why) => PipelineError::DeadLetter(why),
                None => PipelineError::Nats(NatsFailure::unacknowledged(&err)),
            });
        }
        if payload_omitted && let Some(id) = row_id {
            // Kept before its ack can move `published_up_to` past it.
            self.memory.kept_rows.keep(mapping.table(), id);
        }
        self.memory.dead_letters += 1;
        counters.dead_letters.increment(1);
        Ok(())
    }

    /// The error that ends an attempt whose publish at `position` was not acknowledged.
    /// A refusal of the message itself is remembered in [`Memory::refused`], so that the
    /// next attempt publishes the row's dead letter in its place (the slot sends the row
    /// again, since nothing past it was confirmed): the row is retried once, not forever.
    /// Refused again, it was the dead letter that was refused, and pgoutbox stops.
    pub(super) fn refused(&mut self, position: Position, err: &PublishError) -> PipelineError {
        let failure = NatsFailure::unacknowledged(err);
        // The server refuses a publish it does not permit with an `-ERR` alone: no answer
        // comes, and every attempt would wait for it again.
        if let Some(subject) = &self.config.transaction_subject
            && crate::nats::connect::publish_denied(subject)
        {
            return PipelineError::TransactionEnd(format!(
                "Permissions Violation for Publish to {subject}"
            ));
        }
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

    /// Hands one message to JetStream with the guard that chains it to the one sent before
    /// it, and keeps it in flight. pgoutbox's own headers come first: nats-server up to 2.10
    /// reads the first occurrence of a header name anywhere in the block, so a row's header
    /// written before them could shadow a guard.
    /// `at`: the row's position and its place in its transaction; `counters`: those of the
    /// row's table, which count the message at its ack; `sending`: what the message is,
    /// which its span (with traces on) is named by.
    pub(super) fn dispatch(
        &mut self,
        event: OutboxEvent,
        (position, in_transaction): (Position, Option<InTransaction>),
        counters: Arc<TableCounters>,
        sending: Sending<'_>,
    ) -> Result<(), PublishError> {
        let OutboxEvent { id, mut subject, mut headers, payload } = event;
        held_at(&mut subject, &headers, position);
        let mut span = match &mut self.traces {
            None => None,
            Some(traces) => {
                let held = headers.get(SCHEDULE_HEADER).is_some();
                let template = || match sending {
                    Sending::Row(mapping) => mapping.subject_template(held),
                    // One subject per table, or for every transaction: its own template.
                    Sending::DeadLetter(_) | Sending::TransactionEnd => subject.clone(),
                };
                traces.producer(&id, &subject, template, position, &mut headers)
            }
        };
        if let (Some(span), Sending::DeadLetter(reason)) = (&mut span, sending) {
            span.dead_letter(reason);
        }
        let (source, guard) = (&self.source_header, self.protocol.guard());
        let seed = self.prelude.as_ref();
        let replay = self.replays.id_at(position);
        let header_block = |block: &mut HeaderBlock<'_>| {
            block.add_display(EXPECTED_LAST_SEQUENCE_HEADER, guard.last_sequence);
            match guard.last_msg_id {
                None => block.add(CHAIN_HEADER, CHAIN_ANCHOR),
                Some(previous) => block.add(EXPECTED_LAST_MSG_ID_HEADER, previous),
            }
            block.add_display(POSITION_HEADER, position);
            if let Some(in_transaction) = in_transaction {
                block.add(transaction::LAST_HEADER, in_transaction.last());
                if let Some(rows) = in_transaction.rows() {
                    block.add_display(transaction::ROWS_HEADER, rows);
                }
            }
            block.add(SOURCE_HEADER, source);
            if let Some(prelude) = seed.filter(|_| position.commit_lsn == 0) {
                for (name, value) in &prelude.marks {
                    block.add(name, value);
                }
            }
            if let Some(replay) = replay {
                block.add(REPLAY_HEADER, replay);
            }
            block.add_lines(headers.lines());
        };
        let token = match self.outbound.send(&subject, header_block, &payload) {
            Ok(token) => token,
            Err(err) => {
                if let Some(span) = span {
                    traces::not_sent(span, &err);
                }
                return Err(err);
            }
        };
        self.in_flight.push(token, position, payload.len(), span, counters);
        self.protocol.on_sent(id);
        Ok(())
    }
}

/// What a row the stream held already became when it was published: told again from its
/// mapping, or a dead letter when it was refused before, in this process or, read back
/// from its letter, in an earlier one (`letters_stored_before`).
pub(super) fn became_before(mapping: &RowMapping, tuple: &[ColumnValue], refused: bool) -> Became {
    match mapping.map(tuple) {
        Err(_) => Became::DeadLetter,
        Ok(_) if refused => Became::DeadLetter,
        Ok(event) if event.headers.get(SCHEDULE_HEADER).is_some() => Became::Scheduled,
        Ok(_) => Became::Event { partition: mapping.partition_of(tuple) },
    }
}
