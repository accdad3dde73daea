//! The one loop that moves rows from the WAL to JetStream and owns LSN bookkeeping.
//!
//! ```text
//!  walsender ──XLogData──▶ pgoutput::parse ──Insert──▶ RowMapping::map ──▶ Outbound::send
//!      ▲                                                                       │ ack (token)
//!      │ StandbyStatus(flush = LsnTracker::confirmed)                          ▼
//!      └──────────────────────────── LsnTracker ◀── on_acked ◀── Window, oldest first
//! ```
//! Rows are published as they arrive (a transaction is never held in memory) and up to
//! [`MAX_IN_FLIGHT`] acks are outstanding. The flush position sent to Postgres comes only
//! from [`LsnTracker::confirmed`], held back by the durability horizon
//! (`domain::horizon`), in [`Pipeline::send_status`]: that is the single place where an
//! LSN is confirmed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::debug;

use crate::domain::horizon::Horizon;
use crate::domain::outbox::{Rejection, RowMapping};
use crate::domain::progress::{Position, Timing};
use crate::domain::publishing::{Publishing, Start, TailNotInWal};
use crate::domain::source::Source;
use crate::domain::transaction::InTransaction;
use crate::nats::outbound::{Acks, Outbound};
use crate::nats::publisher::{ADDED_HEADERS_ROOM, Publisher};
use crate::postgres::pgoutput::ColumnValue;
use crate::postgres::wire::pg_now_micros;
use crate::postgres::{ConnectionError, ReplicationConnection, ReplicationMessage, StandbyStatus};
use crate::service::error::{NatsFailure, NatsFailureKind, PipelineError};
use crate::service::liveness::Verdict;
use crate::service::seed::Prelude;
use crate::service::shutdown::Shutdown;
use crate::service::telemetry::{CountersByTable, Metrics};
use crate::service::traces::Traces;
use crate::settings::config::PipelineConfig;
use transaction_end::Transaction;

mod acks;
mod durability;
mod emitted;
mod gauges;
mod interruption;
mod memory;
mod publish;
mod replayed;
mod seed;
mod tables;
mod transaction_end;
mod wal;
mod window;

pub use durability::objects_lost_before_start;
use interruption::{Interruption, Interruptions};
pub use memory::{Memory, Resume, acknowledged_through};
use replayed::Replays;
use seed::next_seed_row;
use tables::TableSet;
use window::{MAX_IN_FLIGHT, Window};

/// How often acks are checked and gauges updated, and a report goes out when none did for
/// [`ReplicationConnection::status_keepalive`].
const STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// When the confirmed position moves, it is reported at once, but not twice within this:
/// the slot releases WAL within milliseconds of the acks (it waited for the 100 ms tick,
/// 99 ms on average), at no more than 100 status messages a second.
const MIN_STATUS_GAP: Duration = Duration::from_millis(10);

/// A row as it was decoded, kept while its message is in flight.
struct SentRow {
    mapping: Arc<RowMapping>,
    tuple: Vec<ColumnValue>,
    position: Position,
    /// Its place in its transaction; `None` for a seed's rows, whose transactions the
    /// table does not tell apart.
    in_transaction: Option<InTransaction>,
}

/// A row decoded and not yet handed to NATS: whether it is its transaction's last is known
/// at the next row or at the Commit, which follow it in the same read.
struct HeldRow {
    mapping: Arc<RowMapping>,
    tuple: Vec<ColumnValue>,
    position: Position,
    /// Why it cannot be published as it is, when that was known before mapping it.
    rejected: Option<Rejection>,
}

