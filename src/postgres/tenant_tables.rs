//! Tables named by a pattern (schema-per-tenant): which tables match it now and whether
//! each is in the publication.
//!
//! A table created while pgoutbox runs is not in a `FOR TABLE` publication until someone
//! adds it, and rows committed before that are never decoded, now or on any later
//! decoding of that WAL (docs/proposals/several-tables.md, fact 3). An attempt that
//! starts and finds one stops pgoutbox, saying how to add it; closing the window while
//! pgoutbox runs is step 8 of that proposal.

use postgres_protocol::escape::escape_literal;
use tokio_postgres::Client;

use crate::domain::outbox::{TableName, TablePattern};
use crate::postgres::walsender::TextRow;

/// A table a pattern matches, as the catalog has it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub table: TableName,
    pub oid: u32,
    /// In the publication (by name, through its root, or `FOR ALL TABLES` / `IN SCHEMA`).
    pub published: bool,
    pub columns: Vec<String>,
}

/// The tables `pattern` matches (ordinary or partitioned, not partitions: their root is
/// published), each with its OID, whether `publication` holds it, and its columns; in
/// name order. The publication's tables are listed once, not per table: with thousands
/// of tenants the view is the costly part.
pub fn query(pattern: &TablePattern, publication: &str) -> String {
    let (schema, name) = pattern.like_clauses();
    let (schema, name, publication) =
        (escape_literal(&schema), escape_literal(&name), escape_literal(publication));
    format!(
        "SELECT c.oid::text, n.nspname::text, c.relname::text, (p.tablename IS NOT NULL)::text, \
                (SELECT string_agg(a.attname, ',') FROM pg_attribute a \
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         LEFT JOIN (SELECT schemaname, tablename FROM pg_publication_tables \
                    WHERE pubname = {publication}) p \
           ON p.schemaname = n.nspname AND p.tablename = c.relname \
         WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition \
           AND n.nspname LIKE {schema} AND c.relname LIKE {name} \
         ORDER BY n.nspname, c.relname"
    )
}

/// The matched tables from the rows [`query`] returned, checked against the pattern
/// again (the `LIKE` clauses say the same; this keeps a misread row out).
pub fn judge(rows: &[TextRow], pattern: &TablePattern) -> Vec<Matched> {
    let field = |row: &TextRow, i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    rows.iter()
        .filter_map(|row| {
            let table = TableName { schema: field(row, 1), name: field(row, 2) };
            if !pattern.matches(&table.schema, &table.name) {
                return None;
            }
            Some(Matched {
                oid: field(row, 0).parse().ok()?,
                published: field(row, 3) == "true",
                columns: field(row, 4).split(',').map(str::to_owned).collect(),
                table,
            })
        })
        .collect()
}

/// [`query`] and [`judge`] on an ordinary connection.
pub async fn matched(
    client: &Client,
    pattern: &TablePattern,
    publication: &str,
) -> Result<Vec<Matched>, tokio_postgres::Error> {
    let answer = client.simple_query(&query(pattern, publication)).await?;
    Ok(judge(&text_rows(&answer), pattern))
}

/// The rows of a simple query's answer, as text.
pub fn text_rows(answer: &[tokio_postgres::SimpleQueryMessage]) -> Vec<TextRow> {
    answer
        .iter()
        .filter_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => {
                Some((0..row.len()).map(|i| row.get(i).map(str::to_owned)).collect())
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fields: [&str; 5]) -> TextRow {
        fields.iter().map(|f| Some(f.to_string())).collect()
    }

    #[test]
    fn matched_tables_are_read_and_checked_against_the_pattern() {
        let pattern: TablePattern = "tenant_*.outbox".parse().unwrap();
        let rows = [
            row(["16384", "tenant_1", "outbox", "true", "id,payload"]),
            row(["16390", "tenant_2", "outbox", "false", "id"]),
            row(["16400", "tenantX", "outbox", "false", "id"]),
        ];
        let matched = judge(&rows, &pattern);
        assert_eq!(matched.len(), 2, "tenantX is not tenant_*");
        assert_eq!(matched[0].table.to_string(), "tenant_1.outbox");
        assert!(matched[0].published && !matched[1].published);
        assert_eq!(
            (matched[1].oid, matched[1].columns.as_slice()),
            (16390, &["id".to_owned()][..])
        );
    }

    #[test]
    fn the_queries_escape_like_wildcards_and_quote_names() {
        let pattern: TablePattern = "tenant_*.out%box".parse().unwrap();
        let sql = query(&pattern, "it's");
        // escape_literal writes ` E'…'` when a backslash is in the value.
        assert!(
            sql.contains(r"LIKE  E'tenant\\_%'") && sql.contains(r"LIKE  E'out\\%box'"),
            "{sql}"
        );
        assert!(sql.contains("'it''s'"), "{sql}");
    }
}
