//! Seeding the stream from the outbox table: recovery after a lost slot (`--recover`) and
//! a new stream's history (`--backfill`).
//!
//! A new slot is created under a temporary name, `<slot>_seed`, exporting the snapshot at
//! which it became consistent: every committed row is either visible in that snapshot or
//! decoded from the slot later, never both. The rows of the snapshot that the stream does
//! not hold yet are published first, through the same pipeline and publish protocol as
//! decoded rows (chained, dead letters in place, a row refused for itself retried once),
//! as if they were one transaction at position `0/0:<index>`; then the temporary slot is
//! copied to the real name and dropped, and streaming goes on from the consistent point.
//! Until that copy the real slot does not exist, so a seed cut short by a crash is never
//! mistaken for a finished one: the next `--recover` or `--backfill` drops the temporary
//! slot and seeds again, and the rows the first try stored are then held by the stream.
//! Since every try makes its own slot, a seed that stops for good or is shut down drops its
//! slot before the process exits, so that it does not pin WAL meanwhile.
//!
//! Which rows the stream holds is decided by row id and payload, read from the stream itself
//! (an id alone would take a row that reused an older message's id for that message):
//! - `--backfill`: every message of the stream (a new stream holds none).
//! - `--recover`: the messages stored since `margin` before the *bound*, where the bound is
//!   the order key (commit time, or created-at time) of the row of the stream's last
//!   message, less `margin`. Rows with an older key were committed before that message and
//!   are in the stream, since the chain leaves no gap; rows at or past the bound are
//!   published unless the stream holds their id. The bound travels in the
//!   `Pgoutbox-Seed-Since` header of every seeded message, so a second try after a crash
//!   uses the first try's bound.
//!
//! The margin absorbs clock differences between Postgres and NATS, and, without
//! `track_commit_timestamp`, transactions that stayed open: a row inserted more than the
//! margin before its transaction committed, committed while no slot existed, is missed.
//!
//! The tables read are the named ones and, for a pattern, each table it matches that is in
//! the publication, as the snapshot shows them: a matching table not yet published has had
//! none of its rows decoded, and adopting it once the new slot exists hands every row over
//! to that slot (a recovery never joins such a table before its slot: `commands::setup`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::domain::outbox::{MappingError, RowMapping};
use crate::domain::progress::Position;
use crate::domain::retry::Failure;
use crate::domain::row::ColumnValue;
use crate::domain::seed::{EventPayload, HeldRows, SEED_HEADER, SEED_SINCE_HEADER, payload_digest};
use crate::nats::publisher::{Publisher, PublisherError, ReadFrom};
use crate::postgres::admin::{self, SetupError};
use crate::postgres::table_snapshot::{Reader, Selection, TableSnapshot, TaggedBatch};
use crate::postgres::walsender::ExportedSnapshot;
use crate::postgres::{ConnectionError, ReplicationConnection};
use crate::service::shutdown::Shutdown;
use crate::settings::config::Config;

mod bound;
mod tables;
mod temporary_slot;

use bound::bound;
use tables::tables_in_snapshot;
pub use temporary_slot::seed_slot;
use temporary_slot::{DROP_LIMIT, NOT_DROPPED, drop_slot_of, promote_seed_slot};

/// How far back from the tail the rows of messages are looked for in the table.
const ANCHOR_SEARCH: u64 = 100;

/// What is seeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedKind {
    /// A lost or dropped slot: the rows committed while none existed.
    Recover,
    /// A new stream: the table's history.
    Backfill,
}

impl SeedKind {
    /// What `--recover` or `--backfill` asks for (`--recover` first); `None` for neither.
    pub fn asked(recover: bool, backfill: bool) -> Option<SeedKind> {
        match (recover, backfill) {
            (true, _) => Some(SeedKind::Recover),
            (_, true) => Some(SeedKind::Backfill),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    #[error("reading the stream for the seed: {0}")]
    Stream(#[from] PublisherError),
    #[error("reading the table for the seed: {0}")]
    Sql(#[from] tokio_postgres::Error),
    #[error(
        "none of the stream's last {ANCHOR_SEARCH} messages has its row in the table, so where \
         the rows missing from the stream begin is unknown: use --backfill instead of \
         --recover (it compares every message of the stream with the table)"
    )]
    NoAnchor,
    #[error("the task reading the table for the seed stopped before the last row")]
    ReaderGone,
    #[error(transparent)]
    Mapping(#[from] MappingError),
    #[error(
        "slot {slot} is in use by another process (pid {pid:?}) seeding this stream: two \
         pgoutbox started with --recover or --backfill for one slot; stop the other one"
    )]
    SeedElsewhere { slot: String, pid: Option<i32> },
    #[error(
        "slot {slot} was dropped and made again by another pgoutbox seeding this stream (two \
         started with --recover or --backfill for one slot); stop the other one, then run \
         this one again with the same flag"
    )]
    SlotReplaced { slot: String },
    #[error("slot name {0:?} plus \"_seed\" exceeds Postgres's 63 bytes: choose a shorter --slot")]
    SlotNameTooLong(String),
    #[error(
        "no table to seed: no table is named and the patterns ({0}) match no table in \
         publication {1}; run without --recover or --backfill"
    )]
    NoTable(String, String),
}

