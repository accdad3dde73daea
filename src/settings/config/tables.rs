//! Which tables the settings name: the outbox tables (`--table`, names and patterns) and
//! the replay table (`--replay-table`).

use anyhow::anyhow;

use crate::domain::outbox::TablePattern;
use crate::postgres::admin::TableName;

/// `--table`'s tables, each once, and the pattern of each that holds `*`.
pub(super) fn table_names(
    values: &[String],
) -> anyhow::Result<Vec<(TableName, Option<TablePattern>)>> {
    let mut tables: Vec<(TableName, Option<TablePattern>)> = Vec::with_capacity(values.len());
    for value in values.iter().map(|v| v.trim()) {
        let pattern: TablePattern = value.parse().map_err(|e| anyhow!("--table: {e}"))?;
        let table = pattern.as_table_name();
        if tables.iter().any(|(t, _)| *t == table) {
            return Err(anyhow!("--table names {table} twice"));
        }
        tables.push((table, Some(pattern).filter(|p| !p.is_exact())));
    }
    if tables.is_empty() {
        return Err(anyhow!("--table names no table"));
    }
    Ok(tables)
}

/// `--replay-table`: one table, named exactly, that is none of the outbox tables: a row of
/// it is a replay's hand-over, never an event of its own.
pub(super) fn chosen_replay_table(
    value: &str,
    tables: &[(TableName, Option<TablePattern>)],
) -> anyhow::Result<TableName> {
    let pattern: TablePattern = value.trim().parse().map_err(|e| anyhow!("--replay-table: {e}"))?;
    if !pattern.is_exact() {
        return Err(anyhow!("--replay-table names one table, not a pattern: {value}"));
    }
    let replay = pattern.as_table_name();
    for (table, pattern) in tables {
        let outbox = match pattern {
            Some(pattern) => pattern.matches(&replay.schema, &replay.name),
            None => *table == replay,
        };
        if outbox {
            return Err(anyhow!(
                "--replay-table {replay} is an outbox table (--table {table}): choose a table \
                 of its own"
            ));
        }
    }
    Ok(replay)
}
