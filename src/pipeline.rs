//! The one loop that moves rows from the WAL to JetStream and owns LSN bookkeeping.
//!
//! ```text
//!  walsender ──XLogData──▶ pgoutput::parse ──Insert──▶ RowMapping::map ──▶ Publisher::publish
//!      ▲                                                                       │ ack future
//!      │ StandbyStatus(flush = LsnTracker::confirmed)                          ▼
//!      └──────────────────────────── LsnTracker ◀── on_acked ◀── FIFO of acks, oldest first
//! ```
//! Rows are published as they arrive (a transaction is never held in memory) and up to
//! [`MAX_IN_FLIGHT`] acks are outstanding. The flush position sent to Postgres comes only
//! from [`LsnTracker::confirmed`], in [`Pipeline::send_status`]: that is the single place
//! where an LSN is confirmed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::publish::PublishAck;
use bytes::Bytes;
use tracing::{debug, info, warn};

use crate::error::PipelineError;
use crate::outbox::{ColumnRoles, OutboxEvent, Rejection, RowMapping, SubjectTemplate};
use crate::pgoutput::{ColumnValue, Insert, LogicalMessage};
use crate::progress::{LsnTracker, Position};
use crate::publisher::{MAX_IN_FLIGHT, POSITION_HEADER, Publisher, StreamTail};
use crate::replication::wire::pg_now_micros;
use crate::replication::{
    ConnectionError, ReplicationConnection, ReplicationMessage, StandbyStatus,
};
use crate::retention::PublishedUpTo;
use crate::shutdown::Shutdown;
use crate::stall::Progress;
use crate::telemetry::Metrics;

/// How often the confirmed position is reported when it moved; when it did not, a report
/// still goes out every [`ReplicationConnection::status_keepalive`].
const STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// How long a shutdown waits for acks of messages already sent.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Where rows come from and how they become messages.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    pub schema: String,
    pub table: String,
    pub roles: ColumnRoles,
    pub template: SubjectTemplate,
    pub dead_letter_subject: String,
}

/// State that outlives one connection attempt.
pub struct Memory {
    /// What the stall detector watches.
    pub progress: Arc<Progress>,
    /// Counts lost NATS connections (see `commands::connect_nats_watched`).
    pub nats_disconnects: tokio::sync::watch::Receiver<u64>,
    /// Rows whose publish JetStream answered as a duplicate of an older message with the same
    /// id: they are not stored again, and skipping them keeps the sequence guard in step.
    pub duplicates: HashSet<Position>,
    pub published: u64,
    pub dead_letters: u64,
    /// Shared with `--retention`: the commit time of the newest confirmed transaction.
    pub published_up_to: PublishedUpTo,
}

impl Memory {
    pub fn new(
        progress: Arc<Progress>,
        nats_disconnects: tokio::sync::watch::Receiver<u64>,
    ) -> Self {
        Memory {
            progress,
            nats_disconnects,
            duplicates: HashSet::new(),
            published: 0,
            dead_letters: 0,
            published_up_to: PublishedUpTo::default(),
        }
    }
}

type AckFuture = Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>;

struct InFlight {
    ack: AckFuture,
    /// The ack, when it was found ready before its turn (see `check_newest_ack`).
    early: Option<Result<PublishAck, PublishError>>,
    position: Position,
    bytes: usize,
}

struct Transaction {
    commit_lsn: u64,
    next_index: u32,
}

pub struct Pipeline<'a> {
    config: &'a PipelineConfig,
    conn: ReplicationConnection,
    publisher: &'a Publisher,
    memory: &'a mut Memory,
    tracker: LsnTracker,
    in_flight: VecDeque<InFlight>,
    mappings: HashMap<u32, Option<RowMapping>>,
    transaction: Option<Transaction>,
    /// Rows at or before this position are already in the stream.
    skip_through: Option<Position>,
    expected_last_sequence: u64,
    reported: u64,
    reported_at: Instant,
    /// The furthest WAL position the server reported: lag is measured against it.
    server_wal_end: u64,
    /// Changes when the NATS connection is lost: the acks awaited on it will never come.
    nats_disconnects: tokio::sync::watch::Receiver<u64>,
    /// A decoded row could not be handed to NATS: it waits for the next attempt.
    unsent_row: bool,
    /// Becomes `Some(why)` when the path to Postgres is found dead (see `liveness`).
    postgres_dead: tokio::sync::watch::Receiver<Option<String>>,
    metrics: Metrics,
}

