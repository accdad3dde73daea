//! The order a seed reads rows in: commit order as far as the table shows it, and within a
//! transaction the order it inserted them.

use postgres_protocol::escape::escape_identifier;

use super::{Selection, SnapshotTable};
use crate::domain::row::Relation;

/// The SQL that orders one transaction's rows of `relation` as the transaction inserted
/// them, which is the order pgoutput decodes them in: by statement (`cmin`, the command id
/// each row keeps after the commit), then, within a multi-row statement, by the id when it
/// is an integer (a sequence hands one session ascending values), then by partition and
/// place in the table. The place alone is not insert order: a later, smaller row goes back
/// into an earlier page that had room left.
pub fn insert_order(relation: &Relation, id: &str) -> String {
    const INTEGERS: [u32; 3] = [20, 21, 23]; // int8, int2, int4
    let integral = relation.columns.iter().any(|c| c.name == id && INTEGERS.contains(&c.type_oid));
    let id = if integral {
        format!("{}::pg_catalog.int8", escape_identifier(id))
    } else {
        "NULL::pg_catalog.int8".to_owned()
    };
    format!("cmin::pg_catalog.text::pg_catalog.int8, {id}, tableoid, ctid")
}

/// The query of [`TableSnapshot::read_all`]: each row's table index first, then its columns.
///
/// One table: its columns as they are, ordered as the single-table read orders them.
/// Several: one `UNION ALL` of every table, each row's columns as their type's output
/// text (`format('%s', …)`, what pgoutput and a plain `SELECT` send, where a `::text`
/// cast would print `true` for `t`, strip a `char(n)`'s padding), padded with NULLs to the
/// widest table, ordered by the order key, then the transaction (a transaction's rows stay
/// together), then the order the transaction inserted them in ([`insert_order`]; one
/// statement writes one table, so the configured order of tables only breaks ties the
/// table itself cannot).
pub(super) fn tagged_query(tables: &[SnapshotTable], selection: &Selection) -> String {
    if let [table] = tables {
        return format!(
            "SELECT 0, {} FROM {}{} ORDER BY {} NULLS FIRST, \
             xmin::pg_catalog.text::pg_catalog.int8, {}, {}::pg_catalog.text",
            table.columns().join(", "),
            table.table,
            table.filter(selection),
            table.key,
            table.insert_order,
            table.id,
        );
    }
    let widest = tables.iter().map(|t| t.relation.columns.len()).max().unwrap_or(0);
    let branches: Vec<String> = tables
        .iter()
        .enumerate()
        .map(|(entry, table)| {
            let mut values: Vec<String> = table
                .columns()
                .iter()
                .map(|c| {
                    format!(
                        "CASE WHEN pg_catalog.num_nulls({c}) = 1 THEN NULL \
                         ELSE pg_catalog.format('%s', {c}) END"
                    )
                })
                .collect();
            values.resize(widest, "NULL::pg_catalog.text".to_owned());
            let values: Vec<String> = values
                .into_iter()
                .enumerate()
                .map(|(i, value)| format!("{value} AS pgoutbox_c{i}"))
                .collect();
            format!(
                "SELECT {entry} AS pgoutbox_entry, {} AS pgoutbox_key, \
                 xmin::pg_catalog.text::pg_catalog.int8 AS pgoutbox_xid, \
                 ROW({}) AS pgoutbox_insert, {}::pg_catalog.text AS pgoutbox_id, {} FROM {}{}",
                table.key,
                table.insert_order,
                table.id,
                values.join(", "),
                table.table,
                table.filter(selection),
            )
        })
        .collect();
    let columns: Vec<String> = (0..widest).map(|i| format!("pgoutbox_c{i}")).collect();
    format!(
        "SELECT pgoutbox_entry, {} FROM ({}) AS pgoutbox_rows ORDER BY pgoutbox_key NULLS \
         FIRST, pgoutbox_xid, pgoutbox_insert, pgoutbox_entry, pgoutbox_id",
        columns.join(", "),
        branches.join(" UNION ALL "),
    )
}
