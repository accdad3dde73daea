//! `--retention`: deleting outbox rows that are old *and* already published, in small
//! batches, so the tables do not grow forever. Every configured table is served, each by
//! its own created-at and id columns.
//!
//! "Published" is known from the pipeline: it records the commit time of the newest
//! transaction the slot was confirmed past (behind the durability horizon, not merely
//! acknowledged: until then the WAL may be needed to refill a stream that lost it, and the
//! table is the copy a recovery reads); transactions are published in commit order, so every
//! row committed before it is in JetStream. A row is deleted only when its created-at
//! column is older than that commit time minus the retention. (A keepalive confirmed while
//! idle says nothing about *when* the rows behind it committed, so it does not count: on an
//! idle outbox the last rows wait for the next transaction.) This assumes no transaction writing the outbox stays open longer than the
//! retention (its rows could carry an older created_at than their commit). Logical
//! decoding reads the WAL, not the table, so even then no event would be lost: only the
//! copy kept in the table for manual recovery.
//!
//! A pattern's tables (`tenant_*.outbox`) are listed again on every pass. One that joins
//! the publication later is adopted: its rows are inserted again, keeping their created-at,
//! in the adopting transaction, which the newest published commit says nothing about. So
//! a matched table is served only once JetStream acknowledged everything up to the WAL
//! position at which it was first seen in the publication (or the slot confirmed it; the
//! slot trails by the durability horizon) ([`SeenPublished`]): every transaction visible then,
//! its adoption included, committed before that position. A table is known by its OID and
//! the publication's row for it, not its name, so joining anew between two passes counts;
//! and each delete checks that row again ([`RetainedTable::delete_batch`]), for an
//! adoption that commits between a pass's listing and its delete.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use tracing::{info, warn};

use crate::domain::outbox::{TRUNCATED, TablePattern};
use crate::postgres::admin::{self, TableName};
use crate::postgres::tenant_tables;
use crate::postgres::trust::{self, TrustError, TrustedOwners};
use crate::postgres::wire::PG_EPOCH_OFFSET_MICROS;
use crate::service::shutdown::Shutdown;
use postgres_protocol::escape::escape_identifier as quote_ident;
use tokio_postgres::types::PgLsn;

/// Rows deleted per statement: short transactions, short locks.
const BATCH: i64 = 1_000;

/// The commit time of the newest transaction confirmed to Postgres, in µs since
/// 2000-01-01; 0 until the pipeline confirmed something.
#[derive(Clone, Default)]
pub struct PublishedUpTo(Arc<AtomicI64>);

impl PublishedUpTo {
    pub fn advance(&self, pg_micros: i64) {
        self.0.fetch_max(pg_micros, Ordering::Relaxed);
    }

    /// The newest published commit, in seconds since the Unix epoch.
    pub fn unix_seconds(&self) -> Option<f64> {
        let micros = Some(self.0.load(Ordering::Relaxed)).filter(|t| *t > 0)?;
        Some((micros + PG_EPOCH_OFFSET_MICROS) as f64 / 1e6)
    }
}

/// The commit times of transactions JetStream acknowledged and the slot was not yet confirmed
/// past (the durability horizon holds it back), by the position that confirms them: once
/// the slot passes a position, its commit time may advance [`PublishedUpTo`]. One entry per
/// tick or ack batch, so at most ~10 a second of horizon.
#[derive(Debug, Default)]
pub struct CommitsUnconfirmed(std::collections::VecDeque<(u64, i64)>);

impl CommitsUnconfirmed {
    /// Transactions up to `position` were acknowledged, the newest committed at `committed`.
    pub fn push(&mut self, (position, committed): (u64, i64)) {
        match self.0.back_mut() {
            Some(last) if last.0 >= position => last.1 = last.1.max(committed),
            _ => self.0.push_back((position, committed)),
        }
    }

    /// The slot was confirmed up to `confirmed`: the newest commit time it passed, if any.
    pub fn confirmed_up_to(&mut self, confirmed: u64) -> Option<i64> {
        let mut newest = None;
        while let Some(&(position, committed)) = self.0.front() {
            if position > confirmed {
                break;
            }
            newest = newest.max(Some(committed));
            self.0.pop_front();
        }
        newest
    }
}

