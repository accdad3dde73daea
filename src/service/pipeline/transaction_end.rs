//! The transaction being decoded, its last row and its end message (`--transaction-subject`):
//! after its last row, in its place in the stream, chained and skipped like a row at the
//! position after that row's, so that a restart publishes it once, whichever message the
//! stream ended with.

use std::collections::HashSet;

use super::{HeldRow, Pipeline, lsn};
use crate::domain::outbox::{Headers, MESSAGE_ID_HEADER, OutboxEvent};
use crate::domain::progress::Position;
use crate::domain::publishing::RowStep;
use crate::domain::transaction::{Counts, END_HEADER, InTransaction};
use crate::nats::publisher::refused_for_itself;
use crate::postgres::pgoutput::Begin;
use crate::postgres::wire::PG_EPOCH_OFFSET_MICROS;
use crate::service::error::{NatsFailure, NatsFailureKind, PipelineError};

use super::publish::Sending;

/// The transaction being decoded.
#[derive(Default)]
pub(super) struct Transaction {
    pub(super) commit_lsn: u64,
    pub(super) next_index: u32,
    /// Rows of ours decoded so far: each is one message of the transaction in the stream.
    pub(super) rows: u32,
    /// The newest of them, held until the next one or the Commit.
    pub(super) held: Option<HeldRow>,
    /// What its rows became, for its end message (`--transaction-subject`).
    pub(super) counts: Counts,
    /// The positions of its rows that the stream held as dead letters when this attempt
    /// began in the middle of it: skipped, they are counted as what they became.
    pub(super) lettered_before: std::collections::HashSet<Position>,
}

/// What `/metrics` counts end messages under: the `table` label.
const END_LABEL: &str = "(transactions)";

/// How long before a transaction's commit time its dead letters are looked for: the
/// stream's clock is not Postgres's.
const CLOCKS_APART: f64 = 300.0;

impl Pipeline<'_> {
    /// At the Begin of the transaction the stream's tail is in (`--transaction-subject`):
    /// the positions of its rows stored as dead letters, read back, so that its end counts
    /// the rows this attempt skips as what they became. A row JetStream or the bucket
    /// refused for itself in an earlier process would be taken for an event by its mapping.
    pub(super) async fn letters_stored_before(
        &self,
        begin: &Begin,
    ) -> Result<HashSet<Position>, PipelineError> {
        if self.config.transaction_subject.is_none()
            || !self.protocol.skips_part_of(begin.final_lsn)
        {
            return Ok(HashSet::new());
        }
        let subjects = self.config.dead_letter_subjects();
        let committed = (begin.commit_time + PG_EPOCH_OFFSET_MICROS) as f64 / 1e6;
        let transaction = (self.source_header.as_str(), begin.final_lsn);
        let read =
            self.publisher.letters_of_transaction(&subjects, committed - CLOCKS_APART, transaction);
        read.await.map_err(|err| {
            let why =
                format!("reading the dead letters of the transaction at the stream's tail: {err}");
            NatsFailure::new(NatsFailureKind::Request, why).into()
        })
    }

    /// At a Commit: the transaction's held row goes out as its last, then its end.
    pub(super) async fn publish_last_and_end(
        &mut self,
        mut transaction: Transaction,
    ) -> Result<(), PipelineError> {
        let Some(last) = transaction.held.take() else { return Ok(()) };
        let rows = transaction.rows;
        let became = self.publish_row(last, Some(InTransaction::Last { rows })).await?;
        transaction.counts.add(became);
        self.publish_end(&transaction).await
    }

    /// Publishes the end of `transaction`, whose rows have all gone out, when
    /// `--transaction-subject` is set.
    pub(super) async fn publish_end(
        &mut self,
        transaction: &Transaction,
    ) -> Result<(), PipelineError> {
        let Some(subject) = &self.config.transaction_subject else { return Ok(()) };
        let position =
            Position { commit_lsn: transaction.commit_lsn, index: transaction.next_index };
        let commit_lsn = lsn(transaction.commit_lsn).to_string();
        let (id, body) = transaction.counts.end_message(&self.source_header, &commit_lsn);
        match self.protocol.on_row(position, Some(&id)) {
            Ok(RowStep::Publish) => {}
            Ok(RowStep::Skip) => return Ok(()),
            Err(err) => return Err(self.tail_not_in_wal(err)),
        }
        let mut headers = Headers::with_capacity(64 + id.len());
        headers.insert(MESSAGE_ID_HEADER, &id);
        headers.insert(END_HEADER, &commit_lsn);
        let event = OutboxEvent { id, subject: subject.clone(), headers, payload: body.into() };
        let counters = self.counters.of(END_LABEL);
        match self.dispatch(event, (position, None), counters, Sending::TransactionEnd) {
            Ok(()) => Ok(()),
            Err(err) => {
                self.unsent_row = Some(position);
                Err(match refused_for_itself(&err) {
                    Some(why) => PipelineError::TransactionEnd(why),
                    None => PipelineError::Nats(NatsFailure::unacknowledged(&err)),
                })
            }
        }
    }
}
