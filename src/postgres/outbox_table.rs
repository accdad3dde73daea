//! Is the outbox table still the one pgoutbox streams, and is it still published? Asked at
//! the start of every attempt, on the replication connection.
//!
//! pgoutput names a table in its Relation messages as the catalog named it when the row was
//! written, so rows are matched by the table's OID, which a rename keeps: rows inserted
//! while the table had another name are still published. What cannot be streamed (the
//! table gone from its name, out of the publication, or the publication no longer
//! publishing inserts) stops pgoutbox with one line before anything is confirmed past it.

use postgres_protocol::escape::escape_literal;

use crate::postgres::admin::TableName;
use crate::postgres::walsender::TextRow;

/// Why the outbox table cannot be streamed as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableDrift {
    #[error(
        "the outbox table {table} does not exist (renamed or dropped?): give it its name \
         back, or restart with --table naming it; its rows wait in the slot meanwhile"
    )]
    Missing { table: String },
    #[error(
        "publication {publication} does not exist: restart pgoutbox, which creates it; rows \
         committed while it was missing were not decoded (see \
         docs/guarantees.md#the-outbox-table-renamed-or-unpublished)"
    )]
    NoPublication { publication: String },
    #[error(
        "publication {publication} no longer publishes inserts: \
         ALTER PUBLICATION {publication} SET (publish = 'insert')"
    )]
    InsertsNotPublished { publication: String },
    #[error(
        "the outbox table {table} is not in publication {publication}: \
         ALTER PUBLICATION {publication} ADD TABLE {table}"
    )]
    NotPublished { table: String, publication: String },
}

/// The outbox table as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    pub oid: u32,
    /// Its columns today: a row version that lacks one of these was written before it was
    /// added (`RowMapping::unusable`), one that lacks another column is a misconfiguration.
    pub columns: Vec<String>,
    /// The OID of the replay table (`PipelineConfig::replay_table`) when that is in the
    /// publication: only rows inserted there are replayed rows; `None` turns replays off.
    pub replay: Option<u32>,
}

/// A table an attempt streams: the entry it belongs to (its index in the configuration)
/// and its name as found, which for an entry of a pattern is the matched table's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamedTable {
    pub entry: usize,
    pub name: TableName,
    pub table: OutboxTable,
}

/// The table `pgoutbox replay` hands rows over through, `<outbox table>_replay` beside the
/// outbox table: `setup` creates it and adds it to the publication, and a role may replay
/// once the operator granted it INSERT, SELECT and DELETE on it. Who may hand pgoutbox an
/// event is so decided by PostgreSQL's privileges, as it is for the outbox table itself.
pub fn replay_table(table: &TableName) -> TableName {
    TableName { schema: table.schema.clone(), name: format!("{}_replay", table.name) }
}

/// Its columns: the slot the row is for (a pgoutbox takes only its own), the replay's id,
/// the place of the frame's last row in it, and the frame (`postgres::pgoutput::ReplayFrame`).
pub const REPLAY_TABLE_COLUMNS: &str = "slot pg_catalog.text NOT NULL, \
     replay_id pg_catalog.text NOT NULL, row_index pg_catalog.int8 NOT NULL, \
     total pg_catalog.int8 NOT NULL, frame pg_catalog.bytea NOT NULL, \
     handed_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()";

/// The query [`judge`] reads: the table's OID, whether the publication exists, publishes
/// inserts, and holds the table, the table's columns, and the OID of `replay`
/// (`PipelineConfig::replay_table`) when the publication holds it (`None`: not asked).
pub fn query(table: &TableName, publication: &str, replay: Option<&TableName>) -> String {
    let (schema, name, publication) =
        (escape_literal(&table.schema), escape_literal(&table.name), escape_literal(publication));
    let replay = match replay {
        None => "NULL::pg_catalog.text".to_owned(),
        Some(replay) => format!(
            "(SELECT r.oid::pg_catalog.text FROM pg_catalog.pg_publication_tables t \
              JOIN pg_catalog.pg_namespace rn ON rn.nspname = t.schemaname \
              JOIN pg_catalog.pg_class r ON r.relnamespace = rn.oid AND r.relname = t.tablename \
              WHERE t.pubname = {publication} AND t.schemaname = {} AND t.tablename = {})",
            escape_literal(&replay.schema),
            escape_literal(&replay.name)
        ),
    };
    let held = held_in_snapshot(&publication);
    format!(
        "SELECT c.oid::pg_catalog.text, (p.oid IS NOT NULL)::pg_catalog.text, \
                coalesce(p.pubinsert, false)::pg_catalog.text, \
                (EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables t \
                         WHERE t.pubname = {publication} \
                           AND t.schemaname = n.nspname AND t.tablename = c.relname) \
                 OR {held})::pg_catalog.text, \
                (SELECT pg_catalog.string_agg(a.attname, ',') FROM pg_catalog.pg_attribute a \
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), \
                {replay} \
         FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         LEFT JOIN pg_catalog.pg_publication p ON p.pubname = {publication} \
         WHERE n.nspname = {schema} AND c.relname = {name}"
    )
}