pub struct Pipeline<'a> {
    config: &'a PipelineConfig,
    conn: ReplicationConnection,
    outbound: Outbound,
    memory: &'a mut Memory,
    /// What each message is chained to, what its answer means, what may be confirmed.
    protocol: Publishing,
    /// What of that may be confirmed now: acknowledged longer ago than the stream may
    /// still lose an acknowledged write.
    horizon: Horizon,
    /// When JetStream last answered: what is confirmable rests on it.
    last_ack_at: Instant,
    /// The horizon's looks at the stream (`durability.rs`).
    looks: durability::Looks,
    in_flight: Window,
    /// The outbox tables, and the mapping of each relation described.
    tables: TableSet<'a>,
    /// The mapping of `pg_logical_emit_message` events, when they are streamed.
    emitted: Option<Arc<RowMapping>>,
    /// The rows `pgoutbox replay` hands over through the replay table.
    replays: Replays,
    transaction: Option<Transaction>,
    /// This source, and its `Pgoutbox-Source` header rendered once.
    source: Source,
    source_header: String,
    /// Reads the message a duplicate answer points at (see `on_duplicate`).
    publisher: Publisher,
    /// How large a dead letter may be: the server's and the stream's limit, less the
    /// headers `publish` adds.
    letter_budget: usize,
    reported: u64,
    /// What the last status said JetStream acknowledged (its write position).
    reported_written: u64,
    reported_at: Instant,
    /// When the oldest transaction not yet reported to Postgres became confirmable.
    confirmable_since: Option<Instant>,
    /// What `--retention` may count once the slot is confirmed past it.
    commits_unconfirmed: crate::service::retention::CommitsUnconfirmed,
    /// The furthest WAL position the server reported: lag is measured against it.
    server_wal_end: u64,
    /// Changes when the NATS connection is lost: the acks awaited on it will never come.
    nats_disconnects: tokio::sync::watch::Receiver<u64>,
    /// A decoded row, at this position, could not be handed to NATS: it waits for the next
    /// attempt.
    unsent_row: Option<Position>,
    /// The row of the newest message sent.
    last_sent: Option<SentRow>,
    /// The pointers sent and not yet acknowledged, by the position of their row.
    pointers_sent: std::collections::VecDeque<(Position, crate::nats::large_payloads::Pointer)>,
    /// Acks since `Progress` was last told: the stall detector counts them as progress.
    acks_unrecorded: u64,
    /// Becomes `Some(why)` when the path to Postgres is found dead (see `liveness`).
    postgres_dead: tokio::sync::watch::Receiver<Option<Verdict>>,
    /// A seed's rows from the table, published before any row of the slot.
    prelude: Option<Prelude>,
    /// Where the slot starts: the seed's rows end there.
    start_lsn: u64,
    metrics: Metrics,
    /// Each table's per-row counters (`/metrics`, labelled by table).
    counters: CountersByTable,
    /// The spans of this attempt, when traces are configured: `None` costs one branch.
    traces: Option<Traces>,
}

/// How a pipeline run ended without error.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Shutdown was asked for; everything sent was acknowledged and confirmed.
    Drained { confirmed: u64 },
    /// Every row of the seed is in the stream (`service::seed`).
    Seeded,
}

impl<'a> Pipeline<'a> {
    pub fn new(
        config: &'a PipelineConfig,
        conn: ReplicationConnection,
        (outbound, acks): (Outbound, Acks),
        memory: &'a mut Memory,
        resume: Resume,
        postgres_dead: tokio::sync::watch::Receiver<Option<Verdict>>,
        publisher: &Publisher,
    ) -> Self {
        let horizon = durability::horizon_for(memory, config.durability_horizon, &resume);
        let start_lsn = resume.lsn;
        let start = Start {
            lsn: start_lsn,
            stream_sequence: resume.stream_sequence,
            skip_through: resume.skip_through,
        };
        let protocol = Publishing::new(start, std::mem::take(&mut memory.carried));
        let traces = memory.tracer.clone().map(Traces::new);
        let mut nats_disconnects = memory.nats_disconnects.clone();
        nats_disconnects.mark_unchanged();
        Pipeline {
            nats_disconnects,
            unsent_row: None,
            last_sent: None,
            pointers_sent: Default::default(),
            acks_unrecorded: 0,
            postgres_dead,
            config,
            conn,
            outbound,
            memory,
            protocol,
            horizon,
            // Rows acknowledged in an earlier attempt are read again and wait once more.
            last_ack_at: Instant::now(),
            looks: durability::Looks::default(),
            in_flight: Window::new(acks),
            tables: TableSet::new(&config.tables, resume.tables),
            emitted: config.message_prefix.as_ref().map(|prefix| {
                let defaults = &config.defaults;
                let mapping =
                    RowMapping::for_emitted_messages(prefix, &defaults.roles, &defaults.template);
                Arc::new(mapping.with_dead_letter_subject(&defaults.dead_letter_subject))
            }),
            replays: Replays::default(),
            transaction: None,
            // Source fields are made header-safe in `Source::new`.
            source_header: resume.source.to_string(),
            source: resume.source,
            publisher: publisher.clone(),
            letter_budget: resume.message_limit.saturating_sub(ADDED_HEADERS_ROOM),
            reported: start_lsn,
            reported_written: start_lsn,
            reported_at: Instant::now(),
            confirmable_since: None,
            commits_unconfirmed: Default::default(),
            server_wal_end: start_lsn,
            prelude: resume.prelude,
            start_lsn,
            metrics: Metrics::new(),
            counters: CountersByTable::default(),
            traces,
        }
    }