/// How a pipeline run ended without error.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Shutdown was asked for; everything sent was acknowledged and confirmed.
    Drained { confirmed: u64 },
}

impl<'a> Pipeline<'a> {
    pub fn new(
        config: &'a PipelineConfig,
        conn: ReplicationConnection,
        publisher: &'a Publisher,
        memory: &'a mut Memory,
        start_lsn: u64,
        tail: StreamTail,
        postgres_dead: tokio::sync::watch::Receiver<Option<String>>,
    ) -> Self {
        let mut nats_disconnects = memory.nats_disconnects.clone();
        nats_disconnects.mark_unchanged();
        Pipeline {
            nats_disconnects,
            unsent_row: false,
            postgres_dead,
            config,
            conn,
            publisher,
            memory,
            tracker: LsnTracker::new(start_lsn),
            in_flight: VecDeque::with_capacity(MAX_IN_FLIGHT),
            mappings: HashMap::new(),
            transaction: None,
            skip_through: tail.last_position,
            expected_last_sequence: tail.last_sequence,
            reported: start_lsn,
            reported_at: Instant::now(),
            server_wal_end: start_lsn,
            metrics: Metrics::new(),
        }
    }

    /// Streams until shutdown or an error. On error, what was acknowledged is still confirmed.
    pub async fn run(mut self, shutdown: &mut Shutdown) -> Result<Ended, PipelineError> {
        let result = self.stream(shutdown).await;
        // Best effort: report what is safe, whatever happened.
        let _ = self.send_status(false).await;
        // Messages sent and not acknowledged, or a row that could not even be sent, wait for
        // the next attempt; a lost connection with nothing in flight leaves nothing waiting.
        let waiting = self.unsent_row || self.tracker.in_flight() > 0;
        self.memory.progress.record(self.tracker.confirmed(), waiting);
        match result {
            Ok(()) => {
                let confirmed = self.tracker.confirmed();
                self.conn.close().await;
                Ok(Ended::Drained { confirmed })
            }
            Err(err) => Err(err),
        }
    }

    async fn stream(&mut self, shutdown: &mut Shutdown) -> Result<(), PipelineError> {
        let mut tick = tokio::time::interval(STATUS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let room = self.in_flight.len() < MAX_IN_FLIGHT;
            tokio::select! {
                biased;
                () = shutdown.requested() => return self.drain().await,
                ack = oldest_ack(&mut self.in_flight) => self.on_ack(ack)?,
                Ok(()) = self.nats_disconnects.changed() => {
                    if !self.in_flight.is_empty() {
                        Metrics::publish_error("connection");
                    }
                    return Err(PipelineError::Nats(
                        "the connection to NATS was lost, and with it the acks awaited".into(),
                    ));
                }
                Ok(()) = self.postgres_dead.changed() => {
                    if let Some(why) = self.postgres_dead.borrow_and_update().clone() {
                        return Err(ConnectionError::Unresponsive(why).into());
                    }
                }
                message = self.conn.next_message(), if room => match message? {
                    ReplicationMessage::XLogData { data, wal_end, .. } => {
                        self.server_wal_end = self.server_wal_end.max(wal_end);
                        self.on_wal(data).await?;
                    }
                    ReplicationMessage::Keepalive { wal_end, reply_requested } => {
                        self.server_wal_end = self.server_wal_end.max(wal_end);
                        if self.transaction.is_none() {
                            self.tracker.on_keepalive(wal_end);
                        }
                        if reply_requested {
                            self.send_status(false).await?;
                        }
                    }
                },
                _ = tick.tick() => {
                    self.check_newest_ack()?;
                    self.update_gauges();
                    let moved = self.tracker.confirmed() != self.reported;
                    if moved || self.reported_at.elapsed() >= self.conn.status_keepalive() {
                        self.send_status(false).await?;
                    }
                }
            }
        }
    }

