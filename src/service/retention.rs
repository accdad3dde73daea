//! `--retention`: deleting outbox rows that are old *and* already published, in small
//! batches, so the tables do not grow forever. Every configured table is served, each by
//! its own created-at and id columns.
//!
//! "Published" is known from the pipeline: it records the commit time of the newest
//! transaction confirmed to Postgres; transactions are published in commit order, so every
//! row committed before it is in JetStream. A row is deleted only when its created-at
//! column is older than that commit time minus the retention. (A keepalive confirmed while
//! idle says nothing about *when* the rows behind it committed, so it does not count: on an
//! idle outbox the last rows wait for the next transaction.) This assumes no transaction writing the outbox stays open longer than the
//! retention (its rows could carry an older created_at than their commit). Logical
//! decoding reads the WAL, not the table, so even then no event would be lost: only the
//! copy kept in the table for manual recovery.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use tracing::{info, warn};

use crate::domain::outbox::TRUNCATED;
use crate::postgres::admin::{self, TableName};
use crate::postgres::wire::PG_EPOCH_OFFSET_MICROS;
use crate::service::shutdown::Shutdown;
use postgres_protocol::escape::escape_identifier as quote_ident;

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

    fn get(&self) -> Option<i64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|t| *t > 0)
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

/// A table retention serves, and the columns it reads there.
pub struct RetainedTable {
    pub table: TableName,
    pub created_at: String,
    pub id: String,
}

impl RetainedTable {
    /// One batch: rows of this table older than `$1` (Unix seconds), not kept by id (`$2`)
    /// or id prefix (`$3`). By id, with every condition checked again on the rows deleted:
    /// a ctid names a row only within one table, and a partitioned outbox repeats ctids in
    /// every partition (deleting by ctid there emptied young partitions too). A row sharing
    /// an old row's id is deleted only if it is old and published itself.
    fn delete_batch(&self) -> String {
        let conditions = format!(
            "{created_at} < to_timestamp($1::float8) AND NOT ({id}::text = ANY($2::text[])) \
             AND NOT EXISTS (SELECT 1 FROM unnest($3::text[]) AS p WHERE starts_with({id}::text, p))",
            created_at = quote_ident(&self.created_at),
            id = quote_ident(&self.id),
        );
        format!(
            "DELETE FROM {table} WHERE {id} = ANY(ARRAY(SELECT {id} FROM {table} \
             WHERE {conditions} LIMIT {BATCH})) AND {conditions}",
            table = self.table.quoted(),
            id = quote_ident(&self.id),
        )
    }
}

/// Deletes published rows older than `keep` from every table until shutdown; errors are
/// logged and retried. Rows in `kept` are never deleted.
pub async fn run(
    database: tokio_postgres::Config,
    tls: crate::postgres::tls::PgTls,
    tables: Vec<RetainedTable>,
    keep: Duration,
    published: PublishedUpTo,
    kept: KeptRows,
    mut shutdown: Shutdown,
) {
    let every = (keep / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let deleted_total = metrics::counter!(crate::service::telemetry::names::RETENTION_DELETED);
    let statements: Vec<String> = tables.iter().map(RetainedTable::delete_batch).collect();
    let mut client = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = shutdown.requested() => return,
        }
        let Some(published_at) = published.get() else { continue };
        let cutoff_unix = (published_at + PG_EPOCH_OFFSET_MICROS) as f64 / 1e6 - keep.as_secs_f64();
        if client.is_none() {
            match admin::connect(&database, &tls).await {
                Ok(c) => client = Some(c),
                Err(err) => {
                    warn!(error = %err, "retention: cannot connect; will retry");
                    continue;
                }
            }
        }
        for (retained, sql) in tables.iter().zip(&statements) {
            let Some(db) = client.as_ref() else { break };
            let table = retained.table.to_string();
            let (kept_ids, kept_prefixes) = kept.snapshot(&table);
            let mut deleted = 0;
            loop {
                match db.execute(sql, &[&cutoff_unix, &kept_ids, &kept_prefixes]).await {
                    Ok(n) => {
                        deleted += n;
                        if n < BATCH as u64 {
                            break;
                        }
                    }
                    Err(err) => {
                        let error = admin::server_said(&err);
                        warn!(error, table = %table, "retention: delete failed; will retry");
                        // A refusal of this table's delete leaves the others served.
                        if db.is_closed() {
                            client = None;
                        }
                        break;
                    }
                }
            }
            if deleted > 0 {
                deleted_total.increment(deleted);
                info!(deleted, table = %table, "retention: deleted published rows");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_time_only_moves_forward() {
        let p = PublishedUpTo::default();
        assert_eq!(p.get(), None);
        p.advance(10);
        p.advance(5);
        assert_eq!(p.get(), Some(10));
    }

    #[test]
    fn kept_rows_are_kept_in_their_own_table_only() {
        let kept = KeptRows::default();
        kept.keep("public.outbox", "7".into());
        kept.keep_letter_id("billing.outbox", &format!("long{TRUNCATED}"));
        assert_eq!(kept.snapshot("public.outbox"), (vec!["7".to_owned()], vec![]));
        assert_eq!(kept.snapshot("billing.outbox"), (vec![], vec!["long".to_owned()]));
        assert_eq!(kept.snapshot("other.outbox"), (vec![], vec![]));
    }
}
