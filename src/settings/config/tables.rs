//! Which tables the settings name: the outbox tables (`--table`, names and patterns) and
//! the replay table (`--replay-table`).

use anyhow::anyhow;

use crate::domain::outbox::TablePattern;
use crate::postgres::admin::TableName;
use crate::settings::cli::CommonArgs;

/// A table as `--table` names it: its name, and its pattern when that holds `*`.
pub(super) type NamedTable = (TableName, Option<TablePattern>);

/// `--table`'s tables, each once, and the pattern of each that holds `*`.
pub(super) fn table_names(values: &[String]) -> anyhow::Result<Vec<NamedTable>> {
    let mut tables: Vec<NamedTable> = Vec::with_capacity(values.len());
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

/// The first table named exactly (with patterns alone, the first pattern's name), and the
/// replay table: `--replay-table`, else beside that table (with patterns alone, in
/// `public`, named after the publication).
pub(super) fn replay_table(
    args: &CommonArgs,
    names: &[NamedTable],
) -> anyhow::Result<(TableName, TableName)> {
    let named = names.iter().find(|(_, pattern)| pattern.is_none());
    let table = named.or(names.first()).map(|(table, _)| table.clone());
    let table = table.ok_or_else(|| anyhow!("--table names no table"))?;
    let replay_table = match (&args.replay_table, named) {
        (Some(value), _) => chosen_replay_table(value, names)?,
        (None, Some(_)) => crate::postgres::outbox_table::replay_table(&table),
        (None, None) => {
            TableName { schema: "public".to_owned(), name: format!("{}_replay", args.publication) }
        }
    };
    Ok((table, replay_table))
}

/// `--replay-table`: one table, named exactly, that is none of the outbox tables: a row of
/// it is a replay's hand-over, never an event of its own.
fn chosen_replay_table(value: &str, tables: &[NamedTable]) -> anyhow::Result<TableName> {
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