impl SeedError {
    /// Whether trying again can help: a lost connection can, a missing anchor cannot.
    pub fn failure(&self) -> Failure {
        match self {
            SeedError::Stream(_) => Failure::Nats,
            SeedError::Connection(_) | SeedError::Sql(_) | SeedError::ReaderGone => {
                Failure::Postgres
            }
            SeedError::Setup(SetupError::Connect(_) | SetupError::Sql(_)) => Failure::Postgres,
            SeedError::Setup(_)
            | SeedError::NoAnchor
            | SeedError::SlotNameTooLong(_)
            | SeedError::SeedElsewhere { .. }
            | SeedError::SlotReplaced { .. }
            | SeedError::NoTable(..)
            | SeedError::Mapping(_) => Failure::Fatal,
        }
    }
}

/// A seed under way: its slot, its snapshot and what the stream holds.
pub struct Seed {
    /// The temporary slot, `<slot>_seed`.
    pub slot: String,
    /// Where the slot starts: the snapshot holds every row committed before.
    pub consistent_point: u64,
    snapshot: TableSnapshot,
    /// Each table's mapping, in the snapshot's order, by its entry (a pattern's entry for
    /// each table it matched).
    mappings: Vec<Arc<RowMapping>>,
    /// The bound (see the module doc), epoch seconds; `None`: every row.
    since: Option<f64>,
    /// The rows the stream holds already, as read up to `read_up_to`.
    held: HeldRows,
    /// Each table's `Pgoutbox-Table` and payload column (as letters name it), snapshot order.
    tables: Vec<(String, String)>,
    read_up_to: u64,
    /// How many rows, from the first in the snapshot's order, the stream is known to hold:
    /// an attempt reads the table past them, so that each attempt cut short (every
    /// scheduled row delivered at once cuts one) does not read again what earlier ones
    /// published.
    held_prefix: u32,
    /// Rows the seed reads; how many were published or found held so far.
    pub total: u64,
    pub done: u64,
}

impl Seed {
    /// Creates the temporary slot (dropping one left by an earlier try), imports its
    /// snapshot and reads what the stream holds. `None`: shutdown was asked for first (the
    /// slot, if the server made it, dropped again, answered or not).
    pub async fn begin(
        config: &Config,
        publisher: &Publisher,
        kind: SeedKind,
        margin: Duration,
        shutdown: &mut Shutdown,
    ) -> Result<Option<Seed>, SeedError> {
        let slot = seed_slot(&config.slot)?;
        let client = admin::connect(&config.database, &config.pg_tls).await?;
        if let Some(state) = admin::slot_state(&client, &slot).await? {
            if state.active {
                return Err(SeedError::SeedElsewhere { slot, pid: state.active_pid });
            }
            warn!(%slot, "dropping the slot of an earlier seed that did not finish");
            admin::teardown_slot(&client, &slot).await?;
        }
        let make = async {
            let mut conn = ReplicationConnection::connect(&config.database, &config.pg_tls).await?;
            let exported = conn.create_slot_exporting_snapshot(&slot).await?;
            Ok::<_, SeedError>((conn, exported))
        };
        let made = tokio::select! {
            made = make => Some(made?),
            () = shutdown.requested() => None,
        };
        let Some((conn, exported)) = made else {
            drop_slot_of(&client, &slot, None).await;
            return Ok(None);
        };
        let consistent_point = exported.consistent_point;
        let read = Seed::read(config, publisher, kind, margin, slot.clone(), exported, conn);
        let seed = tokio::select! {
            seed = read => seed.map(Some),
            () = shutdown.requested() => Ok(None),
        };
        if !matches!(seed, Ok(Some(_))) {
            // A next try makes a slot of its own: this one would only pin WAL.
            drop_slot_of(&client, &slot, Some(consistent_point)).await;
        }
        seed
    }