    /// Stops taking changes and waits (bounded) for the acks of what was sent.
    async fn drain(&mut self) -> Result<(), PipelineError> {
        let waiting = self.in_flight.len();
        let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
        while !self.in_flight.is_empty() {
            match tokio::time::timeout_at(deadline, oldest_ack(&mut self.in_flight)).await {
                Ok(ack) => self.on_ack(ack)?,
                Err(_) => {
                    warn!(left = self.in_flight.len(), "shutdown: gave up waiting for acks");
                    break;
                }
            }
        }
        info!(
            drained = waiting - self.in_flight.len(),
            confirmed = %lsn(self.tracker.confirmed()),
            "shutdown: drained in-flight messages"
        );
        Ok(())
    }

    fn on_ack(&mut self, ack: Result<PublishAck, PublishError>) -> Result<(), PipelineError> {
        let Some(done) = self.in_flight.pop_front() else {
            return Ok(());
        };
        let ack = ack.map_err(|err| PipelineError::Nats(unacknowledged(&err)))?;
        if ack.duplicate {
            warn!(position = %done.position, sequence = ack.sequence,
                "JetStream already had a message with this row's id; not stored again");
            self.memory.duplicates.insert(done.position);
        }
        self.metrics.rows_published.increment(1);
        self.metrics.bytes_published.increment(done.bytes as u64);
        self.tracker.on_acked();
        self.observe_confirmed();
        Ok(())
    }

    /// Acks are consumed oldest first, but when the oldest waits for its timeout (it went to
    /// a stream leader that died), the ones after it are refused at once (no leader yet).
    /// Looking at the newest ack every tick ends such an attempt within 100 ms instead of
    /// after the ack timeout; any refused ack means the attempt must restart anyway.
    fn check_newest_ack(&mut self) -> Result<(), PipelineError> {
        use futures_util::FutureExt;
        if self.in_flight.len() < 2 {
            return Ok(());
        }
        let Some(newest) = self.in_flight.back_mut().filter(|n| n.early.is_none()) else {
            return Ok(());
        };
        match (&mut newest.ack).now_or_never() {
            Some(Err(err)) => Err(PipelineError::Nats(unacknowledged(&err))),
            ready => {
                newest.early = ready;
                Ok(())
            }
        }
    }

    /// Records commit-to-ack latency for the transactions that just became confirmable.
    fn observe_confirmed(&mut self) {
        let now = pg_now_micros();
        for commit_time in self.tracker.take_confirmed_commit_times() {
            let seconds = (now - commit_time).max(0) as f64 / 1e6;
            self.metrics.commit_to_ack.record(seconds);
            self.memory.published_up_to.advance(commit_time);
        }
    }

    fn update_gauges(&mut self) {
        let confirmed = self.tracker.confirmed();
        self.memory.progress.record(confirmed, self.tracker.in_flight() > 0);
        self.metrics.messages_in_flight.set(self.tracker.in_flight() as f64);
        self.metrics.confirmed_lsn.set(confirmed as f64);
        let lag = self.server_wal_end.saturating_sub(confirmed);
        self.metrics.replication_lag_bytes.set(lag as f64);
    }

