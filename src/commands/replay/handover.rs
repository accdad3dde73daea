//! A replay into the stream a pgoutbox source owns: the rows are handed to it through the
//! WAL, inserted into the replay table (`postgres::outbox_table::replay_table`, which only
//! roles granted INSERT may write) as frames (`postgres::pgoutput::replayed`), a few
//! thousand per transaction, and deleted again in the same transaction: the insert is in
//! the WAL, and the insert-only publication does not publish the delete. pgoutbox publishes
//! them in commit order among the live rows, chained like every other message. Nothing is
//! written beside it, so its order and its exactly-once hold for the replayed rows too,
//! whether or not it runs at that moment: rows handed over while it is down wait in the
//! slot, and it publishes them when it runs again.
//!
//! A row handed over is in the stream once pgoutbox recorded everything up to the
//! transaction that carried it as acknowledged (`postgres::acknowledged`, a second at most
//! behind the acknowledgements), or once the slot's `confirmed_flush_lsn` passes it:
//! pgoutbox confirms nothing JetStream has not acknowledged, but the slot trails by the
//! durability horizon, which a replay need not wait for.
//! That is how this command shows what is published, waits for the end, and, resumed with
//! its id after a kill, first lets pgoutbox publish what the killed run handed over before
//! it reads which rows the stream holds.

use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_postgres::Client;
use tokio_postgres::types::PgLsn;

use super::{Plan, Progress, Tally, next_rows};
use crate::domain::outbox::RowMapping;
use crate::domain::seed::{REPLAY_HEADER, replay_id_prefix};
use crate::nats::publisher::{Publisher, ReadFrom};
use crate::postgres::acknowledged;
use crate::postgres::admin::TableName;
use crate::postgres::pgoutput::ReplayFrame;
use crate::postgres::replay_table;
use crate::postgres::table_snapshot::TableSnapshot;
use crate::settings::cli::ReplayArgs;
use crate::settings::config::Config;
use chunk::Chunk;

mod chunk;

/// Rows per transaction: large enough to cost few round trips and commits (2,000 replayed
/// 47,000 rows/s in the benchmark, 500 40,000), small enough that the progress moves.
const CHUNK: usize = 2_000;
/// Rows handed over and not yet confirmed, at most: the replay keeps pace with pgoutbox.
const AHEAD: u64 = 20_000;
/// How long the slot may have no pgoutbox streaming from it before the replay gives up
/// waiting (a restart takes seconds).
const INACTIVE_LIMIT: Duration = Duration::from_secs(60);
/// How long an inactive slot is watched for a pgoutbox between two attempts to come back
/// before the rows are handed over to wait in it: longer than a reconnect's backoff after
/// anything was published (200 ms doubling) and a NATS retry (500 ms at most).
const BETWEEN_ATTEMPTS: Duration = Duration::from_secs(10);
const ACTIVE_POLL: Duration = Duration::from_millis(100);
/// How often the slot's confirmed position is read while waiting: the end of a replay waits
/// for its last rows, and the query is a cheap catalog read.
const POLL: Duration = Duration::from_millis(10);

/// Where the slot stands.
struct Slot<'a> {
    client: &'a Client,
    name: &'a str,
    /// pgoutbox's record of what JetStream acknowledged.
    record: TableName,
    inactive_since: Option<Instant>,
}

impl Slot<'_> {
    /// The WAL position every transaction committed so far ends at or before. Commits are
    /// made durable first (`synchronous_commit` is on in this session), so the position
    /// is past them.
    async fn now(&self) -> anyhow::Result<u64> {
        let row = self.client.query_one("SELECT pg_catalog.pg_current_wal_lsn()", &[]).await?;
        Ok(u64::from(row.try_get::<_, PgLsn>(0)?))
    }

    /// The position up to which everything is in the stream: the furthest of the slot's
    /// confirmed position, the write position the pgoutbox streaming from it reports (what
    /// JetStream acknowledged, visible to its own role), and pgoutbox's record of what was
    /// acknowledged; an error once no pgoutbox streamed from the slot for [`INACTIVE_LIMIT`].
    async fn confirmed(&mut self) -> anyhow::Result<u64> {
        let slot = self.slot_confirmed().await?;
        let recorded = acknowledged::acknowledged_up_to(self.client, &self.record, self.name)
            .await
            .context("reading pgoutbox's record of what JetStream acknowledged")?;
        Ok(recorded.map_or(slot, |recorded| recorded.max(slot)))
    }

    async fn slot_confirmed(&mut self) -> anyhow::Result<u64> {
        let row = self
            .client
            .query_opt(
                "SELECT s.confirmed_flush_lsn, s.active, r.write_lsn \
                 FROM pg_catalog.pg_replication_slots s \
                 LEFT JOIN pg_catalog.pg_stat_replication r ON r.pid = s.active_pid \
                 WHERE s.slot_name = $1",
                &[&self.name],
            )
            .await?
            .with_context(|| format!("slot {} was dropped during the replay", self.name))?;
        let confirmed = row.try_get::<_, Option<PgLsn>>(0)?.map_or(0, u64::from);
        let written = row.try_get::<_, Option<PgLsn>>(2)?.map_or(0, u64::from);
        if row.try_get::<_, bool>(1)? {
            self.inactive_since = None;
        } else if self.inactive_since.get_or_insert_with(Instant::now).elapsed() > INACTIVE_LIMIT {
            anyhow::bail!(
                "no pgoutbox has streamed from slot {} for {} s: the rows handed over are \
                 published when it runs again; run this replay again with the same \
                 --replay-id to see it through",
                self.name,
                INACTIVE_LIMIT.as_secs()
            );
        }
        Ok(confirmed.max(written))
    }

    /// Waits until everything committed up to `lsn` is confirmed.
    async fn wait_confirmed(&mut self, lsn: u64) -> anyhow::Result<()> {
        while self.confirmed().await? < lsn {
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }
}

