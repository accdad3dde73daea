//! The outbox table as a new slot's exported snapshot shows it: exactly the rows that slot
//! will never send. Read by the seed (`service::seed`) when a lost slot is recovered or a
//! new stream is backfilled, and, in a snapshot of its own, by `pgoutbox replay`.
//!
//! One SQL session holds a `REPEATABLE READ` transaction that imported the snapshot, for as
//! long as the seed lasts: every attempt reads the same rows in the same order, so a row
//! keeps its place (its index) from one attempt to the next, and what the publish protocol
//! remembers by position stays true. Rows are read through a cursor, a batch at a time, by
//! a task of their own: a query future dropped halfway would lose its batch, a channel
//! receive loses nothing.

use std::sync::Arc;

use bytes::Bytes;
use postgres_protocol::escape::{escape_identifier, escape_literal};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::domain::outbox::ColumnRoles;
use crate::domain::row::{Column, ColumnValue, Relation};
use crate::postgres::admin::{self, SetupError, TableName};
use crate::postgres::tls::PgTls;
use crate::postgres::trust::{self, TrustedOwners};

mod order;

pub use order::insert_order;
use order::tagged_query;

/// Rows per `FETCH`.
const BATCH: usize = 1_000;

/// How rows are ordered, best first: what the table allows. Ties (the rows of one
/// transaction share its commit time, and `created_at DEFAULT now()` its start time) are
/// broken by transaction id, then by the row's place in the table, which is the order a
/// transaction inserted its rows unless they went into space freed by deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// `track_commit_timestamp = on`: commit order (rows committed before it was turned
    /// on, or frozen since, have none and come first, by their created-at time).
    CommitTime,
    /// The created-at column, then the id: a transaction that stayed open for a while
    /// inserted rows with an earlier time than rows committed before it.
    CreatedAt,
}

impl std::fmt::Display for RowOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RowOrder::CommitTime => "commit order (track_commit_timestamp)",
            RowOrder::CreatedAt => "created-at order (track_commit_timestamp is off)",
        })
    }
}

/// Which rows to read.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// Every row with an order key (epoch seconds) of at least this; all rows when `None`.
    Since(Option<f64>),
    /// The rows with these ids.
    Ids(Vec<String>),
    /// The rows whose created-at column lies in `[from, to)`, each a timestamptz literal;
    /// a side left out is open.
    Created { from: Option<String>, to: Option<String> },
}

/// A batch of rows as pgoutput would have sent them (text values), or the read's failure.
pub type RowBatch = Result<Vec<Vec<ColumnValue>>, tokio_postgres::Error>;

/// A batch of rows of several tables, each with the index of its table in the order they
/// were given to [`TableSnapshot::read_set`], or the read's failure.
pub type TaggedBatch = Result<Vec<(usize, Vec<ColumnValue>)>, tokio_postgres::Error>;

/// The outbox tables frozen at one snapshot: one table for `pgoutbox replay`, every
/// configured table for the seed.
pub struct TableSnapshot {
    client: Arc<Client>,
    order: RowOrder,
    /// Never empty.
    tables: Vec<SnapshotTable>,
}

/// One table of a snapshot.
struct SnapshotTable {
    relation: Relation,
    /// The SQL of the order key, an epoch in seconds (`float8`).
    key: String,
    /// The id column, quoted.
    id: String,
    /// A transaction's rows in insert order ([`insert_order`]).
    insert_order: String,
    /// The created-at column, quoted.
    created_at: String,
    table: String,
}

impl TableSnapshot {
    /// A session in a `REPEATABLE READ` transaction, `snapshot` imported when given: what
    /// [`TableSnapshot::read_set`] reads from, and where the seed asks which tables a
    /// pattern matches in that same snapshot.
    pub async fn session(
        database: &tokio_postgres::Config,
        tls: &PgTls,
        snapshot: Option<&str>,
    ) -> Result<Client, SetupError> {
        let client = admin::connect(database, tls).await?;
        // A policy's expression would run as pgoutbox, and hide rows in silence: with
        // row_security off, a policy that applies fails the read instead.
        client
            .batch_execute(
                "SET row_security = off; BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
            )
            .await?;
        if let Some(snapshot) = snapshot {
            let import = format!("SET TRANSACTION SNAPSHOT {}", escape_literal(snapshot));
            client.batch_execute(&import).await?;
        }
        Ok(client)
    }

