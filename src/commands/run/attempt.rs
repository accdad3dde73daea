//! One connection attempt: started within a deadline and abandoned at once on SIGTERM,
//! then streamed until it fails or shutdown drains it.

use std::time::Duration;

use tracing::{error, info, warn};

use crate::domain::horizon::{Forgotten, Horizon, Stored};
use crate::domain::source::{Source, TailVerdict, judge_tail, parse_timeline_history};
use crate::nats::claim::{Claim, Claims};
use crate::nats::handshake::Dialer;
use crate::nats::outbound::{Acks, Outbound};
use crate::nats::publisher::Publisher;
use crate::postgres::acknowledged;
use crate::postgres::admin::WalStatus;
use crate::postgres::outbox_table::StreamedTable;
use crate::postgres::tenant_tables;
use crate::postgres::{ConnectionError, ReplicationConnection, outbox_table};
use crate::service::acknowledgements::stream_identity;
use crate::service::error::{NatsFailure, NatsFailureKind, PipelineError};
use crate::service::liveness::{Liveness, Watched};
use crate::service::pipeline::{
    Ended, Memory, Pipeline, Resume, acknowledged_through, objects_lost_before_start,
};
use crate::service::seed::Seed;
use crate::service::shutdown::Shutdown;
use crate::service::telemetry::{Metrics, Readiness, names};
use crate::settings::config::{Config, PipelineConfig};

/// Reading the stream's end or its claim takes milliseconds; no answer means no leader
/// yet for the stream or the claims bucket (an election), and retrying soon beats waiting
/// out async-nats's 10 s request timeout (which added 10 s to 1 leader election in 9 in
/// the benchmark, when the claims bucket had lost its leader too).
const LEADER_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Starting an attempt (the stream's tail, the replication connection's TLS and login,
/// IDENTIFY_SYSTEM, the slot, START_REPLICATION) takes milliseconds on a live path. A path
/// that black-holes packets answers nothing, and TCP keepalive, which sees the kernel's
/// acknowledgements, may never notice: past this, the attempt is given up and retried.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Where each attempt streams from and to: fixed for the life of `run`.
pub struct Target<'a> {
    pub config: &'a Config,
    pub pipeline: PipelineConfig,
    /// The configured connection with the advertised `application_name`.
    pub database: tokio_postgres::Config,
    pub publisher: Publisher,
    /// Opens each attempt's publishing connection.
    pub dialer: Dialer<'a>,
    pub claims: Claims,
    /// `--failover`: the slot must be a failover slot (17+, checked at setup).
    pub failover: bool,
    /// `--from-standby`: a server in recovery is where the slot lives, not a wait.
    pub from_standby: bool,
    /// `--recover-margin` (`service::seed`).
    pub seed_margin: Duration,
}

/// An attempt ready to stream.
struct Started {
    conn: ReplicationConnection,
    resume: Resume,
    /// Stopped when the attempt ends.
    liveness: Liveness,
    outbound: (Outbound, Acks),
}