/// Whether a pgoutbox streams from `slot` now or within [`BETWEEN_ATTEMPTS`]: a running
/// pgoutbox leaves its slot inactive between two attempts (a reconnect, a collision), and
/// rows handed to it then are a running pgoutbox's to publish, to wait for.
pub(super) async fn streamed_from(client: &Client, slot: &str) -> anyhow::Result<bool> {
    let deadline = Instant::now() + BETWEEN_ATTEMPTS;
    loop {
        let active = client
            .query_opt(
                "SELECT active FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await?
            .map(|row| row.try_get::<_, bool>(0))
            .transpose()?;
        match active {
            Some(true) => return Ok(true),
            Some(false) if Instant::now() < deadline => tokio::time::sleep(ACTIVE_POLL).await,
            _ => return Ok(false),
        }
    }
}

/// Before a resumed replay reads what the stream holds: what its killed run handed over is
/// published first, so that the stream shows it.
pub(super) async fn settle_earlier_runs(
    client: &Client,
    (slot, record): (&str, &TableName),
) -> anyhow::Result<()> {
    prepare_session(client).await?;
    let mut slot = Slot { client, name: slot, record: record.clone(), inactive_since: None };
    let now = slot.now().await?;
    slot.wait_confirmed(now).await.context("waiting for the rows handed over before")
}

async fn prepare_session(client: &Client) -> anyhow::Result<()> {
    client
        .batch_execute("SET synchronous_commit = on; SET application_name = 'pgoutbox replay'")
        .await
        .context("preparing the session that hands rows over")
}

/// Hands the plan's rows to the pgoutbox of `config.slot`. With `wait` (a pgoutbox streams
/// from the slot), keeps at most [`AHEAD`] rows waiting for it and waits until it published
/// them all; without, hands them all over and returns: they wait in the slot.
pub(super) async fn hand_over(
    config: &Config,
    args: &ReplayArgs,
    client: &Client,
    snapshot: &TableSnapshot,
    plan: &Plan,
    (mut progress, wait): (Progress<'_>, bool),
) -> anyhow::Result<Tally> {
    let Plan { selection, id, total, .. } = plan;
    prepare_session(client).await?;
    let record = acknowledged::table_in(&config.own_schema);
    let mut slot = Slot { client, name: &config.slot, record, inactive_since: None };
    let table = config.pipeline.replay_table.clone();
    let to = Handover { table, slot: &config.slot, replay_id: id };
    let relation = snapshot.relation();
    let mapping = RowMapping::of_entry(relation, &plan.entry)?;
    let (chunk_size, mut pace) = pace(args);
    let mut chunk = Chunk::new(id, *total, relation, chunk_size);
    let (mut rows, _reader) = snapshot.read(selection);
    let (mut tally, mut handed, mut seen) = (Tally::default(), Handed::default(), 0u64);
    loop {
        let batch = next_rows(&mut rows).await?;
        let last_batch = batch.is_empty();
        for tuple in batch {
            seen += 1;
            if plan.admit(&mapping, &tuple, &mut tally).is_none() {
                continue;
            }
            tally.last_handed = seen;
            if !chunk.push(seen, &tuple) {
                continue;
            }
            if let Some(pace) = pace.as_mut() {
                pace.tick().await;
            }
            let (mut frames, rows) = chunk.take();
            handed.push(to.insert(client, *total, &mut frames).await?, rows, seen);
            if wait {
                handed.keep_ahead(&mut slot).await?;
            }
            let line = |pace: f64| {
                let Handed { published, rows, .. } = handed;
                format!(
                    "{published} rows published, {rows} handed over, {seen} of {total} read \
                     ({pace:.0} rows/s)"
                )
            };
            progress.tick(handed.done_up_to, line).await;
        }
        if last_batch {
            break;
        }
    }
    // The rest, then the end, which carries no row: the progress reaches its total.
    let (mut frames, rows) = chunk.take();
    frames.push((0, ReplayFrame::End { replay_id: id.clone(), total: *total }.encode()));
    let end = to.insert(client, *total, &mut frames).await?;
    tally.stored = handed.rows + rows;
    if !wait {
        eprintln!(
            "replay {id}: {} rows handed over to slot {slot}, which no pgoutbox streams from \
             now: pgoutbox publishes them when it runs from that slot (pgoutbox status shows \
             them). They wait in the slot only: if it is dropped first, run this replay again \
             with --replay-id {id} once pgoutbox runs",
            tally.stored,
            slot = config.slot
        );
        return Ok(tally);
    }
    eprintln!(
        "replay {id}: {} rows handed over; waiting for pgoutbox to publish them",
        tally.stored
    );
    slot.wait_confirmed(end).await?;
    progress.finish(*total).await;
    Ok(tally)
}

/// Rows per transaction, and with `--rate` the interval between two transactions.
fn pace(args: &ReplayArgs) -> (usize, Option<tokio::time::Interval>) {
    let Some(rate) = args.rate else { return (CHUNK, None) };
    let size = (rate.get() as usize / 10).clamp(1, CHUNK);
    let every = Duration::from_secs(1).mul_f64(size as f64 / rate.get() as f64);
    let mut pace = tokio::time::interval(every);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    (size, Some(pace))
}

/// The transactions handed over and what pgoutbox published of them.
#[derive(Default)]
struct Handed {
    /// Each transaction not known published yet: where it ends, how many rows it carried,
    /// and how many rows of the selection were read up to its last.
    waiting: std::collections::VecDeque<(u64, u64, u64)>,
    rows: u64,
    published: u64,
    /// The rows of the selection read up to the last row published.
    done_up_to: u64,
}

impl Handed {
    fn push(&mut self, end: u64, rows: u64, seen: u64) {
        self.waiting.push_back((end, rows, seen));
        self.rows += rows;
    }

    /// Waits until at most [`AHEAD`] rows handed over wait for pgoutbox.
    async fn keep_ahead(&mut self, slot: &mut Slot<'_>) -> anyhow::Result<()> {
        loop {
            let confirmed = slot.confirmed().await?;
            while let Some(&(_, rows, up_to)) = self.waiting.front().filter(|h| h.0 <= confirmed) {
                (self.published, self.done_up_to) = (self.published + rows, up_to);
                self.waiting.pop_front();
            }
            if self.rows - self.published < AHEAD {
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// How many of the rows handed to the running pgoutbox are in the stream, now that the slot
/// confirmed them all: a pgoutbox older than this replay confirms past the rows without
/// publishing them. pgoutbox confirms a row only once JetStream stored it, in commit order,
/// so the last row handed over, found in the stream after `first` carrying this replay's id,
/// shows that this pgoutbox published them all; it is near the end, and one or a few reads
/// find it. Otherwise (not found among the newest messages, or the last row became a dead
/// letter under another id) the messages of this run are read back and counted, as before.
pub(super) async fn published(
    publisher: &Publisher,
    id: &str,
    first: u64,
    tally: &Tally,
) -> anyhow::Result<u64> {
    /// Messages looked at from the end: live rows committed after the replay's end.
    const NEWEST: u64 = 1_000;
    if tally.stored == 0 {
        return Ok(0);
    }
    let last = publisher
        .newest_with_header(first, (REPLAY_HEADER, id), NEWEST)
        .await
        .context("looking for this replay's last row in the stream")?;
    let last_row = replay_id_prefix(id, tally.last_handed);
    if last.is_some_and(|(_, msg_id)| msg_id.contains(&last_row)) {
        return Ok(tally.stored);
    }
    let (stored, _) = publisher
        .row_ids(ReadFrom::After(first), None, Some((REPLAY_HEADER, id)))
        .await
        .context("reading back what this replay stored")?;
    let stored = stored.len() as u64;
    if stored < tally.stored {
        anyhow::bail!(
            "replay {id}: {} rows were handed to pgoutbox and only {stored} are in the \
             stream: is the running pgoutbox older than this replay? Upgrade it and run the \
             replay again with --replay-id {id}",
            tally.stored
        );
    }
    Ok(stored)
}

/// Where a replay's rows are handed over.
struct Handover<'a> {
    table: TableName,
    slot: &'a str,
    replay_id: &'a str,
}

impl Handover<'_> {
    /// Commits `frames` (each with its row's place in the selection) as one transaction of
    /// rows of the replay table (`replay_table::hand_over`), and answers a WAL position
    /// past its commit.
    async fn insert(
        &self,
        client: &Client,
        total: u64,
        frames: &mut Vec<(i64, Vec<u8>)>,
    ) -> anyhow::Result<u64> {
        let handed = async {
            client.batch_execute("BEGIN").await?;
            let (slot, id) = (self.slot, self.replay_id);
            replay_table::hand_over(client, &self.table, (slot, id, total), frames).await?;
            client.batch_execute("COMMIT").await
        };
        handed.await.context("handing replayed rows over through the replay table")?;
        frames.clear();
        let row = client.query_one("SELECT pg_catalog.pg_current_wal_lsn()", &[]).await?;
        Ok(u64::from(row.try_get::<_, PgLsn>(0)?))
    }
}