    /// Tables (at least one) in `client`'s snapshot, each with its own roles, their columns
    /// as pgoutput names them (generated columns left out, as pgoutput leaves them out).
    /// A table whose owner is not `trusted` is refused before any query is planned on it.
    pub async fn read_set(
        client: Client,
        tables: &[(&TableName, &ColumnRoles)],
        trusted: &TrustedOwners,
    ) -> Result<TableSnapshot, SetupError> {
        for (table, _) in tables {
            trust::check(&client, table, trusted).await?;
        }
        let tracked: String = client.query_one("SHOW track_commit_timestamp", &[]).await?.get(0);
        let order = match tracked == "on" {
            true => RowOrder::CommitTime,
            false => RowOrder::CreatedAt,
        };
        let mut read = Vec::with_capacity(tables.len());
        for (table, roles) in tables {
            read.push(SnapshotTable::read(&client, order, table, roles).await?);
        }
        if read.is_empty() {
            return Err(SetupError::SeedOrder { table: "(no table)".to_owned() });
        }
        Ok(TableSnapshot { client: Arc::new(client), order, tables: read })
    }

    /// The (first) table's columns, for the row mapping.
    pub fn relation(&self) -> &Relation {
        &self.tables[0].relation
    }

    /// Every table's columns, in the order the tables were given.
    pub fn relations(&self) -> impl Iterator<Item = &Relation> {
        self.tables.iter().map(|table| &table.relation)
    }

    pub fn order(&self) -> RowOrder {
        self.order
    }

    /// Whether the session holding the snapshot is gone (then so is the snapshot).
    pub fn is_lost(&self) -> bool {
        self.client.is_closed()
    }