impl Target<'_> {
    /// One connection attempt: started within [`START_TIMEOUT`], then streamed. `None`:
    /// shutdown was asked for before it streamed, and nothing was sent.
    pub async fn stream_once(
        &self,
        memory: &mut Memory,
        shutdown: &mut Shutdown,
        readiness: &Readiness,
    ) -> Result<Option<Ended>, PipelineError> {
        if let Some(kind) = memory.seed_wanted
            && memory.seed.as_ref().is_none_or(Seed::is_lost)
        {
            memory.seed = None;
            memory.forget_seed_rows();
            let begin = Seed::begin(self.config, &self.publisher, kind, self.seed_margin, shutdown);
            let Some(seed) = begin.await? else { return Ok(None) };
            Metrics::seed_rows(seed.total);
            memory.seed = Some(seed);
        } else if let Some(seed) = memory.seed.as_mut() {
            seed.check_slot(self.config).await?;
            let catch_up = seed.catch_up(&self.publisher);
            tokio::select! {
                caught_up = catch_up => caught_up?,
                () = shutdown.requested() => return Ok(None),
            }
        }
        let started = tokio::select! {
            started = tokio::time::timeout(START_TIMEOUT, self.start(memory, readiness)) => {
                started.map_err(|_| {
                    ConnectionError::Unresponsive(format!(
                        "starting replication took over {START_TIMEOUT:?} (a black-holed path?)"
                    ))
                })??
            }
            () = shutdown.requested() => return Ok(None),
        };
        let Started { conn, resume, liveness, outbound } = started;
        let Target { pipeline, publisher, .. } = self;
        // Once this process holds the slot: a hot standby sweeping while it waits could purge
        // the chunks of an object the active process has just stored.
        if let Some(large) = pipeline.large_payloads.as_ref().filter(|_| !memory.chunks_swept) {
            super::sweep_orphan_chunks(publisher, &large.bucket).await;
            memory.chunks_swept = true;
        }
        Pipeline::new(pipeline, conn, outbound, memory, resume, liveness.verdict(), publisher)
            .run(shutdown)
            .await
            .map(Some)
    }

    /// Reads where the stream ends, makes sure this source still holds the stream, decides
    /// what the tail lets us skip, and starts replication.
    async fn start(
        &self,
        memory: &mut Memory,
        readiness: &Readiness,
    ) -> Result<Started, PipelineError> {
        let Target {
            config,
            pipeline,
            database,
            publisher,
            dialer,
            claims,
            failover,
            from_standby,
            ..
        } = self;
        let tail =
            leader_probe("reading the end of the stream", "no stream leader?", publisher.tail())
                .await?;
        // async-nats may have moved to another server of the list since.
        Metrics::nats_info(&publisher.server_version(), true);
        let mut conn = ReplicationConnection::connect(database, &config.pg_tls).await?;
        // A seed publishes from its own slot until it is done (`service::seed`).
        let slot = memory.seed.as_ref().map_or(&config.slot, |seed| &seed.slot);
        let identity = conn.identify_system().await?;
        // A standby (or one being promoted) has no say about the slot yet: wait.
        let recovery = conn.simple_query("SELECT pg_catalog.pg_is_in_recovery()").await?;
        if !from_standby
            && recovery.first().and_then(|r| r.first()).and_then(Option::as_deref) == Some("t")
        {
            return Err(PipelineError::InRecovery { slot: slot.clone() });
        }
        let outbox_tables = streamed_tables(&mut conn, pipeline, &config.publication).await?;
        // The source is named by the slot it streams from for good, also while seeding.
        let source =
            Source::new(identity.system_id, identity.timeline, &identity.database, &config.slot);
        let claim = leader_probe(
            "checking the stream's claim",
            "no leader for the claims bucket?",
            claims.claim(&config.stream, &source),
        )
        .await?;
        if let Claim::Theirs(writer) = claim {
            let database = &source.database;
            return Err(PipelineError::stream_claimed(&config.stream, writer, database, slot));
        }
        let history = match tail.origin.source.as_deref().and_then(|s| s.parse::<Source>().ok()) {
            Some(theirs) if theirs.timeline < source.timeline => {
                parse_timeline_history(&conn.timeline_history(source.timeline).await?)
            }
            _ => Vec::new(),
        };
        let verdict = judge_tail(&source, identity.wal_end, &history, &tail.origin);
        let skip_through = match verdict {
            // A seed starts before every row the slot sends: nothing to skip.
            _ if memory.seed.is_some() => None,
            TailVerdict::SkipThrough(row) if memory.tail_not_in_wal.as_ref() == Some(&row) => {
                warn!(stream = %config.stream, tail = %row,
                    "the stream's last message is not in this server's WAL; nothing is skipped");
                None
            }
            TailVerdict::SkipThrough(row) => Some(row),
            TailVerdict::NothingToSkip(why) => {
                if let Some(why) = why {
                    warn!(stream = %config.stream, "{why}");
                }
                None
            }
            // The claim is ours, so the tail is the previous source's, from before the
            // operator moved the stream to this one (`--recreate-slot`).
            TailVerdict::OtherWriter(theirs) => {
                warn!(stream = %config.stream, previous = %theirs,
                "the stream's last message is another source's; nothing is skipped");
                None
            }
        };
        let rows = conn
            .simple_query(&format!(
                "SELECT confirmed_flush_lsn::pg_catalog.text, wal_status, active, \
                        pg_catalog.to_jsonb(s) ->> 'failover', \
                        pg_catalog.to_jsonb(s) ->> 'invalidation_reason' \
                 FROM pg_catalog.pg_replication_slots s \
                 WHERE slot_name = {}",
                postgres_protocol::escape::escape_literal(slot)
            ))
            .await?;
        let Some(row) = rows.first() else {
            return Err(PipelineError::SlotMissing { slot: slot.clone() });
        };
        let reason = row.get(4).and_then(Option::as_deref);
        if row.get(1).and_then(Option::as_deref).and_then(WalStatus::parse) == Some(WalStatus::Lost)
            || reason.is_some()
        {
            return Err(PipelineError::slot_invalidated(slot, reason));
        }
        let start: u64 = row
            .first()
            .and_then(Option::as_deref)
            .and_then(|lsn| lsn.parse::<tokio_postgres::types::PgLsn>().ok())
            .map(u64::from)
            .unwrap_or(0);
        // Kept across an attempt that gets no acknowledgement: a later one still judges by it.
        let stored = match memory.stored {
            Some(stored) => Some(stored),
            None if !memory.recorded_read => {
                memory.recorded_read = true;
                recorded_acknowledgement(&mut conn, publisher, config).await
            }
            None => None,
        };
        let tail_position = tail.origin.position;
        if let Some(stored) = stored {
            acknowledged_through(&mut memory.acknowledged_through, stored.position);
        }
        if let Some(forgotten) =
            stored.and_then(|s| Forgotten::judge(s, tail.last_sequence, tail_position, start))
        {
            metrics::counter!(names::STREAM_LOST_EVENTS).increment(forgotten.lost());
            let pinned = memory.horizon.as_ref().and_then(Horizon::pinned);
            // What waited rested on acknowledgements the stream no longer holds; the loss is
            // named once, and the stream's tail is where the next judgement starts.
            memory.horizon = None;
            memory.stored = None;
            memory.acknowledged_through = None;
            // The pointers the stream kept still wait for their objects to be looked at.
            memory.pointers.retain(|(pointer, _)| pointer.sequence <= tail.last_sequence);
            let only_in_the_table = match pinned.filter(|_| memory.seed.is_none()) {
                // A recovery's rows the stream lost within the horizon: only the table has
                // them. Otherwise the slot, held at the seed's end, gives back the rest, and
                // the seed's last row still waits to be vouched for.
                Some((seed_last, _, _)) if tail.last_sequence < seed_last.sequence => true,
                Some((seed_last, acked_at, end)) => {
                    let mut kept = Horizon::new(pipeline.durability_horizon, start);
                    kept.pin(seed_last, acked_at, end);
                    memory.horizon = Some(kept);
                    false
                }
                // A process started after the loss knows no pin: behind a horizon the slot
                // confirms nothing decoded before the stream kept it, so a loss past the slot
                // is of what the WAL never held, a recovery's rows (soak seed 29: a power
                // loss 3 s after a seed, with pgoutbox killed beside nats-server).
                None => {
                    memory.seed.is_none()
                        && !forgotten.refilled()
                        && !pipeline.durability_horizon.is_zero()
                }
            };
            if only_in_the_table {
                return Err(seed_again(&mut conn, &config.slot, &forgotten, memory).await);
            }
            match forgotten.refilled() {
                true => warn!(stream = %config.stream, "{forgotten}"),
                false => error!(stream = %config.stream, "{forgotten}"),
            }
            // A seed under way knows which rows the stream held before it lost some: it
            // begins again, from a new snapshot and what the stream holds now.
            if memory.seed.is_some() {
                memory.seed = None;
                let why = "the stream lost acknowledged events while seeding: seeding again";
                return Err(NatsFailure::new(NatsFailureKind::Request, why).into());
            }
        }
        objects_lost_before_start(publisher, &memory.pointers, &mut memory.objects_lost).await;
        // `failover` is a column from 17 on; --failover was refused below that at setup.
        if *failover && row.get(3).and_then(Option::as_deref) == Some("false") {
            conn.simple_query(&format!(
                "ALTER_REPLICATION_SLOT {} ( FAILOVER true )",
                postgres_protocol::escape::escape_identifier(slot)
            ))
            .await
            .map_err(|err| PipelineError::from_start_replication(slot, err))?;
            info!(%slot, "failover turned on for the existing slot");
        }
        // Always: `pgoutbox replay` hands its rows over as messages (PostgreSQL 14+).
        conn.start_replication(slot, start, &config.publication)
            .await
            .map_err(|err| PipelineError::from_start_replication(slot, err))?;
        // Stopped when this attempt ends, with the guard.
        let watched = Watched::of(&pipeline.tables, &outbox_tables, config.adoption());
        let liveness = Liveness::spawn(database, &config.pg_tls, slot, conn.backend_pid(), watched);
        info!(
            %slot,
            %source,
            from = %tokio_postgres::types::PgLsn::from(start),
            stream_sequence = tail.last_sequence,
            skip_through = skip_through.as_ref().map(|tail| tail.position.to_string()),
            walsender_pid = conn.backend_pid(),
            wal_sender_timeout = ?conn.wal_sender_timeout(),
            "streaming"
        );
        let resume = Resume {
            lsn: start,
            stream_sequence: tail.last_sequence,
            skip_through,
            source,
            message_limit: tail.message_limit,
            tables: outbox_tables,
            prelude: memory.seed.as_mut().map(Seed::prelude),
        };
        let outbound = publisher.outbound(dialer).await.map_err(|err| {
            NatsFailure::new(
                NatsFailureKind::Request,
                format!("opening the publishing connection: {err}"),
            )
        })?;
        readiness.set_streaming(true);
        Ok(Started { conn, resume, liveness, outbound })
    }
}