/// Whether `publication` (an SQL literal) holds table `c`, as the statement's own snapshot
/// sees the catalog: by name or `FOR ALL TABLES`, a partitioned table only through its root.
///
/// `pg_publication_tables` alone is not enough: its function reads the publication's
/// tables with a catalog snapshot taken after the statement's, so a table dropped while
/// the statement runs is still in `pg_class` as the statement sees it but no longer in the
/// view, and looked taken out of the publication (a soak saw pgoutbox stop on a tenant
/// dropped under the liveness check). `IN SCHEMA` (15+) is left to the view: its catalog
/// does not exist on 14.
pub fn held_in_snapshot(publication: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM pg_catalog.pg_publication pb WHERE pb.pubname = {publication} \
                 AND (c.relkind = 'r' OR pb.pubviaroot) \
                 AND ((pb.puballtables AND c.relpersistence = 'p') \
                      OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r \
                                 WHERE r.prpubid = pb.oid AND r.prrelid = c.oid)))"
    )
}

/// The table, or why it cannot be streamed, from the rows [`query`] returned.
pub fn judge(
    rows: &[TextRow],
    table: &TableName,
    publication: &str,
) -> Result<OutboxTable, TableDrift> {
    let field = |row: &TextRow, i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let Some(row) = rows.first() else {
        return Err(TableDrift::Missing { table: table.to_string() });
    };
    let publication = publication.to_owned();
    if field(row, 1) != "true" {
        return Err(TableDrift::NoPublication { publication });
    }
    if field(row, 2) != "true" {
        return Err(TableDrift::InsertsNotPublished { publication });
    }
    if field(row, 3) != "true" {
        return Err(TableDrift::NotPublished { table: table.to_string(), publication });
    }
    let oid =
        field(row, 0).parse().map_err(|_| TableDrift::Missing { table: table.to_string() })?;
    // Column names cannot hold a comma unquoted; one that does only misjudges its own row.
    let columns = field(row, 4).split(',').map(str::to_owned).collect();
    let replay = field(row, 5).parse().ok();
    Ok(OutboxTable { oid, columns, replay })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fields: [&str; 6]) -> Vec<TextRow> {
        vec![fields.iter().map(|f| Some(f.to_string())).collect()]
    }

    #[test]
    fn each_drift_is_told_apart_and_a_published_table_gives_its_oid() {
        let table: TableName = "public.outbox".parse().unwrap();
        let judge = |rows: &[TextRow]| judge(rows, &table, "pgoutbox");
        let columns = vec!["id".to_owned(), "payload".to_owned()];
        let published = judge(&row(["16384", "true", "true", "true", "id,payload", "16390"]));
        let replay = Some(16390);
        assert_eq!(published, Ok(OutboxTable { oid: 16384, columns: columns.clone(), replay }));
        let no_replays = judge(&row(["16384", "true", "true", "true", "id,payload", ""]));
        assert_eq!(no_replays, Ok(OutboxTable { oid: 16384, columns, replay: None }));
        assert!(matches!(judge(&[]), Err(TableDrift::Missing { .. })));
        let no_publication = judge(&row(["16384", "false", "false", "false", "id", ""]));
        assert!(matches!(no_publication, Err(TableDrift::NoPublication { .. })));
        let no_inserts = judge(&row(["16384", "true", "false", "true", "id", ""]));
        assert!(matches!(no_inserts, Err(TableDrift::InsertsNotPublished { .. })));
        let dropped = judge(&row(["16384", "true", "true", "false", "id", ""])).unwrap_err();
        assert!(dropped.to_string().contains("ALTER PUBLICATION pgoutbox ADD TABLE public.outbox"));
    }

    #[test]
    fn names_are_quoted_as_literals() {
        let table: TableName = "public.outbox".parse().unwrap();
        let replay: TableName = "ops.o'replays".parse().unwrap();
        let sql = query(&table, "it's", Some(&replay));
        assert!(sql.contains("'it''s'") && sql.contains("'outbox'"), "{sql}");
        assert!(sql.contains("'ops'") && sql.contains("'o''replays'"), "{sql}");
    }
}