    /// The smallest order key (epoch seconds) of every table; `None` when all are empty.
    pub async fn oldest_key(&self) -> Result<Option<f64>, tokio_postgres::Error> {
        let mut oldest: Option<f64> = None;
        for table in &self.tables {
            let sql = format!("SELECT pg_catalog.min({}) FROM {}", table.key, table.table);
            let key: Option<f64> = self.client.query_one(&sql, &[]).await?.get(0);
            oldest = match (oldest, key) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(oldest)
    }

    /// The rows of table `index` (in the order given) whose id reads `id` (one, unless the
    /// id column is not unique), each with its order key (epoch seconds), as pgoutput would
    /// have sent them.
    pub async fn rows_with_id(
        &self,
        index: usize,
        id: &str,
    ) -> Result<Vec<(Option<f64>, Vec<ColumnValue>)>, tokio_postgres::Error> {
        let Some(table) = self.tables.get(index) else { return Ok(Vec::new()) };
        let sql = format!(
            "SELECT {}, {} FROM {} WHERE {}::pg_catalog.text = {}",
            table.key,
            table.columns().join(", "),
            table.table,
            table.id,
            escape_literal(id)
        );
        let rows = text_rows(&self.client.simple_query(&sql).await?);
        Ok(rows
            .into_iter()
            .filter_map(|mut row| {
                let key = match row.first()? {
                    ColumnValue::Text(text) => std::str::from_utf8(text).ok()?.parse().ok(),
                    _ => None,
                };
                row.remove(0);
                Some((key, row))
            })
            .collect())
    }

    /// How many rows `selection` holds, in every table.
    pub async fn count(&self, selection: &Selection) -> Result<u64, tokio_postgres::Error> {
        let mut total = 0;
        for table in &self.tables {
            let sql = format!(
                "SELECT pg_catalog.count(*) FROM {}{}",
                table.table,
                table.filter(selection)
            );
            let count: i64 = self.client.query_one(&sql, &[]).await?.get(0);
            total += count.max(0) as u64;
        }
        Ok(total)
    }

    /// Up to `limit` ids of the (first) table, whichever come first: how its ids look, for
    /// a selection that matched none.
    pub async fn some_ids(&self, limit: i64) -> Result<Vec<String>, tokio_postgres::Error> {
        let table = &self.tables[0];
        let sql = format!("SELECT {}::pg_catalog.text FROM {} LIMIT $1", table.id, table.table);
        let rows = self.client.query(&sql, &[&limit]).await?;
        Ok(rows.iter().filter_map(|row| row.get::<_, Option<String>>(0)).collect())
    }

    /// Reads the rows of `selection` of the (first) table, in order, from the first, a
    /// batch at a time into the returned channel; the reader stops when the handle drops.
    pub fn read(&self, selection: &Selection) -> (mpsc::Receiver<RowBatch>, Reader) {
        let (tx, rx) = mpsc::channel(2);
        let (rows, reader) = self.read_query(tagged_query(&self.tables[..1], selection), 0);
        let task = tokio::spawn(forward(rows, tx, |batch| {
            batch.into_iter().map(|(_, tuple)| tuple).collect()
        }));
        (rx, Reader::both(reader, task.abort_handle()))
    }

    /// Reads the rows of `selection` of every table in one order (see [`tagged_query`]),
    /// each with its table's index, a batch at a time, past the first `skip` (which the
    /// server passes over without sending them); the reader stops when the handle drops.
    pub fn read_all(
        &self,
        selection: &Selection,
        skip: u64,
    ) -> (mpsc::Receiver<TaggedBatch>, Reader) {
        self.read_query(tagged_query(&self.tables, selection), skip)
    }

    fn read_query(&self, query: String, skip: u64) -> (mpsc::Receiver<TaggedBatch>, Reader) {
        let (tx, rx) = mpsc::channel(2);
        let client = Arc::clone(&self.client);
        let widths: Vec<usize> = self.tables.iter().map(|t| t.relation.columns.len()).collect();
        let mut declare = format!("CLOSE ALL; DECLARE pgoutbox_seed NO SCROLL CURSOR FOR {query}");
        if skip > 0 {
            declare.push_str(&format!("; MOVE FORWARD {skip} IN pgoutbox_seed"));
        }
        let task = tokio::spawn(async move {
            if let Err(err) = client.batch_execute(&declare).await {
                let _ = tx.send(Err(err)).await;
                return;
            }
            loop {
                let fetched =
                    client.simple_query(&format!("FETCH {BATCH} FROM pgoutbox_seed")).await;
                let batch = fetched.map(|messages| tagged_rows(&messages, &widths));
                let done = batch.as_ref().map_or(true, Vec::is_empty);
                if tx.send(batch).await.is_err() || done {
                    return;
                }
            }
        });
        (rx, Reader::one(task.abort_handle()))
    }

    /// Ends the snapshot's transaction.
    pub async fn close(self) {
        let _ = self.client.batch_execute("COMMIT").await;
    }
}

impl SnapshotTable {
    /// The table's columns and order key, in the snapshot's session.
    async fn read(
        client: &Client,
        order: RowOrder,
        table: &TableName,
        roles: &ColumnRoles,
    ) -> Result<SnapshotTable, SetupError> {
        let relation = relation_of(client, table).await?;
        let columns = &relation.columns;
        let has = |name: &str| columns.iter().any(|c| c.name == name);
        let created_at = escape_identifier(&roles.created_at);
        let key = match (order, has(&roles.created_at)) {
            (RowOrder::CommitTime, true) => format!(
                "extract(epoch FROM \
                 coalesce(pg_catalog.pg_xact_commit_timestamp(xmin), {created_at}))"
            ),
            (RowOrder::CommitTime, false) => {
                "coalesce(extract(epoch FROM pg_catalog.pg_xact_commit_timestamp(xmin)), 0)"
                    .to_owned()
            }
            (RowOrder::CreatedAt, true) => format!("extract(epoch FROM {created_at})"),
            (RowOrder::CreatedAt, false) => {
                return Err(SetupError::SeedOrder { table: table.to_string() });
            }
        };
        let insert_order = insert_order(&relation, &roles.id);
        Ok(SnapshotTable {
            relation,
            key: format!("{key}::pg_catalog.float8"),
            id: escape_identifier(&roles.id),
            insert_order,
            created_at,
            table: table.quoted(),
        })
    }

    fn columns(&self) -> Vec<String> {
        self.relation.columns.iter().map(|c| escape_identifier(&c.name)).collect()
    }