/// The tables this attempt streams, as the catalog has them now: each exact entry's
/// (or why it cannot be streamed), then each table a pattern matches, the first entry
/// naming a table winning. A matched table out of the publication is not streamed
/// (`service::liveness::adopter` adopts it beside the stream, from the attempt's start on).
async fn streamed_tables(
    conn: &mut ReplicationConnection,
    pipeline: &PipelineConfig,
    publication: &str,
) -> Result<Vec<StreamedTable>, PipelineError> {
    let mut tables: Vec<StreamedTable> = Vec::with_capacity(pipeline.tables.len());
    for (i, entry) in pipeline.tables.iter().enumerate().filter(|(_, e)| e.pattern.is_none()) {
        let query = outbox_table::query(&entry.table, publication, Some(&pipeline.replay_table));
        let rows = conn.simple_query(&query).await?;
        let table = outbox_table::judge(&rows, &entry.table, publication)?;
        tables.push(StreamedTable { entry: i, name: entry.table.clone(), table });
    }
    for (i, entry) in pipeline.tables.iter().enumerate() {
        let Some(pattern) = &entry.pattern else { continue };
        let rows = conn.simple_query(&tenant_tables::query(pattern, publication)).await?;
        for matched in tenant_tables::judge(&rows, pattern) {
            if tables.iter().any(|t| t.name == matched.table) {
                continue; // an earlier entry's
            }
            if !matched.published {
                continue;
            }
            let table = outbox_table::OutboxTable {
                oid: matched.oid,
                columns: matched.columns,
                replay: None,
            };
            tables.push(StreamedTable { entry: i, name: matched.table, table });
        }
    }
    Ok(tables)
}