/// Rows never to delete: those whose dead letter lacks the payload (it was too large to
/// fit), so the table holds the only copy. Filled from the stream's dead letters at start
/// and by the pipeline as it publishes more. Known by table (`schema.table`, as a dead
/// letter names it) and id: the same id in two tables is two rows.
#[derive(Clone, Default)]
pub struct KeptRows(Arc<Mutex<HashMap<String, Kept>>>);

#[derive(Default)]
struct Kept {
    ids: HashSet<String>,
    /// Ids a dead letter had to shorten (over 256 bytes): rows starting with one are kept.
    prefixes: HashSet<String>,
}

impl KeptRows {
    pub fn keep(&self, table: &str, id: String) {
        if let Ok(mut kept) = self.0.lock() {
            kept.entry(table.to_owned()).or_default().ids.insert(id);
        }
    }

    /// An id as a dead letter's body gives it, which may be shortened.
    pub fn keep_letter_id(&self, table: &str, id: &str) {
        match id.strip_suffix(TRUNCATED) {
            Some(prefix) => {
                if let Ok(mut kept) = self.0.lock() {
                    kept.entry(table.to_owned()).or_default().prefixes.insert(prefix.to_owned());
                }
            }
            None => self.keep(table, id.to_owned()),
        }
    }

    /// The ids and the id prefixes to keep in `table`, as query parameters.
    fn snapshot(&self, table: &str) -> (Vec<String>, Vec<String>) {
        let Ok(kept) = self.0.lock() else { return (Vec::new(), Vec::new()) };
        match kept.get(table) {
            Some(kept) => {
                (kept.ids.iter().cloned().collect(), kept.prefixes.iter().cloned().collect())
            }
            None => (Vec::new(), Vec::new()),
        }
    }
}

/// A table retention serves, and the columns it reads there; with `pattern`, the tables
/// the pattern matches (`table` is then the pattern's text).
pub struct RetainedTable {
    pub table: TableName,
    pub pattern: Option<TablePattern>,
    pub created_at: String,
    pub id: String,
}

/// A table as one pass saw it in the publication under its name. A table dropped and
/// created again has another OID; one taken out of the publication and added back (adopted
/// again, its rows inserted again) another `pg_publication_rel` row. Either is a table that
/// joined anew, however short the time between two passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Joined {
    oid: u32,
    /// `None` when published without a row of its own (`FOR ALL TABLES`, `IN SCHEMA`): such
    /// a table is published from its creation, so nothing is adopted.
    membership: Option<u32>,
}

/// When each table a pattern matches was first seen in the publication, as a WAL position:
/// a table is served once the slot confirmed that position, so its adopting transaction,
/// which inserted its older rows again, is published. A table seen out of the publication,
/// gone, or [`Joined`] anew is forgotten, so that joining again waits again.
#[derive(Debug, Default)]
struct SeenPublished(HashMap<TableName, (Joined, u64)>);

impl SeenPublished {
    /// Takes one pass's view of a pattern's tables in the publication, listed before WAL
    /// insert position `now` was read, and answers those that may be served while the slot
    /// has confirmed `confirmed`.
    fn servable(
        &mut self,
        published: &[(TableName, Joined)],
        now: u64,
        confirmed: u64,
    ) -> Vec<(TableName, Joined)> {
        let published: HashMap<&TableName, Joined> =
            published.iter().map(|(table, joined)| (table, *joined)).collect();
        self.0.retain(|table, (joined, _)| published.get(table) == Some(joined));
        let mut servable = Vec::new();
        for (table, joined) in published {
            let (_, seen) = *self.0.entry(table.clone()).or_insert((joined, now));
            if confirmed >= seen {
                servable.push((table.clone(), joined));
            }
        }
        servable.sort_by_key(|(table, _)| table.to_string());
        servable
    }
}