    fn filter(&self, selection: &Selection) -> String {
        match selection {
            Selection::Since(None) => String::new(),
            Selection::Since(Some(since)) => format!(" WHERE {} >= {since:?}", self.key),
            Selection::Ids(ids) if ids.is_empty() => " WHERE false".to_owned(),
            Selection::Ids(ids) => {
                let ids: Vec<String> = ids.iter().map(|id| escape_literal(id)).collect();
                format!(" WHERE {}::pg_catalog.text IN ({})", self.id, ids.join(", "))
            }
            Selection::Created { from, to } => {
                let mut conditions = vec!["true".to_owned()];
                if let Some(from) = from {
                    let from = escape_literal(from);
                    conditions
                        .push(format!("{} >= {from}::pg_catalog.timestamptz", self.created_at));
                }
                if let Some(to) = to {
                    conditions.push(format!(
                        "{} < {}::pg_catalog.timestamptz",
                        self.created_at,
                        escape_literal(to)
                    ));
                }
                format!(" WHERE {}", conditions.join(" AND "))
            }
        }
    }
}

/// `table`'s columns as pgoutput names them (generated columns left out, as pgoutput leaves
/// them out), with its OID: the Relation message pgoutput would send for it.
pub async fn relation_of(
    client: &impl tokio_postgres::GenericClient,
    table: &TableName,
) -> Result<Relation, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT c.oid, a.attname::pg_catalog.text, a.atttypid, a.atttypmod \
             FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             WHERE a.attrelid = $1::pg_catalog.text::pg_catalog.regclass \
               AND a.attnum > 0 AND NOT a.attisdropped \
               AND a.attgenerated = '' ORDER BY a.attnum",
            &[&table.quoted()],
        )
        .await?;
    let columns = rows
        .iter()
        .map(|row| Column {
            flags: 0,
            name: row.get(1),
            type_oid: row.get(2),
            type_modifier: row.get(3),
        })
        .collect();
    Ok(Relation {
        rel_id: rows.first().map(|row| row.get::<_, u32>(0)).unwrap_or_default(),
        namespace: table.schema.clone(),
        name: table.name.clone(),
        replica_identity: b'd',
        columns,
    })
}

/// The tasks reading rows; stopped when dropped.
pub struct Reader(Vec<AbortHandle>);

impl Reader {
    fn one(task: AbortHandle) -> Reader {
        Reader(vec![task])
    }

    fn both(mut first: Reader, second: AbortHandle) -> Reader {
        first.0.push(second);
        first
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Passes each batch of `rows` on to `tx`, changed by `each`, until either side ends.
async fn forward<T: Send + 'static>(
    mut rows: mpsc::Receiver<TaggedBatch>,
    tx: mpsc::Sender<Result<T, tokio_postgres::Error>>,
    each: impl Fn(Vec<(usize, Vec<ColumnValue>)>) -> T + Send + 'static,
) {
    while let Some(batch) = rows.recv().await {
        if tx.send(batch.map(&each)).await.is_err() {
            return;
        }
    }
}

/// The rows of a tagged read: the first value, the table's index, taken off each row, and
/// the padding past its table's `widths` cut. A row whose index cannot be read (never: the
/// query writes it) goes to the first table.
fn tagged_rows(
    messages: &[SimpleQueryMessage],
    widths: &[usize],
) -> Vec<(usize, Vec<ColumnValue>)> {
    text_rows(messages)
        .into_iter()
        .map(|mut row| {
            let index = match row.first() {
                Some(ColumnValue::Text(text)) => std::str::from_utf8(text)
                    .ok()
                    .and_then(|text| text.parse::<usize>().ok())
                    .filter(|&index| index < widths.len())
                    .unwrap_or(0),
                _ => 0,
            };
            if !row.is_empty() {
                row.remove(0);
            }
            if widths.len() > 1 {
                row.truncate(widths[index]);
            }
            (index, row)
        })
        .collect()
}

/// The rows of a simple query's answer as pgoutput's text tuples.
pub fn text_rows(messages: &[SimpleQueryMessage]) -> Vec<Vec<ColumnValue>> {
    messages
        .iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| match row.get(i) {
                        Some(text) => ColumnValue::Text(Bytes::copy_from_slice(text.as_bytes())),
                        None => ColumnValue::Null,
                    })
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}