    async fn on_wal(&mut self, data: Bytes) -> Result<(), PipelineError> {
        match LogicalMessage::parse(&data)? {
            LogicalMessage::Begin(begin) => {
                if self.transaction.is_some() {
                    return Err(PipelineError::Protocol("Begin inside a transaction"));
                }
                self.transaction = Some(Transaction { commit_lsn: begin.final_lsn, next_index: 0 });
            }
            LogicalMessage::Commit(commit) => {
                if self.transaction.take().is_none() {
                    return Err(PipelineError::Protocol("Commit outside a transaction"));
                }
                self.tracker.on_commit(commit.end_lsn, commit.commit_time);
                self.metrics.transactions.increment(1);
                self.observe_confirmed();
            }
            LogicalMessage::Relation(relation) => {
                let ours =
                    relation.namespace == self.config.schema && relation.name == self.config.table;
                let mapping = if ours {
                    let config = self.config;
                    Some(RowMapping::new(&relation, &config.roles, &config.template)?)
                } else {
                    None
                };
                debug!(rel_id = relation.rel_id, ours, "relation");
                self.mappings.insert(relation.rel_id, mapping);
            }
            LogicalMessage::Insert(insert) => self.on_insert(insert).await?,
            LogicalMessage::Origin(_)
            | LogicalMessage::Type(_)
            | LogicalMessage::Update { .. }
            | LogicalMessage::Delete { .. }
            | LogicalMessage::Truncate(_)
            | LogicalMessage::Message(_) => {}
        }
        Ok(())
    }

    async fn on_insert(&mut self, insert: Insert) -> Result<(), PipelineError> {
        let Some(transaction) = self.transaction.as_mut() else {
            return Err(PipelineError::Protocol("Insert outside a transaction"));
        };
        let position =
            Position { commit_lsn: transaction.commit_lsn, index: transaction.next_index };
        transaction.next_index += 1;
        let config = self.config;
        let mapping = match self.mappings.get(&insert.rel_id) {
            Some(Some(mapping)) => mapping,
            Some(None) => return Ok(()), // another table in the publication
            None => {
                return Err(PipelineError::Protocol("Insert for a relation never described"));
            }
        };
        if self.skip_through.is_some_and(|last| position <= last)
            || self.memory.duplicates.contains(&position)
        {
            return Ok(());
        }
        let event = match mapping.map(&insert.tuple) {
            Ok(event) => event,
            Err(reason) => {
                let letter = dead_letter(config, mapping, &insert.tuple, position, reason, false)?;
                return self.publish_dead_letter(letter, position).await;
            }
        };
        let size = event.payload.len();
        match self.publish(event, position).await {
            Ok(()) => {
                self.memory.published += 1;
                Ok(())
            }
            Err(err) if err.kind() == PublishErrorKind::MaxPayloadExceeded => {
                let reason = Rejection(format!(
                    "the message ({size} payload bytes) exceeds the NATS server's max_payload"
                ));
                let Some(Some(mapping)) = self.mappings.get(&insert.rel_id) else {
                    return Err(PipelineError::Protocol("relation vanished"));
                };
                let letter = dead_letter(config, mapping, &insert.tuple, position, reason, true)?;
                self.publish_dead_letter(letter, position).await
            }
            Err(err) => {
                self.unsent_row = true;
                Err(PipelineError::Nats(err.to_string()))
            }
        }
    }

    async fn publish_dead_letter(
        &mut self,
        event: OutboxEvent,
        position: Position,
    ) -> Result<(), PipelineError> {
        let reason = event.headers.get(DEAD_LETTER_REASON_HEADER).map(|v| v.to_string());
        warn!(position = %position, id = %event.id, reason = reason.as_deref().unwrap_or(""),
            subject = %event.subject, "row sent to the dead-letter subject");
        self.publish(event, position).await.map_err(|err| {
            self.unsent_row = true;
            PipelineError::DeadLetter(err.to_string())
        })?;
        self.memory.dead_letters += 1;
        self.metrics.dead_letters.increment(1);
        Ok(())
    }