impl RetainedTable {
    /// One batch: rows of `rel` alone (`ONLY`: a relation judged, never a descendant that
    /// was not) older than `$1` (Unix seconds), not kept by id (`$2`) or id prefix (`$3`). By id, with every condition checked again on the rows deleted:
    /// a ctid names a row only within one table, and a partitioned outbox repeats ctids in
    /// every partition (deleting by ctid there emptied young partitions too). A row sharing
    /// an old row's id is deleted only if it is old and published itself. With
    /// `membership`, only while the publication still holds the table by that row (`$4`):
    /// the statement's snapshot is taken once its lock on the table is granted, after any
    /// adoption it waited for, so a table taken out and added back since the pass listed it
    /// (its rows inserted again, not yet published) loses nothing.
    fn delete_batch(&self, rel: &TableName, membership: Option<u32>) -> String {
        let still_joined = match membership {
            Some(_) => {
                " AND EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel \
                   WHERE oid = $4::pg_catalog.oid)"
            }
            None => "",
        };
        let conditions = format!(
            "{created_at} < pg_catalog.to_timestamp($1::pg_catalog.float8) \
             AND NOT ({id}::pg_catalog.text = ANY($2::pg_catalog.text[])) \
             AND NOT EXISTS (SELECT 1 FROM pg_catalog.unnest($3::pg_catalog.text[]) AS p \
                             WHERE pg_catalog.starts_with({id}::pg_catalog.text, p))\
             {still_joined}",
            created_at = quote_ident(&self.created_at),
            id = quote_ident(&self.id),
        );
        format!(
            "DELETE FROM ONLY {table} WHERE {id} = ANY(ARRAY(SELECT {id} FROM ONLY {table} \
             WHERE {conditions} LIMIT {BATCH})) AND {conditions}",
            table = rel.quoted(),
            id = quote_ident(&self.id),
        )
    }
}

/// Where retention deletes, and what tells it a row is published.
pub struct Scope {
    pub tables: Vec<RetainedTable>,
    /// The slot whose confirmed position says a pattern's table is served (see
    /// [`SeenPublished`]), and the publication its tables join.
    pub slot: String,
    pub publication: String,
    /// Whose tables, and whose trigger functions, may run as pgoutbox (`--trusted-owner`).
    pub trusted: TrustedOwners,
    /// What JetStream acknowledged, ahead of the slot by the durability horizon: a table's
    /// adoption is published once either passed it.
    pub acknowledged: crate::service::acknowledgements::LastAcknowledged,
}

/// Deletes published rows older than `keep` from every table until shutdown; errors are
/// logged and retried. Rows in `kept` are never deleted.
pub async fn run(
    database: tokio_postgres::Config,
    tls: crate::postgres::tls::PgTls,
    scope: Scope,
    keep: Duration,
    published: PublishedUpTo,
    kept: KeptRows,
    mut shutdown: Shutdown,
) {
    let every = (keep / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut seen: Vec<SeenPublished> = scope.tables.iter().map(|_| Default::default()).collect();
    let mut refused = HashMap::new();
    let mut client = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = shutdown.requested() => return,
        }
        let Some(published_at) = published.unix_seconds() else { continue };
        let cutoff_unix = published_at - keep.as_secs_f64();
        if client.is_none() {
            match connect(&database, &tls).await {
                Ok(c) => client = Some(c),
                Err(err) => {
                    warn!(error = %err, "retention: cannot connect; will retry");
                    continue;
                }
            }
        }
        for (retained, seen) in scope.tables.iter().zip(&mut seen) {
            let Some(db) = client.as_ref() else { break };
            serve(db, (retained, seen), &scope, cutoff_unix, &kept, &mut refused).await;
            if db.is_closed() {
                client = None;
            }
        }
    }
}

/// A session for retention's deletes, with `row_security` off: a policy that would apply
/// fails the delete instead of running its expression as pgoutbox.
async fn connect(
    database: &tokio_postgres::Config,
    tls: &crate::postgres::tls::PgTls,
) -> Result<tokio_postgres::Client, crate::postgres::admin::SetupError> {
    let client = admin::connect(database, tls).await?;
    client.batch_execute("SET row_security = off").await?;
    Ok(client)
}