    /// Streams until shutdown or an error. On error, what was acknowledged is still confirmed.
    pub async fn run(mut self, shutdown: &mut Shutdown) -> Result<Ended, PipelineError> {
        let result = self.stream(shutdown).await;
        // Best effort: report what is safe, whatever happened.
        let _ = self.send_status(false).await;
        self.memory.carried = self.protocol.take_carried();
        self.carry_horizon();
        // Messages sent and not acknowledged, or a row that could not even be sent, wait for
        // the next attempt; a lost connection with nothing in flight leaves nothing waiting.
        self.memory.row_waiting = self.memory.row_waiting.max(self.unsent_row);
        self.record_progress(self.memory.row_waiting.is_some() || self.protocol.in_flight() > 0);
        match result {
            Ok(ended) => {
                self.conn.close().await;
                Ok(ended)
            }
            Err(err) => Err(err),
        }
    }

    async fn stream(&mut self, shutdown: &mut Shutdown) -> Result<Ended, PipelineError> {
        let mut tick = tokio::time::interval(STATUS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut interruptions = Interruptions::watch(
            shutdown.clone(),
            self.nats_disconnects.clone(),
            self.postgres_dead.clone(),
        );
        let confirm = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(confirm);
        let mut confirm_armed = false;
        // Acks are read when pulled, once per `MIN_STATUS_GAP` while messages are in flight,
        // rather than as each arrives (see `nats::low_water`): what they move is reported no
        // more often than that.
        let pull = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(pull);
        let mut pull_armed = false;
        let mut pulled_at = Instant::now();
        loop {
            if self.prelude.as_ref().is_some_and(Prelude::is_finished)
                && self.protocol.in_flight() == 0
            {
                return Ok(Ended::Seeded);
            }
            if !confirm_armed && self.status_moved() {
                let due = (self.reported_at + MIN_STATUS_GAP).max(Instant::now());
                confirm.as_mut().reset(due.into());
                confirm_armed = true;
            }
            if !pull_armed && !self.in_flight.is_empty() {
                let due = pulled_at + MIN_STATUS_GAP;
                let now = Instant::now();
                if due <= now {
                    // The first message after a pause: its ack is read as it arrives.
                    self.in_flight.pull_acks();
                    pulled_at = now;
                } else {
                    pull.as_mut().reset(due.into());
                    pull_armed = true;
                }
            }
            let (unsent_room, window_room) = self.room();
            // A full window waits for acks and nothing else: each one is read as it arrives.
            self.in_flight.wake_on_each_ack(!window_room);
            let room = unsent_room && window_room;
            tokio::select! {
                biased;
                interruption = interruptions.next() => return self.interrupted(interruption).await,
                // Before acks and WAL: under a sustained drain those are always ready, and
                // a tick placed after them never ran (gauges, ack checks and the stall
                // detector's view went stale for as long as the drain lasted).
                _ = tick.tick() => self.on_tick().await?,
                () = &mut pull, if pull_armed => {
                    pull_armed = false;
                    pulled_at = Instant::now();
                    self.in_flight.pull_acks();
                }
                () = &mut confirm, if confirm_armed => {
                    confirm_armed = false;
                    if self.status_moved() {
                        self.send_status(false).await?;
                    }
                }
                ack = self.in_flight.oldest() => self.on_ack(ack).await?,
                () = self.outbound.written(), if !unsent_room => {}
                row = next_seed_row(&mut self.prelude), if room => match row? {
                    Some(row) => self.on_seed_row(row).await?,
                    None => self.on_seed_end()?,
                },
                message = self.conn.next_message(), if room && self.prelude.is_none() => {
                    self.on_messages(message?).await?;
                }
            }
        }
    }

    /// Shutdown drains what is in flight and ends the attempt; a lost NATS connection or an
    /// unresponsive or changed Postgres fails it.
    async fn interrupted(&mut self, interruption: Interruption) -> Result<Ended, PipelineError> {
        match interruption {
            Interruption::Shutdown => {
                self.drain().await?;
                self.record_progress(false);
                Ok(Ended::Drained { confirmed: self.confirmable() })
            }
            Interruption::NatsLost => {
                let kind = match self.in_flight.is_empty() {
                    true => NatsFailureKind::Request,
                    false => NatsFailureKind::Connection,
                };
                let detail = "the connection to NATS was lost, and with it the acks awaited";
                Err(NatsFailure::new(kind, detail).into())
            }
            Interruption::PostgresDead(Verdict::Unresponsive(why)) => {
                Err(ConnectionError::Unresponsive(why).into())
            }
            Interruption::PostgresDead(Verdict::Drift(drift)) => Err(drift.into()),
        }
    }

    /// Every [`STATUS_INTERVAL`]: acks read and checked, the horizon's look, the gauges,
    /// and a status to Postgres when none went out for its keepalive interval.
    async fn on_tick(&mut self) -> Result<(), PipelineError> {
        // Also when nothing is in flight: the server's pings are answered there.
        self.in_flight.pull_acks();
        self.check_acks()?;
        self.look_at_the_stream()?;
        self.update_gauges();
        if self.reported_at.elapsed() >= self.conn.status_keepalive() {
            self.send_status(false).await?;
        }
        Ok(())
    }

    /// The seed's rows end where the slot starts: they commit there.
    fn on_seed_end(&mut self) -> Result<(), PipelineError> {
        let timing = Timing { committed: 0, received: 0 };
        let ended = self.protocol.on_commit(self.start_lsn, timing);
        ended.map_err(|err| self.tail_not_in_wal(err))?;
        Ok(())
    }

    /// `first` and the rest of what the same read brought (a transaction's Begin, rows and
    /// Commit come together) while there is room, without a turn of the loop each: the
    /// turn polled every branch and cost as much as mapping the row.
    async fn on_messages(&mut self, first: ReplicationMessage) -> Result<(), PipelineError> {
        self.on_message(first).await?;
        while self.room() == (true, true) {
            let Some(message) = self.conn.buffered_message() else { break };
            self.on_message(message?).await?;
        }
        Ok(())
    }

    /// Ends the attempt: the stream's tail is from another history of this database, and
    /// no later attempt may skip by it.
    fn tail_not_in_wal(&mut self, err: TailNotInWal) -> PipelineError {
        self.memory.tail_not_in_wal = Some(err.tail.clone());
        err.into()
    }

    /// Whether a status would say something new: the slot's confirmed position, or what
    /// JetStream acknowledged.
    fn status_moved(&mut self) -> bool {
        let confirmed = self.confirmable();
        confirmed != self.reported || self.written(confirmed) != self.reported_written
    }

    /// Everything decoded up to here was acknowledged by JetStream: the status's write
    /// position, which `pg_stat_replication.write_lsn` shows (and `pgoutbox replay` waits
    /// for), ahead of `confirmed` (the horizon's release) by the durability horizon.
    fn written(&self, confirmed: u64) -> u64 {
        self.protocol.confirmed().max(confirmed)
    }

    /// Reports [`Pipeline::confirmable`] (`durability.rs`) to Postgres: the only place an
    /// LSN is confirmed.
    async fn send_status(&mut self, reply_requested: bool) -> Result<(), PipelineError> {
        let confirmed = self.confirmable();
        let written = self.written(confirmed);
        let now_micros = pg_now_micros();
        let status = StandbyStatus { written, confirmed, now_micros, reply_requested };
        self.conn.send_status(status).await?;
        self.reported_written = written;
        if confirmed != self.reported {
            if let Some(traces) = &mut self.traces {
                traces.confirmed(confirmed);
            }
            debug!(confirmed = %lsn(confirmed), in_flight = self.protocol.in_flight(), "confirmed");
            if let Some(since) = self.confirmable_since.take() {
                self.metrics.ack_to_confirm.record(since.elapsed().as_secs_f64());
            }
        }
        self.reported = confirmed;
        self.reported_at = Instant::now();
        if let Some(committed) = self.commits_unconfirmed.confirmed_up_to(confirmed) {
            self.memory.confirmed_up_to.advance(committed);
        }
        Ok(())
    }
}

fn lsn(value: u64) -> tokio_postgres::types::PgLsn {
    value.into()
}