    /// Hands one message to JetStream, chained to the previous one by sequence.
    async fn publish(
        &mut self,
        event: OutboxEvent,
        position: Position,
    ) -> Result<(), PublishError> {
        let OutboxEvent { subject, mut headers, payload, .. } = event;
        let bytes = payload.len();
        headers.insert(POSITION_HEADER, position.to_string());
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SEQUENCE,
            self.expected_last_sequence.to_string(),
        );
        let ack = self.publisher.publish(subject, headers, payload).await?;
        self.expected_last_sequence += 1;
        self.tracker.on_sent();
        let ack = ack.into_future();
        self.in_flight.push_back(InFlight { ack, early: None, position, bytes });
        Ok(())
    }

    /// Reports [`LsnTracker::confirmed`] to Postgres: the only place an LSN is confirmed.
    async fn send_status(&mut self, reply_requested: bool) -> Result<(), PipelineError> {
        let confirmed = self.tracker.confirmed();
        self.conn
            .send_status(StandbyStatus { confirmed, now_micros: pg_now_micros(), reply_requested })
            .await?;
        if confirmed != self.reported {
            debug!(confirmed = %lsn(confirmed), in_flight = self.tracker.in_flight(), "confirmed");
        }
        self.reported = confirmed;
        self.reported_at = Instant::now();
        Ok(())
    }
}

/// Header naming why a dead letter could not be published as a normal message.
pub const DEAD_LETTER_REASON_HEADER: &str = "Pgoutbox-Dead-Letter-Reason";

/// The message sent in place of a row that cannot be published: the reason and the row.
fn dead_letter(
    config: &PipelineConfig,
    mapping: &RowMapping,
    tuple: &[ColumnValue],
    position: Position,
    reason: Rejection,
    omit_payload: bool,
) -> Result<OutboxEvent, PipelineError> {
    let mut body = mapping.row_json(tuple);
    if let Some(row) = body.get_mut("row").and_then(|r| r.as_object_mut())
        && omit_payload
    {
        row.insert(config.roles.payload.clone(), serde_json::Value::Null);
    }
    body["reason"] = serde_json::Value::String(reason.0.clone());
    body["position"] = serde_json::Value::String(position.to_string());
    let id = match mapping.id_of(tuple) {
        Some(id) => format!("dead-letter:{id}"),
        None => format!("dead-letter:{position}"),
    };
    let mut headers = HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
    let one_line = reason.0.replace(['\r', '\n'], " ");
    headers.insert(DEAD_LETTER_REASON_HEADER, one_line.as_str());
    let payload =
        serde_json::to_vec(&body).map_err(|err| PipelineError::DeadLetter(err.to_string()))?;
    Ok(OutboxEvent {
        id,
        subject: config.dead_letter_subject.clone(),
        headers,
        payload: Bytes::from(payload),
    })
}

/// Why a publish was not acknowledged, in the words an operator needs; also counted in
/// `pgoutbox_publish_errors_total` by kind.
fn unacknowledged(err: &PublishError) -> String {
    Metrics::publish_error(match err.kind() {
        PublishErrorKind::TimedOut => "timeout",
        PublishErrorKind::StreamNotFound => "no_leader",
        PublishErrorKind::WrongLastSequence => "out_of_order",
        PublishErrorKind::BrokenPipe => "connection",
        _ => "other",
    });
    match err.kind() {
        // Nothing subscribes to the subject: on a cluster, the stream has no leader yet.
        PublishErrorKind::StreamNotFound => "publish not acknowledged: no JetStream server \
            answers for the stream (a leader election under way, quorum lost, or the stream \
            was deleted)"
            .to_owned(),
        _ => format!("publish not acknowledged: {err}"),
    }
}

/// Waits for the oldest ack; never resolves when nothing is in flight. Cancel-safe: the
/// boxed future keeps its state across polls.
async fn oldest_ack(in_flight: &mut VecDeque<InFlight>) -> Result<PublishAck, PublishError> {
    match in_flight.front_mut() {
        Some(oldest) => match oldest.early.take() {
            Some(ack) => ack,
            None => (&mut oldest.ack).await,
        },
        None => std::future::pending().await,
    }
}

fn lsn(value: u64) -> tokio_postgres::types::PgLsn {
    value.into()
}
