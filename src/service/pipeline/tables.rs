//! The outbox tables of one attempt: which configured entry a pgoutput relation belongs
//! to, and the mapping of each relation pgoutput described.
//!
//! A relation is matched by OID first, as the catalog had it at the attempt's start
//! (`postgres::outbox_table`): a table renamed since keeps its OID, and its rows are still
//! published. A relation no entry's OID names is matched by its `schema.name`: a table
//! added to the publication, or created again under its configured name, since the
//! attempt's start. A relation that matches nothing is another table of the publication,
//! and its rows are ignored. Rows of every table go to
//! the one chain in the order pgoutput sends them: commit order.

use std::collections::HashMap;
use std::sync::Arc;

use tracing::{debug, warn};

use crate::domain::outbox::{MappingError, RowMapping, TableEntry};
use crate::postgres::outbox_table::OutboxTable;
use crate::postgres::pgoutput::Relation;

pub(super) struct TableSet<'a> {
    entries: &'a [TableEntry],
    /// Each entry's table as it was at the attempt's start, in the entries' order.
    tables: Vec<OutboxTable>,
    /// Shared so that a row's mapping stays at hand while the row is published; `None`:
    /// a table of the publication no entry names.
    mappings: HashMap<u32, Option<Arc<RowMapping>>>,
}

/// What an Insert's relation is.
pub(super) enum Described {
    Ours(Arc<RowMapping>),
    /// Another table of the publication: its rows are ignored.
    Other,
    /// pgoutput sent no Relation for it: a protocol error.
    Never,
}

impl<'a> TableSet<'a> {
    pub(super) fn new(entries: &'a [TableEntry], tables: Vec<OutboxTable>) -> Self {
        TableSet { entries, tables, mappings: HashMap::new() }
    }

    /// The first entry and its table: the one whose replay table is read (`replayed`).
    pub(super) fn first(&self) -> Option<(&'a TableEntry, &OutboxTable)> {
        Some((self.entries.first()?, self.tables.first()?))
    }

    /// Which entry `relation` belongs to, by OID, else by name.
    fn entry_of(&self, relation: &Relation) -> Option<usize> {
        let by_oid = self.tables.iter().position(|t| t.oid == relation.rel_id);
        by_oid.or_else(|| {
            self.entries.iter().position(|entry| {
                entry.table.schema == relation.namespace && entry.table.name == relation.name
            })
        })
    }

    /// The entry whose table has `relation`'s OID, as the attempt's start found it, and
    /// that table: what a replayed row's frame must describe.
    pub(super) fn by_oid(&self, relation: &Relation) -> Option<(&'a TableEntry, &OutboxTable)> {
        let i = self.tables.iter().position(|t| t.oid == relation.rel_id)?;
        Some((self.entries.get(i)?, &self.tables[i]))
    }

    /// Every entry's table, for a message naming them.
    pub(super) fn names(&self) -> String {
        self.entries.iter().map(|e| e.table.to_string()).collect::<Vec<_>>().join(", ")
    }

    /// Builds the mapping of the relation pgoutput describes now. A column the table has
    /// today, missing from this older version, makes its rows dead letters; a column the
    /// table never had is a misconfiguration that stops pgoutbox.
    pub(super) fn describe(&mut self, relation: &Relation) -> Result<(), MappingError> {
        let Some(i) = self.entry_of(relation) else {
            debug!(rel_id = relation.rel_id, "relation of another table");
            self.mappings.insert(relation.rel_id, None);
            return Ok(());
        };
        let entry = &self.entries[i];
        let table = &entry.table;
        if relation.namespace != table.schema || relation.name != table.name {
            warn!(%table, named = %format!("{}.{}", relation.namespace, relation.name),
                "the outbox table had another name when these rows were written; \
                 they are published all the same (matched by the table's OID)");
        }
        let mapping = match RowMapping::of_entry(relation, entry) {
            Ok(mapping) => mapping,
            Err(missing)
                if self.tables.get(i).is_some_and(|t| t.columns.contains(&missing.column)) =>
            {
                warn!(%missing, "rows written before the column was added become dead letters");
                RowMapping::unusable(relation, &entry.roles, &missing).in_entry(entry)
            }
            Err(missing) => return Err(missing),
        };
        debug!(rel_id = relation.rel_id, %table, "relation");
        self.mappings.insert(relation.rel_id, Some(Arc::new(mapping)));
        Ok(())
    }

    /// The mapping of an Insert's relation.
    pub(super) fn mapping(&self, rel_id: u32) -> Described {
        match self.mappings.get(&rel_id) {
            Some(Some(mapping)) => Described::Ours(Arc::clone(mapping)),
            Some(None) => Described::Other,
            None => Described::Never,
        }
    }
}
