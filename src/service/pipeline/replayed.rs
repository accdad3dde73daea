//! Rows `pgoutbox replay` handed over through the WAL (`postgres::pgoutput::replayed`), in
//! the pipeline: each a row of its transaction, in its commit-order place, mapped by this
//! pgoutbox's own mapping, marked with its replay's id, and counted on `/metrics` once
//! JetStream acknowledged it.

use std::collections::VecDeque;
use std::sync::Arc;

use tracing::warn;

use super::{Pipeline, lsn};
use crate::domain::outbox::RowMapping;
use crate::domain::progress::Position;
use crate::domain::seed::replay_id_prefix;
use crate::postgres::pgoutput::{DecodingMessage, Relation, ReplayFrame, ReplayedRow};
use crate::service::error::PipelineError;

/// The replayed rows of one attempt.
#[derive(Default)]
pub(super) struct Replays {
    /// The mapping of the relation and replay of the last replayed row.
    mapping: Option<(Relation, String, Arc<RowMapping>)>,
    /// Replayed rows sent and not yet acknowledged, oldest first.
    awaiting: VecDeque<Awaiting>,
    /// A replay's end (its total), decoded while messages were still in flight.
    end: Option<u64>,
}

struct Awaiting {
    position: Position,
    replay_id: String,
    index: u64,
    total: u64,
}

impl Replays {
    /// The replay id of the row at `position`, while it is being published.
    pub(super) fn id_at(&self, position: Position) -> Option<&str> {
        let newest = self.awaiting.back().filter(|row| row.position == position)?;
        Some(&newest.replay_id)
    }

    /// Whether the message at `position` is a replayed row: a duplicate answer then means
    /// the stream's duplicate window still holds its id, not another row with it.
    pub(super) fn is_replayed(&self, position: Position) -> bool {
        self.awaiting.iter().any(|row| row.position == position)
    }

    /// The message at `position` was acknowledged: (index, total) when it is a replayed row.
    pub(super) fn acknowledged(&mut self, position: Position) -> Option<(u64, u64)> {
        // Rows skipped or never sent (the attempt ended) are older than any ack to come.
        while self.awaiting.front().is_some_and(|row| row.position < position) {
            self.awaiting.pop_front();
        }
        let row = self.awaiting.front().filter(|row| row.position == position)?;
        let progress = (row.index, row.total);
        self.awaiting.pop_front();
        Some(progress)
    }

    /// Each replayed row's `Nats-Msg-Id` names its replay (`replay_id_prefix`).
    fn mapping(
        &mut self,
        relation: &Relation,
        replay_id: &str,
        pipeline: &crate::settings::config::PipelineConfig,
    ) -> Arc<RowMapping> {
        if let Some((known, replay, mapping)) = &self.mapping
            && known == relation
            && replay == replay_id
        {
            return Arc::clone(mapping);
        }
        let (roles, template) = (&pipeline.roles, &pipeline.template);
        // A row that lacks a column this pgoutbox maps becomes a dead letter, never lost.
        let mapping = Arc::new(
            RowMapping::new(relation, roles, template)
                .unwrap_or_else(|missing| RowMapping::unusable(relation, roles, &missing))
                .with_id_prefix(replay_id_prefix(replay_id)),
        );
        self.mapping = Some((relation.clone(), replay_id.to_owned(), Arc::clone(&mapping)));
        mapping
    }
}

impl Pipeline<'_> {
    /// A row handed over by `pgoutbox replay`: published in its place like an Insert.
    pub(super) async fn on_replayed(
        &mut self,
        message: DecodingMessage,
    ) -> Result<(), PipelineError> {
        if !message.transactional {
            return Ok(()); // `pgoutbox replay` emits none; one may have rolled back
        }
        let row = match ReplayFrame::decode(&message.content) {
            Ok(ReplayFrame::Row(row)) => row,
            Ok(ReplayFrame::End { total, .. }) => {
                self.replays.end = Some(total);
                self.replay_ended();
                return Ok(());
            }
            Err(err) => {
                warn!(lsn = %lsn(message.lsn), error = %err,
                    "a replayed row that cannot be read was left out: run the replay again \
                     with a pgoutbox replay of this version");
                self.metrics.replayed_rows_unreadable.increment(1);
                return Ok(());
            }
        };
        let position = self.next_position("replayed row outside a transaction")?;
        let mapping = self.replays.mapping(&row.relation, &row.replay_id, self.config);
        let ReplayedRow { replay_id, index, total, tuple, .. } = row;
        self.replays.awaiting.push_back(Awaiting { position, replay_id, index, total });
        self.on_row(mapping, tuple, position, None).await
    }

    /// A replay's end counts once every message sent before it is acknowledged: all its
    /// rows are in the stream then (rows left in `awaiting` were skipped, no ack comes).
    pub(super) fn replay_ended(&mut self) {
        if self.protocol.in_flight() == 0
            && let Some(total) = self.replays.end.take()
        {
            self.replays.awaiting.clear();
            self.replay_progress(total, total);
        }
    }

    /// The replayed rows up to `index` of `total` are in the stream.
    pub(super) fn replay_progress(&mut self, index: u64, total: u64) {
        self.memory.paces.replay_done = index;
        self.metrics.replay_rows.set(total as f64);
        self.metrics.replay_rows_done.set(index as f64);
        self.metrics.replay_rows_left.set(total.saturating_sub(index) as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(index: u32) -> Position {
        Position { commit_lsn: 0x100, index }
    }

    fn awaiting(index: u32) -> Awaiting {
        let (position, replay_id) = (at(index), "r1".to_owned());
        Awaiting { position, replay_id, index: u64::from(index) + 1, total: 10 }
    }

    #[test]
    fn an_ack_counts_its_row_and_passes_the_rows_skipped_before_it() {
        let mut replays = Replays::default();
        replays.awaiting.extend([awaiting(0), awaiting(1), awaiting(2)]);
        assert!(replays.is_replayed(at(2)));
        assert_eq!(replays.acknowledged(at(1)), Some((2, 10)));
        assert!(
            !replays.is_replayed(at(0)),
            "a row skipped before an acknowledged one is forgotten"
        );
        assert_eq!(replays.acknowledged(at(5)), None, "a row that is no replay counts nothing");
        assert!(replays.awaiting.is_empty());
    }

    #[test]
    fn only_the_row_being_sent_is_marked_with_its_replay() {
        let mut replays = Replays::default();
        replays.awaiting.extend([awaiting(0), awaiting(1)]);
        assert_eq!(replays.id_at(at(1)), Some("r1"));
        assert_eq!(replays.id_at(at(0)), None);
        assert_eq!(replays.id_at(at(2)), None);
    }
}
