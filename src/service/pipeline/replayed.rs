//! Rows `pgoutbox replay` handed over through the replay table
//! (`postgres::outbox_table::replay_table`), in the pipeline: each a row of its
//! transaction, in its commit-order place, mapped by this pgoutbox's own mapping, marked
//! with its replay's id, and counted on `/metrics` once JetStream acknowledged it. And the
//! rows an adoption handed over the same way (`postgres::adoption`): published as their
//! table's Inserts, under their own ids.
//!
//! Who may hand pgoutbox a row is decided by PostgreSQL: only an Insert into the replay
//! table (matched by OID, as the outbox table is), which only roles granted INSERT on it
//! can write, carries one; and its frame must describe one of the outbox tables as pgoutbox
//! knows it (the table of that OID, with its schema, name and columns): the row is then
//! mapped by that table's settings. One replay table serves every table (the first's). A
//! frame that cannot be read or describes another relation becomes a dead letter saying
//! so: never dropped, never published on a subject of its own choosing.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use tracing::warn;

use super::Pipeline;
use crate::domain::outbox::{RowMapping, TableEntry, TableName};
use crate::domain::progress::Position;
use crate::domain::row::bytea_text;
use crate::domain::seed::replay_id_prefix;
use crate::postgres::pgoutput::{ColumnValue, Relation, ReplayFrame, ReplayedRows};
use crate::service::error::PipelineError;

/// The replayed rows of one attempt.
#[derive(Default)]
pub(super) struct Replays {
    /// The replay table as pgoutput last described it.
    table: Option<ReplayTable>,
    /// Each relation's columns as pgoutput last described them, by OID: an outbox table's
    /// are newer than the catalog's at the attempt's start when the table changed since.
    described_columns: HashMap<u32, Vec<String>>,
    /// The mapping of the relation of the last replayed rows, without its id prefix.
    mapping: Option<(Relation, Arc<RowMapping>)>,
    /// Replayed rows sent and not yet acknowledged, oldest first.
    awaiting: VecDeque<Awaiting>,
    /// A replay's end (its total), decoded while messages were still in flight.
    end: Option<u64>,
}

struct ReplayTable {
    relation: Relation,
    slot: Option<usize>,
    frame: Option<usize>,
}

struct Awaiting {
    position: Position,
    replay_id: String,
    index: u64,
    total: u64,
}

/// What one row of the replay table hands over.
enum Handed {
    /// A row of another slot's pgoutbox (one replay table serves every slot of the table).
    NotOurs,
    Rows(ReplayedRows),
    /// The rows already in a table an adoption added to the publication.
    Adopted(ReplayedRows),
    End(u64),
    /// Why it cannot be published.
    Refused(String),
}

impl Replays {
    /// Whether `relation` is the replay table `replay` (`PipelineConfig::replay_table`): by
    /// OID, as the catalog had it at the attempt's start beside the first table, or by the
    /// name pgoutput gives it (added to the publication since, or with patterns alone).
    /// Only a table in the publication is described at all, and only its owner may add it.
    pub(super) fn is_replay_relation(
        relation: &Relation,
        first: Option<(&TableEntry, &crate::postgres::outbox_table::OutboxTable)>,
        replay: &TableName,
    ) -> bool {
        let by_oid = first.is_some_and(|(_, t)| t.replay == Some(relation.rel_id));
        by_oid || (relation.namespace == replay.schema && relation.name == replay.name)
    }

    /// The replay table as pgoutput describes it now.
    pub(super) fn describe(&mut self, relation: Relation) {
        let find = |name: &str| relation.columns.iter().position(|c| c.name == name);
        let (slot, frame) = (find("slot"), find("frame"));
        self.table = Some(ReplayTable { relation, slot, frame });
    }

    /// A relation's columns, as pgoutput described it (a few per attempt).
    pub(super) fn outbox_described(&mut self, relation: &Relation) {
        let columns = relation.columns.iter().map(|c| c.name.clone()).collect();
        self.described_columns.insert(relation.rel_id, columns);
    }

    pub(super) fn is_replay_table(&self, rel_id: u32) -> bool {
        self.table.as_ref().is_some_and(|t| t.relation.rel_id == rel_id)
    }