/// A JetStream question asked at the start of an attempt, given [`LEADER_PROBE_TIMEOUT`]
/// to answer. `what` prefixes its errors; `silence` says what no answer likely means.
async fn leader_probe<T, E: std::fmt::Display>(
    what: &str,
    silence: &str,
    question: impl Future<Output = Result<T, E>>,
) -> Result<T, NatsFailure> {
    let failure = |why: &dyn std::fmt::Display| {
        NatsFailure::new(NatsFailureKind::Request, format!("{what}: {why}"))
    };
    match tokio::time::timeout(LEADER_PROBE_TIMEOUT, question).await {
        Ok(answer) => answer.map_err(|err| failure(&err)),
        Err(_) => {
            let waited = LEADER_PROBE_TIMEOUT.as_secs();
            Err(failure(&format!("no answer in {waited} s ({silence})")))
        }
    }
}

/// What the previous process recorded as acknowledged (`postgres::acknowledged`), read at
/// the first attempt: the memory a start after a restart of both pgoutbox and nats-server
/// has. `None` when there is no record, or it is of another stream.
async fn recorded_acknowledgement(
    conn: &mut ReplicationConnection,
    publisher: &Publisher,
    config: &Config,
) -> Option<Stored> {
    let table = acknowledged::table_beside(&config.pipeline.replay_table);
    let exists = conn.simple_query(&acknowledged::exists_sql(&table)).await.ok()?;
    if exists.first()?.first()?.as_deref() != Some("t") {
        return None;
    }
    let rows = conn.simple_query(&acknowledged::read_sql(&table, &config.slot)).await.ok()?;
    let stream = stream_identity(publisher, &config.stream).await?;
    acknowledged::parse_recorded(&rows, &stream)
}

/// The stream lost what a recovery (or backfill) seeded, within the durability horizon
/// after the seed ended: the WAL cannot give those rows back, and the slot was confirmed no
/// further than the seed's end (`Horizon::pin`), so nothing decoded since is lost with it.
/// The slot is dropped, and the next attempt seeds the stream from the table again, from a
/// new snapshot and what the stream holds then, as `run --recover` would.
async fn seed_again(
    conn: &mut ReplicationConnection,
    slot: &str,
    forgotten: &Forgotten,
    memory: &mut Memory,
) -> PipelineError {
    let loss = forgotten.loss();
    warn!(%slot, "{loss}; past the slot, within the durability horizon: rows a recovery \
        seeded, which only the table has: seeding again from the table, as `run --recover` \
        does (emitted events among them cannot come back)");
    let drop =
        format!("DROP_REPLICATION_SLOT {}", postgres_protocol::escape::escape_identifier(slot));
    if let Err(err) = conn.simple_query(&drop).await {
        return PipelineError::from_start_replication(slot, err);
    }
    memory.seed_wanted = Some(crate::service::seed::SeedKind::Recover);
    let why = "the stream lost rows a recovery seeded within the durability horizon: seeding again";
    NatsFailure::new(NatsFailureKind::Request, why).into()
}
