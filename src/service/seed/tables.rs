//! Which tables a seed reads: each named table, and the tables a pattern matches that are
//! in the publication and that the seed can read: an owner it trusts (`postgres::trust`),
//! `SELECT` granted, a created-at column to order by. One it cannot read is named and left
//! out; it never holds back the others.

use tracing::warn;

use super::SeedError;
use crate::domain::outbox::TableEntry;
use crate::postgres::tenant_tables;
use crate::postgres::trust::{self, TrustError};
use crate::service::telemetry::names;
use crate::settings::config::Config;

/// The tables the seed reads, each under its entry, as `session`'s snapshot shows them: each
/// named table, then each table a pattern matches that is in the publication (see the
/// module doc), unless an earlier entry has it (a table two entries name is the first's).
pub(super) async fn tables_in_snapshot(
    session: &tokio_postgres::Client,
    config: &Config,
) -> Result<Vec<TableEntry>, SeedError> {
    let entries = match config.pipeline.tables.as_slice() {
        [] => std::slice::from_ref(config.entry()),
        tables => tables,
    };
    let mut read: Vec<TableEntry> =
        entries.iter().filter(|e| e.pattern.is_none()).cloned().collect();
    let tracked: String = session.query_one("SHOW track_commit_timestamp", &[]).await?.get(0);
    for entry in entries {
        let Some(pattern) = &entry.pattern else { continue };
        for matched in tenant_tables::matched(session, pattern, &config.publication).await? {
            if !matched.published || read.iter().any(|e| e.table == matched.table) {
                continue;
            }
            // A tenant's table the seed cannot read is named and left out; the others are read.
            match unreadable(session, &matched, entry, config, tracked == "on").await? {
                None => read.push(entry.for_table(matched.table)),
                Some(why) => {
                    metrics::counter!(names::TABLES_UNREAD).increment(1);
                    warn!(table = %matched.table, %pattern,
                        "the seed reads the other tables but not this one: {why}");
                }
            }
        }
    }
    if read.is_empty() {
        let patterns: Vec<String> = entries.iter().map(|e| e.table.to_string()).collect();
        return Err(SeedError::NoTable(patterns.join(", "), config.publication.clone()));
    }
    Ok(read)
}

/// Why the seed cannot read `matched`, a table of `entry`'s pattern: an owner not trusted,
/// no `SELECT` for pgoutbox's role, or no created-at column to order its rows by (without
/// `track_commit_timestamp`).
async fn unreadable(
    session: &tokio_postgres::Client,
    matched: &tenant_tables::Matched,
    entry: &TableEntry,
    config: &Config,
    commit_times: bool,
) -> Result<Option<String>, SeedError> {
    match trust::check(session, &matched.table, &config.trusted_owners).await {
        Ok(()) => {}
        Err(TrustError::Untrusted(untrusted)) => return Ok(Some(untrusted.to_string())),
        Err(TrustError::Sql(err)) => return Err(err.into()),
    }
    let select = "SELECT pg_catalog.has_table_privilege($1::pg_catalog.oid, 'SELECT')";
    if !session.query_one(select, &[&matched.oid]).await?.get::<_, bool>(0) {
        return Ok(Some(format!(
            "pgoutbox's role may not read it: GRANT SELECT ON {} to it",
            matched.table.quoted()
        )));
    }
    if !commit_times && !matched.columns.contains(&entry.roles.created_at) {
        return Ok(Some(format!(
            "it has no created-at column {:?} to order its rows by, and track_commit_timestamp \
             is off",
            entry.roles.created_at
        )));
    }
    Ok(None)
}