    /// The replay id of the row at `position`, while it is being published.
    pub(super) fn id_at(&self, position: Position) -> Option<&str> {
        // Among the newest: a row goes out when the row after it is decoded (or its Commit).
        let row = self.awaiting.iter().rev().take(2).find(|row| row.position == position)?;
        Some(&row.replay_id)
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

    /// A row's mapping: each replayed row's `Nats-Msg-Id` names its replay and its place
    /// in it (`replay_id_prefix`), so two rows of one replay never share one.
    fn mapping(
        &mut self,
        (relation, replay_id, index): (&Relation, &str, u64),
        entry: &TableEntry,
    ) -> Arc<RowMapping> {
        let base = match &self.mapping {
            Some((known, mapping)) if known == relation => Arc::clone(mapping),
            _ => {
                // A row that lacks a column this pgoutbox maps becomes a dead letter.
                let mapping =
                    Arc::new(RowMapping::of_entry(relation, entry).unwrap_or_else(|missing| {
                        RowMapping::unusable(relation, &entry.roles, &missing).in_entry(entry)
                    }));
                self.mapping = Some((relation.clone(), Arc::clone(&mapping)));
                mapping
            }
        };
        let prefix = replay_id_prefix(replay_id, index);
        Arc::new(RowMapping::clone(&base).with_id_prefix(prefix))
    }
}

impl<'a> Pipeline<'a> {
    /// A row inserted into the replay table: each row its frame hands over is published in
    /// its place like an Insert, or the frame's dead letter when pgoutbox may not publish it.
    pub(super) async fn on_replayed(
        &mut self,
        tuple: Vec<ColumnValue>,
    ) -> Result<(), PipelineError> {
        let frame = match self.handed(&tuple) {
            Handed::NotOurs => return Ok(()),
            Handed::End(total) => {
                self.replays.end = Some(total);
                self.replay_ended();
                return Ok(());
            }
            Handed::Rows(rows) => rows,
            Handed::Adopted(rows) => return self.on_adopted(rows).await,
            Handed::Refused(why) => {
                let position = self.next_position("replayed row outside a transaction")?;
                warn!(%position, reason = %why, "a replayed row is published as a dead letter");
                self.metrics.replayed_rows_unreadable.increment(1);
                let relation = self.replays.table.as_ref().map(|t| &t.relation);
                let Some(relation) = relation else {
                    return Err(PipelineError::Protocol("Insert for a relation never described"));
                };
                let entry = self.config.first();
                let mapping = RowMapping::refusing(relation, &entry.roles, why).in_entry(entry);
                return self.on_row(Arc::new(mapping), tuple, position, None).await;
            }
        };
        let ReplayedRows { replay_id, total, relation, rows } = frame;
        let entry = self.foreign(&relation);
        for (index, tuple) in rows {
            let position = self.next_position("replayed row outside a transaction")?;
            let mapping = match &entry {
                Ok(entry) => self.replays.mapping((&relation, &replay_id, index), entry),
                Err((why, entry)) => {
                    warn!(%position, reason = %why, "a replayed row is published as a dead letter");
                    self.metrics.replayed_rows_unreadable.increment(1);
                    let prefix = replay_id_prefix(&replay_id, index);
                    let mapping =
                        RowMapping::refusing(&relation, &entry.roles, why.clone()).in_entry(entry);
                    Arc::new(mapping.with_id_prefix(prefix))
                }
            };
            let replay_id = replay_id.clone();
            self.replays.awaiting.push_back(Awaiting { position, replay_id, index, total });
            self.on_row(mapping, tuple, position, None).await?;
        }
        Ok(())
    }

    /// Rows an adoption handed over (`postgres::adoption`): each published in its place as
    /// an Insert of its table would be, under its own id; a table no pattern names, or one
    /// that does not fit, gives dead letters saying so.
    async fn on_adopted(&mut self, adopted: ReplayedRows) -> Result<(), PipelineError> {
        let relation = &adopted.relation;
        let mapping = match self.tables.adopted(relation) {
            Ok(mapping) => mapping,
            Err((why, entry)) => {
                warn!(reason = %why, "adopted rows are published as dead letters");
                self.metrics.replayed_rows_unreadable.increment(adopted.rows.len() as u64);
                let entry = entry.unwrap_or_else(|| self.config.first());
                RowMapping::refusing(relation, &entry.roles, why).in_entry(entry)
            }
        };
        let mapping = Arc::new(mapping);
        for (_, tuple) in adopted.rows {
            let position = self.next_position("adopted row outside a transaction")?;
            self.on_row(Arc::clone(&mapping), tuple, position, None).await?;
        }
        Ok(())
    }