    /// The rest of [`Seed::begin`], once the temporary slot is made: its snapshot imported
    /// (then the exporting connection `conn` closed), the tables read, the stream compared.
    async fn read(
        config: &Config,
        publisher: &Publisher,
        kind: SeedKind,
        margin: Duration,
        slot: String,
        exported: ExportedSnapshot,
        conn: ReplicationConnection,
    ) -> Result<Seed, SeedError> {
        let session =
            TableSnapshot::session(&config.database, &config.pg_tls, Some(&exported.name)).await?;
        let entries = tables_in_snapshot(&session, config).await?;
        let tables: Vec<_> = entries.iter().map(|e| (&e.table, &e.roles)).collect();
        let snapshot = TableSnapshot::read_set(session, &tables, &config.trusted_owners).await?;
        // Imported: the exporting session may go.
        conn.terminate().await;
        let mappings = entries
            .iter()
            .zip(snapshot.relations())
            .map(|(entry, relation)| RowMapping::of_entry(relation, entry).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let tables: Vec<(String, String)> = mappings
            .iter()
            .zip(&entries)
            .map(|(mapping, entry)| {
                (mapping.source_table().to_owned(), entry.roles.payload.clone())
            })
            .collect();
        let margin = margin.as_secs_f64();
        let since = match kind {
            SeedKind::Backfill => None,
            SeedKind::Recover => bound(publisher, &snapshot, &mappings, margin).await?,
        };
        let from = since.map_or(ReadFrom::Start, |since| ReadFrom::Time(since - margin));
        let (held, read_up_to) = publisher.held_rows(from, &tables, None).await?;
        let total = snapshot.count(&Selection::Since(since)).await?;
        info!(
            %slot,
            kind = ?kind,
            tables = tables.len(),
            consistent_point = %tokio_postgres::types::PgLsn::from(exported.consistent_point),
            order = %snapshot.order(),
            rows = total,
            held_in_stream = held.len(),
            "seeding the stream from the table"
        );
        Ok(Seed {
            slot,
            consistent_point: exported.consistent_point,
            snapshot,
            mappings,
            since,
            held,
            tables,
            read_up_to,
            held_prefix: 0,
            total,
            done: 0,
        })
    }

    /// Adds what the stream gained since it was last read (an earlier attempt's rows, or
    /// copies an abandoned connection wrote late), so that an attempt sends again only
    /// what the stream lacks instead of being refused behind each row it has.
    pub async fn catch_up(&mut self, publisher: &Publisher) -> Result<(), SeedError> {
        let from = ReadFrom::After(self.read_up_to);
        let (held, last) = publisher.held_rows(from, &self.tables, None).await?;
        self.held.extend(held);
        self.read_up_to = self.read_up_to.max(last);
        Ok(())
    }

    /// Checks, before an attempt streams from it, that the temporary slot is the one this
    /// seed made: nothing is confirmed past its consistent point until the seed finishes,
    /// so a slot that stands elsewhere was dropped and made again by another pgoutbox
    /// (two started with `--recover`), and the rows between the two snapshots would be
    /// lost or reordered.
    pub async fn check_slot(&self, config: &Config) -> Result<(), SeedError> {
        let client = admin::connect(&config.database, &config.pg_tls).await?;
        let state = admin::slot_state(&client, &self.slot).await?;
        let confirmed = state
            .and_then(|state| state.confirmed_flush_lsn)
            .and_then(|lsn| lsn.parse::<tokio_postgres::types::PgLsn>().ok())
            .map(u64::from);
        if confirmed != Some(self.consistent_point) {
            return Err(SeedError::SlotReplaced { slot: self.slot.clone() });
        }
        Ok(())
    }

    /// Whether the snapshot was lost with its session: the seed must begin again.
    pub fn is_lost(&self) -> bool {
        self.snapshot.is_lost()
    }

    /// The rows to publish for one attempt, from the first the stream is not known to hold:
    /// every table's, each mapped by its own table's entry.
    pub fn prelude(&mut self) -> Prelude {
        let skip = self.held_prefix;
        let (rows, reader) = self.snapshot.read_all(&Selection::Since(self.since), skip.into());
        if skip > 0 {
            info!(rows = skip, "the seed goes on past the rows the stream holds");
        }
        self.done = skip.into();
        let mut marks = vec![(
            SEED_HEADER,
            tokio_postgres::types::PgLsn::from(self.consistent_point).to_string(),
        )];
        if let Some(since) = self.since {
            marks.push((SEED_SINCE_HEADER, format!("{since:.6}")));
        }
        Prelude {
            rows,
            _reader: reader,
            batch: Vec::new().into_iter(),
            mappings: self.mappings.clone(),
            next_index: skip,
            finished: false,
            marks,
        }
    }

    /// Whether the stream holds the row `tuple`: a message with its id and its payload (or
    /// its dead letter). A message with its id and another payload is another row's event.
    /// The table is the mapping's: the same id in two tables is two rows.
    /// [`Seed::holds`] for the row at `position`, counting it into the rows later attempts
    /// pass over when every row before it is held too.
    pub fn holds_at(
        &mut self,
        position: Position,
        mapping: &RowMapping,
        tuple: &[ColumnValue],
    ) -> bool {
        let held = self.holds(mapping, tuple);
        if held && position.index == self.held_prefix {
            self.held_prefix += 1;
        }
        held
    }

    fn holds(&self, mapping: &RowMapping, tuple: &[ColumnValue]) -> bool {
        let Some(id) = mapping.row_id(tuple) else { return false };
        let table = mapping.source_table();
        if !self.held.has_id(table, &id) {
            return false;
        }
        let event = mapping.map(tuple).ok();
        let event = event.as_ref().map(|event| EventPayload::new(&event.payload));
        let payload = mapping.payload_text(tuple).map(|text| payload_digest(text.as_bytes()));
        self.held.holds(table, &id, event.as_ref(), payload)
    }

    /// The seed will not finish in this process (a fatal error, a shutdown): its slot is
    /// dropped, since a later `--recover` or `--backfill` makes a new one from a new snapshot
    /// and this one would pin WAL until then.
    pub async fn abandon(self, config: &Config) {
        let Seed { snapshot, slot, consistent_point, .. } = self;
        let connect = async {
            snapshot.close().await;
            admin::connect(&config.database, &config.pg_tls).await
        };
        match tokio::time::timeout(DROP_LIMIT, connect).await {
            Ok(Ok(client)) => drop_slot_of(&client, &slot, Some(consistent_point)).await,
            Ok(Err(err)) => warn!(%slot, %err, "{NOT_DROPPED}"),
            Err(_) => warn!(%slot, limit = ?DROP_LIMIT, "Postgres did not answer: {NOT_DROPPED}"),
        }
    }

    /// Every row is in the stream: the temporary slot becomes the slot.
    pub async fn finish(self, config: &Config, slot: &str) -> Result<(), SeedError> {
        let Seed { snapshot, slot: seed_slot, total, .. } = self;
        snapshot.close().await;
        let client = admin::connect(&config.database, &config.pg_tls).await?;
        promote_seed_slot(&client, &seed_slot, slot).await?;
        info!(%slot, rows = total, "seed finished; streaming from the slot");
        Ok(())
    }
}

/// A row of the seed: its position, its table's mapping and its values.
pub type SeedRow = (Position, Arc<RowMapping>, Vec<ColumnValue>);

/// The seed's rows as one attempt publishes them: one transaction at commit LSN 0, each
/// row at its index in the snapshot's order, which is the same in every attempt.
pub struct Prelude {
    rows: mpsc::Receiver<TaggedBatch>,
    _reader: Reader,
    batch: std::vec::IntoIter<(usize, Vec<ColumnValue>)>,
    /// Each table's mapping, in the snapshot's order.
    mappings: Vec<Arc<RowMapping>>,
    next_index: u32,
    finished: bool,
    /// The seed's headers, added to each of its messages.
    pub marks: Vec<(&'static str, String)>,
}

impl Prelude {
    /// The next row, its position and its table's mapping; `None` once every row was
    /// read. Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<SeedRow>, SeedError> {
        loop {
            if let Some((table, tuple)) = self.batch.next() {
                let position = Position { commit_lsn: 0, index: self.next_index };
                self.next_index += 1;
                let Some(mapping) = self.mappings.get(table) else { continue };
                return Ok(Some((position, Arc::clone(mapping), tuple)));
            }
            if self.finished {
                return Ok(None);
            }
            match self.rows.recv().await {
                Some(Ok(batch)) if batch.is_empty() => self.finished = true,
                Some(Ok(batch)) => self.batch = batch.into_iter(),
                Some(Err(err)) => return Err(err.into()),
                None => return Err(SeedError::ReaderGone),
            }
        }
    }

    /// Whether every row was read.
    pub fn is_finished(&self) -> bool {
        self.finished && self.batch.len() == 0
    }
}
