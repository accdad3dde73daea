//! What the slot sends, taken one message at a time: keepalives answered, each pgoutput
//! message of a transaction handed to the part of the pipeline that owns it (a row to
//! `publish.rs`, a replay's hand-over to `replayed.rs`, an emitted event to `emitted.rs`,
//! the commit to the publish protocol).

use bytes::Bytes;

use super::Pipeline;
use super::replayed::Replays;
use super::tables::Described;
use super::transaction_end::Transaction;
use crate::domain::progress::{Position, Timing};
use crate::postgres::ReplicationMessage;
use crate::postgres::pgoutput::{Insert, LogicalMessage};
use crate::postgres::wire::pg_now_micros;
use crate::service::error::PipelineError;

impl Pipeline<'_> {
    pub(super) async fn on_message(
        &mut self,
        message: ReplicationMessage,
    ) -> Result<(), PipelineError> {
        match message {
            ReplicationMessage::XLogData { data, wal_end, .. } => {
                self.server_wal_end = self.server_wal_end.max(wal_end);
                self.on_wal(data).await
            }
            ReplicationMessage::Keepalive { wal_end, reply_requested } => {
                self.server_wal_end = self.server_wal_end.max(wal_end);
                if self.transaction.is_none() {
                    let passed = self.protocol.on_keepalive(wal_end);
                    passed.map_err(|err| self.tail_not_in_wal(err))?;
                }
                if reply_requested {
                    self.send_status(false).await?;
                }
                Ok(())
            }
        }
    }

    async fn on_wal(&mut self, data: Bytes) -> Result<(), PipelineError> {
        match LogicalMessage::parse(&data)? {
            LogicalMessage::Begin(begin) => {
                if self.transaction.is_some() {
                    return Err(PipelineError::Protocol("Begin inside a transaction"));
                }
                let commit_lsn = begin.final_lsn;
                let lettered_before = self.letters_stored_before(&begin).await?;
                self.transaction =
                    Some(Transaction { commit_lsn, lettered_before, ..Transaction::default() });
                if let Some(traces) = &mut self.traces {
                    traces.begin();
                }
            }
            LogicalMessage::Commit(commit) => {
                let Some(transaction) = self.transaction.take() else {
                    return Err(PipelineError::Protocol("Commit outside a transaction"));
                };
                self.publish_last_and_end(transaction).await?;
                let timing = Timing { committed: commit.commit_time, received: pg_now_micros() };
                let committed = self.protocol.on_commit(commit.end_lsn, timing);
                committed.map_err(|err| self.tail_not_in_wal(err))?;
                if let Some(traces) = &mut self.traces {
                    traces.commit(commit.end_lsn);
                }
                self.metrics.transactions.increment(1);
                self.observe_confirmed();
            }
            LogicalMessage::Relation(relation)
                if Replays::is_replay_relation(
                    &relation,
                    self.tables.first(),
                    &self.config.replay_table,
                ) =>
            {
                self.replays.describe(relation);
            }
            LogicalMessage::Relation(relation) => {
                self.replays.outbox_described(&relation);
                self.tables.describe(&relation)?;
            }
            LogicalMessage::Insert(insert) => self.on_insert(insert).await?,
            LogicalMessage::Message(message) => self.on_emitted(message).await?,
            LogicalMessage::Origin(_)
            | LogicalMessage::Type(_)
            | LogicalMessage::Update { .. }
            | LogicalMessage::Delete { .. }
            | LogicalMessage::Truncate(_) => {}
        }
        Ok(())
    }

    async fn on_insert(&mut self, insert: Insert) -> Result<(), PipelineError> {
        if self.replays.is_replay_table(insert.rel_id) {
            return self.on_replayed(insert.tuple).await;
        }
        let position = self.next_position("Insert outside a transaction")?;
        let mapping = match self.tables.mapping(insert.rel_id) {
            Described::Ours(mapping) => mapping,
            Described::Other => return Ok(()), // another table in the publication
            Described::Never => {
                return Err(PipelineError::Protocol("Insert for a relation never described"));
            }
        };
        self.on_row(mapping, insert.tuple, position, None).await
    }

    /// The position of the next row of the current transaction.
    pub(super) fn next_position(
        &mut self,
        outside: &'static str,
    ) -> Result<Position, PipelineError> {
        let Some(transaction) = self.transaction.as_mut() else {
            return Err(PipelineError::Protocol(outside));
        };
        let position =
            Position { commit_lsn: transaction.commit_lsn, index: transaction.next_index };
        transaction.next_index += 1;
        Ok(position)
    }
}