/// One pass over one configured entry: its table, or the tables its pattern matches that
/// may be served now. Failures are logged; a refusal of one table's delete leaves the
/// others served, and a lost connection ends the pass. A table pgoutbox may not write
/// (`trust::check_writable`: a delete would run code of an owner not trusted, a rule would
/// rewrite it, an inheritance child would lose rows) is skipped, with a warning when the
/// reason is new (`refused`, by table); else each relation judged (the table, or its
/// partitions) is deleted from with `ONLY`, so that nothing unjudged is reached.
async fn serve(
    db: &tokio_postgres::Client,
    (retained, seen): (&RetainedTable, &mut SeenPublished),
    scope: &Scope,
    cutoff_unix: f64,
    kept: &KeptRows,
    refused: &mut HashMap<String, String>,
) {
    let tables = match &retained.pattern {
        None => vec![(retained.table.clone(), None)],
        Some(pattern) => match servable(db, retained, pattern, scope, seen).await {
            Ok(tables) => tables,
            Err(err) => {
                let error = admin::server_said(&err);
                warn!(error, pattern = %retained.table, "retention: cannot list the tables; will retry");
                return;
            }
        },
    };
    for (table, membership) in tables {
        let judged = match trust::check_writable(db, &table, &scope.trusted).await {
            Ok(judged) => {
                refused.remove(&table.to_string());
                judged
            }
            Err(TrustError::Sql(err)) => {
                warn!(error = %admin::server_said(&err), table = %table,
                    "retention: cannot check the table; will retry");
                return;
            }
            Err(refusal) => {
                let why = refusal.to_string();
                if refused.insert(table.to_string(), why.clone()).as_ref() != Some(&why) {
                    warn!(table = %table, "retention skips the table: {why}");
                }
                continue;
            }
        };
        for rel in &judged {
            let of = (&table, rel);
            if let Err(err) = delete_old(db, retained, of, membership, cutoff_unix, kept).await {
                let error = admin::server_said(&err);
                warn!(error, table = %table, relation = %rel, "retention: delete failed; will retry");
                if db.is_closed() {
                    return;
                }
            }
        }
    }
}

/// Deletes the rows of `rel` (`table` itself or one of its partitions, judged with it) older
/// than `cutoff_unix` and not kept in `table` (while the publication holds `table` by
/// `membership`, if given), a batch at a time, until a batch comes back short or fails;
/// logs and counts what went either way.
async fn delete_old(
    db: &tokio_postgres::Client,
    retained: &RetainedTable,
    (table, rel): (&TableName, &TableName),
    membership: Option<u32>,
    cutoff_unix: f64,
    kept: &KeptRows,
) -> Result<(), tokio_postgres::Error> {
    let sql = retained.delete_batch(rel, membership);
    let (kept_ids, kept_prefixes) = kept.snapshot(&table.to_string());
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        vec![&cutoff_unix, &kept_ids, &kept_prefixes];
    if let Some(membership) = &membership {
        params.push(membership);
    }
    let mut deleted = 0;
    let outcome = loop {
        match db.execute(&sql, &params).await {
            Ok(n) => {
                deleted += n;
                if n < BATCH as u64 {
                    break Ok(());
                }
            }
            Err(err) => break Err(err),
        }
    };
    if deleted > 0 {
        metrics::counter!(crate::service::telemetry::names::RETENTION_DELETED).increment(deleted);
        info!(deleted, table = %table, "retention: deleted published rows");
    }
    outcome
}

/// The tables `pattern` matches that may be served now, each with the `pg_publication_rel`
/// row that holds it in the publication, if any: listed first, then the WAL insert
/// position read, so that every transaction the listing saw committed before it.
async fn servable(
    db: &tokio_postgres::Client,
    retained: &RetainedTable,
    pattern: &TablePattern,
    scope: &Scope,
    seen: &mut SeenPublished,
) -> Result<Vec<(TableName, Option<u32>)>, tokio_postgres::Error> {
    let matched = tenant_tables::matched(db, pattern, &scope.publication).await?;
    let row = db
        .query_one(
            "SELECT pg_catalog.pg_current_wal_insert_lsn(), \
                    (SELECT confirmed_flush_lsn FROM pg_catalog.pg_replication_slots \
                     WHERE slot_name = $1)",
            &[&scope.slot],
        )
        .await?;
    let now = u64::from(row.try_get::<_, PgLsn>(0)?);
    let confirmed = row.try_get::<_, Option<PgLsn>>(1)?.map_or(0, u64::from);
    let confirmed = confirmed.max(scope.acknowledged.up_to());
    // A table without the pattern's columns has its rows dead-lettered, not deleted; a
    // table of another owner is never written: its delete triggers would run as pgoutbox.
    let fits = |m: &tenant_tables::Matched| {
        m.owned && [&retained.created_at, &retained.id].iter().all(|c| m.columns.contains(c))
    };
    let published: Vec<(TableName, Joined)> = matched
        .into_iter()
        .filter(|m| m.published && fits(m))
        .map(|m| (m.table, Joined { oid: m.oid, membership: m.membership }))
        .collect();
    let servable = seen.servable(&published, now, confirmed);
    Ok(servable.into_iter().map(|(table, joined)| (table, joined.membership)).collect())
}

#[cfg(test)]
mod tests;