    /// What a row of the replay table hands over.
    fn handed(&self, tuple: &[ColumnValue]) -> Handed {
        let Some(table) = &self.replays.table else {
            return Handed::Refused("the replay table was never described".into());
        };
        let text = |i: Option<usize>| match i.and_then(|i| tuple.get(i)) {
            Some(ColumnValue::Text(bytes)) => Some(bytes.clone()),
            _ => None,
        };
        match text(table.slot) {
            Some(slot) if slot.as_ref() != self.source.slot.as_bytes() => return Handed::NotOurs,
            Some(_) => {}
            None => return Handed::Refused("the replay table's row names no slot".into()),
        }
        let Some(frame) = text(table.frame).as_deref().and_then(bytea_text) else {
            return Handed::Refused("the replay table's row has no readable frame".into());
        };
        match ReplayFrame::decode(&frame) {
            Ok(ReplayFrame::Rows(rows)) => Handed::Rows(rows),
            Ok(ReplayFrame::Adopted(rows)) => Handed::Adopted(rows),
            Ok(ReplayFrame::End { total, .. }) => Handed::End(total),
            Err(err) => Handed::Refused(format!(
                "the replayed row cannot be read ({err}): run the replay again with a \
                 pgoutbox replay of this version"
            )),
        }
    }

    /// The entry a replayed row's frame describes: the outbox table of that OID, under its
    /// configured name, with the columns the catalog or pgoutput gave it. Else why not, and
    /// the entry whose dead-letter subject its letter goes to: the table of that OID, or the
    /// first (a frame naming a table outside the set).
    fn foreign(
        &self,
        relation: &Relation,
    ) -> Result<Cow<'a, TableEntry>, (String, &'a TableEntry)> {
        let Some((entry, name, table)) = self.tables.by_oid(relation) else {
            let names = self.tables.names();
            let tables = match names.contains(", ") {
                false => format!("the outbox table {names}"),
                true => format!("an outbox table ({names})"),
            };
            let why = format!(
                "a replayed row describes relation {}.{} (OID {}), not {tables}: not published",
                relation.namespace, relation.name, relation.rel_id,
            );
            return Err((why, self.config.first()));
        };
        let columns: Vec<String> = relation.columns.iter().map(|c| c.name.clone()).collect();
        let known = columns == table.columns
            || Some(&columns) == self.replays.described_columns.get(&relation.rel_id);
        if relation.namespace == name.schema && relation.name == name.name && known {
            // A pattern's table is mapped under its own name (subject, `Pgoutbox-Table`).
            return Ok(match entry.pattern {
                None => Cow::Borrowed(entry),
                Some(_) => Cow::Owned(entry.for_table(name.clone())),
            });
        }
        let why = format!(
            "a replayed row describes relation {}.{}, not the outbox table {name}: not \
             published (OID {} for {}; columns {} for {})",
            relation.namespace,
            relation.name,
            relation.rel_id,
            table.oid,
            columns.join(","),
            table.columns.join(","),
        );
        Err((why, entry))
    }

    /// A replay's end counts once every message sent before it is acknowledged and none is
    /// held (its last row goes out at the Commit): all its rows are in the stream then
    /// (rows left in `awaiting` were skipped, no ack comes).
    pub(super) fn replay_ended(&mut self) {
        let held = self.transaction.as_ref().is_some_and(|t| t.held.is_some());
        if self.protocol.in_flight() == 0
            && !held
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
    use bytes::Bytes;

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
    fn two_rows_of_one_replay_that_share_an_id_get_two_message_ids() {
        use crate::domain::outbox::{ColumnRoles, MessageId, SubjectTemplate, TableEntry};
        use crate::postgres::pgoutput::Column;
        let column =
            |name: &str| Column { flags: 0, name: name.into(), type_oid: 25, type_modifier: -1 };
        let relation = Relation {
            rel_id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: ["id", "aggregate_type", "event_type", "payload"].map(column).to_vec(),
        };
        let template: SubjectTemplate = "outbox.{aggregate_type}.{event_type}".parse().unwrap();
        let entry = TableEntry {
            table: "public.outbox".parse().unwrap(),
            pattern: None,
            roles: ColumnRoles::default(),
            template,
            dead_letter_subject: "outbox.dead_letter".into(),
            message_id: MessageId::Row,
        };
        let text = |s: &'static str| ColumnValue::Text(Bytes::from_static(s.as_bytes()));
        let tuple = vec![text("7"), text("order"), text("created"), text("{}")];
        let mut replays = Replays::default();
        let ids: Vec<String> = [1, 2]
            .into_iter()
            .map(|index| replays.mapping((&relation, "r1", index), &entry).map(&tuple).unwrap().id)
            .collect();
        assert_eq!(ids, ["replay:r1/1:7", "replay:r1/2:7"]);
    }

    #[test]
    fn only_the_rows_being_sent_are_marked_with_their_replay() {
        // The newest, and the one before it: a row goes out when the next is decoded.
        let mut replays = Replays::default();
        replays.awaiting.extend([awaiting(0), awaiting(1), awaiting(2)]);
        assert_eq!(replays.id_at(at(2)), Some("r1"));
        assert_eq!(replays.id_at(at(1)), Some("r1"));
        assert_eq!(replays.id_at(at(0)), None);
        assert_eq!(replays.id_at(at(3)), None);
    }
}
