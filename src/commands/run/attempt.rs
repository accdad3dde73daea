//! One connection attempt: started within a deadline and abandoned at once on SIGTERM,
//! then streamed until it fails or shutdown drains it.

use std::collections::HashSet;
use std::time::Duration;

use tracing::info;

use crate::domain::progress::Position;
use crate::domain::source::{Source, TailRow};
use crate::nats::claim::{Claim, Claims};
use crate::nats::handshake::Dialer;
use crate::nats::outbound::{Acks, Outbound};
use crate::nats::publisher::Publisher;
use crate::postgres::outbox_table::StreamedTable;
use crate::postgres::tenant_tables;
use crate::postgres::{ConnectionError, ReplicationConnection, outbox_table};
use crate::service::error::{NatsFailure, NatsFailureKind, PipelineError};
use crate::service::liveness::{Liveness, Watched};
use crate::service::pipeline::{Ended, Memory, Pipeline, Resume, objects_lost_before_start};
use crate::service::seed::Seed;
use crate::service::shutdown::Shutdown;
use crate::service::telemetry::{Metrics, Readiness};
use crate::settings::cli::RunArgs;
use crate::settings::config::{Config, PipelineConfig};

mod lost;
mod slot;

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

impl<'a> Target<'a> {
    /// What every attempt of `run` streams from and to, as the settings say.
    pub fn of(
        (config, args): (&'a Config, &RunArgs),
        database: tokio_postgres::Config,
        publisher: Publisher,
        claims: Claims,
    ) -> Target<'a> {
        Target {
            config,
            pipeline: PipelineConfig {
                max_in_flight_bytes: args.max_in_flight_bytes,
                message_prefix: Some(args.slot.message_prefix.clone()).filter(|p| !p.is_empty()),
                ..config.pipeline.clone()
            },
            database,
            publisher,
            dialer: Dialer::new(&config.nats),
            claims,
            failover: args.slot.failover,
            from_standby: args.slot.from_standby,
            seed_margin: args.recover_margin,
        }
    }
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
    /// what the tail lets us skip and what the stream lost, and starts replication.
    async fn start(
        &self,
        memory: &mut Memory,
        readiness: &Readiness,
    ) -> Result<Started, PipelineError> {
        let Target { config, pipeline, database, publisher, dialer, failover, .. } = self;
        let tail = publisher.tail(memory.stored);
        let tail = leader_probe("reading the end of the stream", "no stream leader?", tail).await?;
        // async-nats may have moved to another server of the list since.
        Metrics::nats_info(&publisher.server_version(), true);
        let mut conn = ReplicationConnection::connect(database, &config.pg_tls).await?;
        // A seed publishes from its own slot until it is done (`service::seed`).
        let slot = memory.seed.as_ref().map_or(&config.slot, |seed| &seed.slot).clone();
        let identity = conn.identify_system().await?;
        self.refuse_a_server_in_recovery(&mut conn, &slot).await?;
        let outbox_tables = streamed_tables(&mut conn, pipeline, &config.publication).await?;
        // The source is named by the slot it streams from for good, also while seeding.
        let source =
            Source::new(identity.system_id, identity.timeline, &identity.database, &config.slot);
        self.hold_the_claim(&source, &slot).await?;
        let skip_through =
            slot::what_the_tail_skips(&mut conn, config, &source, identity.wal_end, &tail, memory)
                .await?;
        let slot_state = slot::SlotStart::read(&mut conn, &slot).await?;
        lost::judge_what_the_stream_lost(self, &mut conn, memory, &tail, slot_state.start).await?;
        objects_lost_before_start(publisher, &memory.pointers, &mut memory.objects_lost).await;
        if *failover && slot_state.failover == Some(false) {
            slot::turn_failover_on(&mut conn, &slot).await?;
        }
        // Always: `pgoutbox replay` hands its rows over as messages (PostgreSQL 14+).
        let from = sent_from(slot_state.start, skip_through.as_ref(), &memory.objects_lost);
        conn.start_replication(&slot, from, &config.publication)
            .await
            .map_err(|err| PipelineError::from_start_replication(&slot, err))?;
        // Stopped when this attempt ends, with the guard.
        let watched = Watched::of(&pipeline.tables, &outbox_tables, config.adoption());
        let liveness =
            Liveness::spawn(database, &config.pg_tls, &slot, conn.backend_pid(), watched);
        let tables: Vec<String> = config
            .pipeline
            .tables
            .iter()
            .map(|e| e.pattern.as_ref().map_or(e.table.to_string(), ToString::to_string))
            .collect();
        info!(
            %slot,
            tables = %tables.join(","),
            stream = %config.stream,
            nats = %config.nats.describe(),
            %source,
            from = %tokio_postgres::types::PgLsn::from(slot_state.start),
            sent_from = %tokio_postgres::types::PgLsn::from(from),
            stream_sequence = tail.last_sequence,
            skip_through = skip_through.as_ref().map(|tail| tail.position.to_string()),
            walsender_pid = conn.backend_pid(),
            wal_sender_timeout = ?conn.wal_sender_timeout(),
            "streaming"
        );
        let resume = Resume {
            lsn: slot_state.start,
            stream_sequence: tail.last_sequence,
            skip_through,
            tail_sequence: tail.origin.sequence,
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

    /// A standby (or one being promoted) has no say about the slot yet: the attempt waits,
    /// unless `--from-standby` makes the standby where the slot lives.
    async fn refuse_a_server_in_recovery(
        &self,
        conn: &mut ReplicationConnection,
        slot: &str,
    ) -> Result<(), PipelineError> {
        let recovery = conn.simple_query("SELECT pg_catalog.pg_is_in_recovery()").await?;
        if !self.from_standby
            && recovery.first().and_then(|r| r.first()).and_then(Option::as_deref) == Some("t")
        {
            return Err(PipelineError::InRecovery { slot: slot.to_owned() });
        }
        Ok(())
    }

    /// This source still holds the stream: another's claim ends the attempt.
    async fn hold_the_claim(&self, source: &Source, slot: &str) -> Result<(), PipelineError> {
        let stream = &self.config.stream;
        let claim = leader_probe(
            "checking the stream's claim",
            "no leader for the claims bucket?",
            self.claims.claim(stream, source),
        )
        .await?;
        if let Claim::Theirs(writer) = claim {
            return Err(PipelineError::stream_claimed(stream, writer, &source.database, slot));
        }
        Ok(())
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

/// Where the walsender is asked to begin sending: the transaction of the stream's tail,
/// when it is ours and past where the slot stands, or of an earlier row whose pointer lost
/// its object (its row is what stores the object again). The slot trails the stream by
/// the durability horizon, and every transaction in between would be sent again, decoded
/// and skipped at each attempt's start; Postgres still decodes from the slot but sends
/// none that committed before the position asked for, and the tail's own transaction is
/// sent, whole, for the tail skip to check (`domain::publishing`). `start` stays what the
/// attempt confirms from.
fn sent_from(start: u64, skip_through: Option<&TailRow>, objects_lost: &HashSet<Position>) -> u64 {
    let Some(tail) = skip_through else { return start };
    // A seeded row's (commit LSN 0) comes from the table, never from the slot.
    let lost = objects_lost.iter().map(|p| p.commit_lsn).filter(|lsn| *lsn > 0).min();
    let needed = lost.map_or(tail.position.commit_lsn, |lost| lost.min(tail.position.commit_lsn));
    needed.max(start)
}

#[cfg(test)]
mod sent_from_tests {
    use super::*;

    fn tail(commit_lsn: u64) -> TailRow {
        TailRow { position: Position { commit_lsn, index: 3 }, msg_id: "id".to_owned() }
    }

    #[test]
    fn a_restart_is_sent_from_the_tail_s_transaction_past_the_slot() {
        let none = HashSet::new();
        assert_eq!(sent_from(100, Some(&tail(500)), &none), 500);
        assert_eq!(sent_from(700, Some(&tail(500)), &none), 700, "never before the slot");
        assert_eq!(sent_from(100, None, &none), 100, "no tail of ours: from the slot");
        assert_eq!(sent_from(100, Some(&tail(0)), &none), 100, "a seeded tail");
    }

    #[test]
    fn a_lost_object_s_row_is_sent_again() {
        let lost = HashSet::from([Position { commit_lsn: 300, index: 0 }]);
        assert_eq!(sent_from(100, Some(&tail(500)), &lost), 300);
        let seeded = HashSet::from([Position { commit_lsn: 0, index: 7 }]);
        assert_eq!(sent_from(100, Some(&tail(500)), &seeded), 500, "a seeded row's is not");
    }
}
