//! Tables named by a pattern (schema-per-tenant): which tables match it now and whether
//! each is in the publication; and the event trigger that publishes a new tenant table in
//! the transaction that creates it.
//!
//! A matching table out of the publication is never left alone: `setup` joins it (no slot
//! yet) or adopts it, and while `run` streams the adopter beside the liveness check does,
//! as each attempt starts and every 10 s (`postgres::adoption`, `service::liveness`). `pgoutbox setup --tenant-trigger` ([`trigger_sql`]) makes the
//! question moot for tables created from then on: they join in their creating transaction.
//!
//! Temporary tables never match: any role may make one (`TEMPORARY` is PUBLIC's), none can
//! join a publication, and each lives in a `pg_temp_N` schema a pattern over schemas would
//! otherwise match.

use postgres_protocol::escape::{escape_identifier as quote_ident, escape_literal};
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
    /// The `pg_publication_rel` row naming it in the publication, if it is there by name: a
    /// table taken out and added back (adopted again) has another.
    pub membership: Option<u32>,
    pub columns: Vec<String>,
    /// Owned by the role pgoutbox runs as (exactly: a superuser owns only its own tables).
    /// pgoutbox deletes only from such a table (`--retention`): a table's triggers run as the
    /// role that writes to it, so another owner's code would run with pgoutbox's rights.
    pub owned: bool,
    /// `UNLOGGED`: its rows are not in the WAL, and no publication can hold it.
    pub unlogged: bool,
}

/// The tables `pattern` matches (ordinary or partitioned, not partitions: their root is
/// published; not temporary), each with its OID, whether `publication` holds it (and by which
/// `pg_publication_rel` row, if by name), and its columns; in
/// name order. The publication's tables are listed once, not per table: with thousands
/// of tenants the view is the costly part.
pub fn query(pattern: &TablePattern, publication: &str) -> String {
    let (schema, name) = pattern.like_clauses();
    let (schema, name, publication) =
        (escape_literal(&schema), escape_literal(&name), escape_literal(publication));
    let held = crate::postgres::outbox_table::held_in_snapshot(&publication);
    format!(
        "SELECT c.oid::pg_catalog.text, n.nspname::pg_catalog.text, c.relname::pg_catalog.text, \
                (p.tablename IS NOT NULL OR {held})::pg_catalog.text, \
                (SELECT pg_catalog.string_agg(a.attname, ',') FROM pg_catalog.pg_attribute a \
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), \
                (SELECT r.oid::pg_catalog.text FROM pg_catalog.pg_publication_rel r \
                 JOIN pg_catalog.pg_publication pb ON pb.oid = r.prpubid \
                 WHERE pb.pubname = {publication} AND r.prrelid = c.oid), \
                (c.relowner = (SELECT oid FROM pg_catalog.pg_roles \
                               WHERE rolname = current_user))::pg_catalog.text, \
                (c.relpersistence = 'u')::pg_catalog.text \
         FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         LEFT JOIN (SELECT schemaname, tablename FROM pg_catalog.pg_publication_tables \
                    WHERE pubname = {publication}) p \
           ON p.schemaname = n.nspname AND p.tablename = c.relname \
         WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relpersistence <> 't' \
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
                membership: field(row, 5).parse().ok(),
                columns: field(row, 4).split(',').map(str::to_owned).collect(),
                owned: field(row, 6) == "true",
                unlogged: field(row, 7) == "true",
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

/// The name of the event trigger (and of its function) `setup --tenant-trigger` makes
/// for `publication`.
pub fn trigger_name(publication: &str) -> String {
    format!("pgoutbox_{publication}_tables")
}

/// The event trigger that adds each new table matching one of `patterns` to
/// `publication` at the end of its `CREATE TABLE`, in the creating transaction, so its
/// rows are decoded from the first (fact 4). `SECURITY DEFINER`: adding a table needs
/// ownership of it and of the publication, so the function runs as the superuser who
/// made it, in the session of whoever creates a table. So it names every function, type
/// and catalog with `pg_catalog.`, and its `search_path` is `pg_catalog, pg_temp`: left
/// out, `pg_temp` would come first, and a temporary view named `pg_class` that the
/// creating role made would run as the superuser. It lives in pgoutbox's own schema
/// (`postgres::own_schema`), where no other role makes objects. A failure (the publication dropped)
/// fails the `CREATE TABLE`: it fails closed. Partitions and temporary tables are skipped (their root is published; a
/// temporary table cannot be). `CREATE TABLE AS` is left
/// out on purpose: its rows are written before the trigger runs and would be missed;
/// such a table is found unpublished and adopted instead.
pub fn trigger_sql(publication: &str, patterns: &[TablePattern], own_schema: &str) -> String {
    let name = trigger_name(publication);
    let function = format!("{}.{}", quote_ident(own_schema), quote_ident(&name));
    let matches = patterns
        .iter()
        .map(|pattern| {
            let (schema, table) = pattern.like_clauses();
            format!(
                "(n.nspname LIKE {} AND c.relname LIKE {})",
                escape_literal(&schema),
                escape_literal(&table)
            )
        })
        .collect::<Vec<_>>()
        .join(" OR ");
    let matches = if matches.is_empty() { "false".to_owned() } else { matches };
    let publication_literal = escape_literal(publication);
    format!(
        "CREATE OR REPLACE FUNCTION {function}() RETURNS pg_catalog.event_trigger \
         LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pgoutbox$ \
         DECLARE created record; \
         BEGIN \
           FOR created IN SELECT objid FROM pg_catalog.pg_event_trigger_ddl_commands() \
                          WHERE command_tag = 'CREATE TABLE' AND object_type = 'table' LOOP \
             IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
                        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                        WHERE c.oid = created.objid AND c.relkind IN ('r', 'p') \
                          AND NOT c.relispartition AND c.relpersistence <> 't' \
                          AND ({matches})) \
                AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r \
                                JOIN pg_catalog.pg_publication p ON p.oid = r.prpubid \
                                WHERE p.pubname = {publication_literal} \
                                  AND r.prrelid = created.objid) THEN \
               EXECUTE pg_catalog.format('ALTER PUBLICATION %I ADD TABLE %s', \
                                         {publication_literal}, \
                                         created.objid::pg_catalog.regclass); \
             END IF; \
           END LOOP; \
         END $pgoutbox$; \
         REVOKE ALL ON FUNCTION {function}() FROM PUBLIC; \
         DROP EVENT TRIGGER IF EXISTS {trigger}; \
         CREATE EVENT TRIGGER {trigger} ON ddl_command_end WHEN TAG IN ('CREATE TABLE') \
           EXECUTE FUNCTION {function}();",
        trigger = quote_ident(&name),
    )
}

