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
//!
//! An entry of a pattern (`tenant_*.outbox`) has as many tables as it matched at the
//! attempt's start, and by name any table it matches that joined the publication since (a
//! tenant's table the event trigger added in its creating transaction, or one adopted).
//! Entries are tried in the configuration's order, the first that names a table wins. A
//! table of a pattern whose shape does not fit the entry never stops the others: its rows
//! become dead letters naming the missing column.

use std::collections::HashMap;
use std::sync::Arc;

use tracing::{debug, warn};

use crate::domain::outbox::{MappingError, RowMapping, TableEntry, TableName};
use crate::postgres::outbox_table::{OutboxTable, StreamedTable};
use crate::postgres::pgoutput::Relation;

pub(super) struct TableSet<'a> {
    entries: &'a [TableEntry],
    /// Each streamed table as it was at the attempt's start: exact entries in their
    /// order, then the tables each pattern matched.
    tables: Vec<StreamedTable>,
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
    pub(super) fn new(entries: &'a [TableEntry], tables: Vec<StreamedTable>) -> Self {
        TableSet { entries, tables, mappings: HashMap::new() }
    }

    /// The first entry, when it names its table exactly, and its table: its replay table's
    /// OID is known from the attempt's start (`replayed`). With a pattern first, the replay
    /// table is known by its name alone.
    pub(super) fn first(&self) -> Option<(&'a TableEntry, &OutboxTable)> {
        let entry = self.entries.first().filter(|entry| entry.pattern.is_none())?;
        let first = self.tables.iter().find(|t| t.entry == 0)?;
        Some((entry, &first.table))
    }

    /// Which entry `relation` belongs to, by OID, else by name (exact names first in the
    /// entries' order, then patterns in theirs), with its table at the attempt's start
    /// when known by OID.
    fn entry_of(&self, relation: &Relation) -> Option<(usize, Option<&StreamedTable>)> {
        if let Some(known) = self.tables.iter().find(|t| t.table.oid == relation.rel_id) {
            return Some((known.entry, Some(known)));
        }
        let (schema, name) = (&relation.namespace, &relation.name);
        let exact = self.entries.iter().position(|entry| {
            entry.pattern.is_none() && entry.table.schema == *schema && entry.table.name == *name
        });
        let by_pattern = || {
            self.entries.iter().position(|entry| {
                entry.pattern.as_ref().is_some_and(|pattern| pattern.matches(schema, name))
            })
        };
        exact.or_else(by_pattern).map(|i| (i, None))
    }

    /// The entry whose table has `relation`'s OID, as the attempt's start found it, that
    /// table's name (a pattern's entry names the pattern) and the table: what a replayed
    /// row's frame must describe.
    pub(super) fn by_oid(
        &self,
        relation: &Relation,
    ) -> Option<(&'a TableEntry, &TableName, &OutboxTable)> {
        let known = self.tables.iter().find(|t| t.table.oid == relation.rel_id)?;
        Some((self.entries.get(known.entry)?, &known.name, &known.table))
    }

    /// The mapping of rows an adoption handed over for `relation` (`ReplayFrame::Adopted`):
    /// a table a pattern's entry names (by OID, else by name), mapped as its Inserts are,
    /// under its own name. Else why not, and the entry whose dead-letter subject the rows'
    /// letters go to, when one names the table. Nothing is remembered: pgoutput's own
    /// Relation for the table, when it comes, is what maps its Inserts.
    pub(super) fn adopted(
        &self,
        relation: &Relation,
    ) -> Result<RowMapping, (String, Option<&'a TableEntry>)> {
        let entries = self.entries;
        let found = self.entry_of(relation).and_then(|(i, known)| Some((entries.get(i)?, known)));
        let Some((configured, known)) = found.filter(|(entry, _)| entry.pattern.is_some()) else {
            let why = format!(
                "an adoption handed over rows of {}.{}, which no --table pattern names: not \
                 published",
                relation.namespace, relation.name
            );
            return Err((why, None));
        };
        let named = TableName { schema: relation.namespace.clone(), name: relation.name.clone() };
        let entry = configured.for_table(known.map_or(named, |t| t.name.clone()));
        RowMapping::of_entry(relation, &entry).map_err(|missing| {
            let why = format!("the row's table does not fit {}: {missing}", configured.table);
            (why, Some(configured))
        })
    }

    /// Every entry's table (or pattern), for a message naming them.
    pub(super) fn names(&self) -> String {
        self.entries.iter().map(|e| e.table.to_string()).collect::<Vec<_>>().join(", ")
    }

    /// Builds the mapping of the relation pgoutput describes now. A column the table has
    /// today, missing from this older version, makes its rows dead letters; a column the
    /// table never had is a misconfiguration that stops pgoutbox, unless the table was
    /// matched by a pattern: then its rows become dead letters saying so.
    pub(super) fn describe(&mut self, relation: &Relation) -> Result<(), MappingError> {
        let Some((i, known)) = self.entry_of(relation) else {
            debug!(rel_id = relation.rel_id, "relation of another table");
            self.mappings.insert(relation.rel_id, None);
            return Ok(());
        };
        let configured = &self.entries[i];
        let named = TableName { schema: relation.namespace.clone(), name: relation.name.clone() };
        let entry = match (&configured.pattern, known) {
            (None, _) => configured.clone(),
            (Some(_), Some(known)) => configured.for_table(known.name.clone()),
            (Some(_), None) => configured.for_table(named.clone()),
        };
        let table = &entry.table;
        if named != *table {
            warn!(%table, named = %named,
                "the outbox table had another name when these rows were written; \
                 they are published all the same (matched by the table's OID)");
        }
        let mapping = match RowMapping::of_entry(relation, &entry) {
            Ok(mapping) => mapping,
            Err(missing) if known.is_some_and(|t| t.table.columns.contains(&missing.column)) => {
                warn!(%missing, "rows written before the column was added become dead letters");
                RowMapping::unusable(relation, &entry.roles, &missing).in_entry(&entry)
            }
            Err(missing) if configured.pattern.is_some() => {
                warn!(%missing, pattern = %configured.table,
                    "a table of the pattern does not fit: its rows become dead letters; \
                     the other tables stream on");
                let why = format!("the row's table does not fit {}: {missing}", configured.table);
                RowMapping::refusing(relation, &entry.roles, why).in_entry(&entry)
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