/// Fails, naming it, when the event trigger's function `<schema>.<trigger name>()` exists
/// and belongs to a role other than this session's: `CREATE OR REPLACE` keeps a function's
/// owner, so its body would stay that role's to swap, and run as the superuser's trigger.
pub async fn refuse_a_foreign_trigger_function(
    client: &tokio_postgres::Client,
    publication: &str,
    schema: &str,
) -> Result<(), ForeignFunction> {
    let name = trigger_name(publication);
    match trigger_function_owner(client, publication, schema).await? {
        Some((owner, login)) if owner != login => {
            let function = format!("{}.{}", quote_ident(schema), quote_ident(&name));
            Err(ForeignFunction::Foreign { function, owner })
        }
        _ => Ok(()),
    }
}

/// The owner of `<schema>.<trigger name>()` and this session's role, when it exists.
async fn trigger_function_owner(
    client: &tokio_postgres::Client,
    publication: &str,
    schema: &str,
) -> Result<Option<(String, String)>, tokio_postgres::Error> {
    let found = client
        .query_opt(
            "SELECT o.rolname::pg_catalog.text, current_user::pg_catalog.text \
             FROM pg_catalog.pg_proc p \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             JOIN pg_catalog.pg_roles o ON o.oid = p.proowner \
             WHERE n.nspname = $2 AND p.proname = $1 AND p.pronargs = 0",
            &[&trigger_name(publication), &schema],
        )
        .await?;
    found.map(|row| Ok((row.try_get(0)?, row.try_get(1)?))).transpose()
}

/// An upgrade: the trigger's function an earlier version made in `public`, once the trigger
/// runs the one in the own schema. Dropped only when this session's role owns it (judged
/// from the catalog first); one another role made is never named.
pub async fn drop_the_earlier_function(
    client: &tokio_postgres::Client,
    publication: &str,
) -> Result<bool, tokio_postgres::Error> {
    match trigger_function_owner(client, publication, "public").await? {
        Some((owner, login)) if owner == login => {
            let name = quote_ident(&trigger_name(publication));
            client.batch_execute(&format!("DROP FUNCTION public.{name}()")).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Why `setup --tenant-trigger` does not make its trigger's function.
#[derive(Debug, thiserror::Error)]
pub enum ForeignFunction {
    #[error(
        "function {function}() exists, owned by role {owner:?}, not by this session's: \
         pgoutbox never replaces a function another role made under its name (it would stay \
         that role's, and run as the event trigger's superuser); drop it (DROP FUNCTION \
         {function}()), then run setup --tenant-trigger again"
    )]
    Foreign { function: String, owner: String },
    #[error(transparent)]
    Sql(#[from] tokio_postgres::Error),
}

/// Drops what [`trigger_sql`] made, if there.
pub fn drop_trigger_sql(publication: &str, own_schema: &str) -> String {
    let name = trigger_name(publication);
    format!(
        "DROP EVENT TRIGGER IF EXISTS {trigger}; DROP FUNCTION IF EXISTS {schema}.{trigger}();",
        trigger = quote_ident(&name),
        schema = quote_ident(own_schema)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fields: [&str; 7]) -> TextRow {
        fields.iter().map(|f| Some(f.to_string())).collect()
    }

    #[test]
    fn matched_tables_are_read_and_checked_against_the_pattern() {
        let pattern: TablePattern = "tenant_*.outbox".parse().unwrap();
        let rows = [
            row(["16384", "tenant_1", "outbox", "true", "id,payload", "16388", "true"]),
            row(["16390", "tenant_2", "outbox", "false", "id", "", "false"]),
            row(["16400", "tenantX", "outbox", "false", "id", "", "true"]),
        ];
        let matched = judge(&rows, &pattern);
        assert_eq!(matched.len(), 2, "tenantX is not tenant_*");
        assert_eq!(matched[0].table.to_string(), "tenant_1.outbox");
        assert!(matched[0].published && !matched[1].published);
        assert!(matched[0].owned && !matched[1].owned);
        assert_eq!((matched[0].membership, matched[1].membership), (Some(16388), None));
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
        let trigger = trigger_sql("pgoutbox", &[pattern], "pgoutbox");
        assert!(trigger.contains(r"n.nspname LIKE  E'tenant\\_%'"), "{trigger}");
        assert!(trigger.contains("CREATE EVENT TRIGGER \"pgoutbox_pgoutbox_tables\""), "{trigger}");
    }
}
