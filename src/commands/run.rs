//! `pgoutbox run`: set up, then stream until SIGINT/SIGTERM, reconnecting on failures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use tracing::{info, warn};

use super::setup::{ensure_stream_and_slot, prepare_database};
use crate::domain::retry::{Backoff, Next, RepeatedError, RetryPolicy};
use crate::domain::source::{Source, TailVerdict, judge_tail, parse_timeline_history};
use crate::domain::stall::Progress;
use crate::nats::claim::{Claim, Claims};
use crate::nats::handshake::Dialer;
use crate::nats::publisher::Publisher;
use crate::postgres::ReplicationConnection;
use crate::postgres::admin::{self, WalStatus};
use crate::postgres::outbox_table;
use crate::service::error::{NatsFailure, NatsFailureKind, PipelineError};
use crate::service::liveness::Liveness;
use crate::service::pipeline::{Ended, Memory, Pipeline, Resume};
use crate::service::shutdown::Shutdown;
use crate::service::telemetry::{self, Metrics, Readiness, ReconnectTarget};
use crate::settings::cli::RunArgs;
use crate::settings::config::Config;
use crate::settings::config::PipelineConfig;
use waiting::{
    JETSTREAM_RETRY_CAP, UNANSWERED, UNREACHABLE, jetstream_unanswered, patiently,
    wait_until_primary,
};

mod waiting;

/// Reading the stream's end or its claim takes milliseconds; no answer means no leader
/// yet for the stream or the claims bucket (an election), and retrying soon beats waiting
/// out async-nats's 10 s request timeout (which added 10 s to 1 leader election in 9 in
/// the benchmark, when the claims bucket had lost its leader too).
const LEADER_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

pub async fn run(config: &Config, args: &RunArgs) -> anyhow::Result<()> {
    if config.messages_only && args.message_prefix.is_empty() {
        anyhow::bail!(
            "--messages-only with an empty --message-prefix streams nothing: set a prefix"
        );
    }
    if config.messages_only && args.retention.is_some() {
        anyhow::bail!(
            "--retention deletes outbox rows, and --messages-only reads no table: drop one"
        );
    }
    // Every task beside the pipeline (signals, HTTP, stall watch, retention), stopped and
    // awaited when `run` ends.
    let mut tasks = tokio::task::JoinSet::new();
    let mut shutdown = Shutdown::listen(&mut tasks)?;
    let prometheus = telemetry::install_recorder()?;
    let readiness = Arc::new(Readiness::default());
    let http_addr = match args.http_addr {
        Some(addr) => Some(
            telemetry::serve(addr, prometheus, readiness.clone(), &mut tasks)
                .await
                .with_context(|| format!("listening on --http-addr {addr}"))?,
        ),
        None => {
            let addr = telemetry::DEFAULT_HTTP_ADDR;
            match telemetry::serve(addr.into(), prometheus, readiness.clone(), &mut tasks).await {
                Ok(bound) => Some(bound),
                Err(err) => {
                    warn!(%err, "no HTTP endpoints: the default {addr:?} is taken; set --http-addr");
                    None
                }
            }
        }
    };
    let mut database = config.database.clone();
    if let Some(addr) = http_addr
        && database.get_application_name().is_none()
    {
        database.application_name(format!("{}{addr}", telemetry::ADVERTISED_PREFIX));
    }
    if !args.slot.from_standby && !wait_until_primary(config, &mut shutdown, &readiness).await? {
        return Ok(());
    }
    let client = prepare_database(config, args.slot.from_standby).await?;
    if args.retention.is_some() {
        let column = &config.pipeline.roles.created_at;
        crate::postgres::admin::check_prerequisites(
            &client,
            &config.table,
            &[("created-at column (for --retention)", column)],
        )
        .await?;
    }
    let (disconnects, nats_disconnects) = tokio::sync::watch::channel(0);
    let disconnects = Arc::new(disconnects);
    let connect = || {
        crate::nats::connect::connect_nats_watched(&config.nats, disconnects.clone(), || {
            Metrics::reconnect(ReconnectTarget::Nats)
        })
    };
    let Some(nats) =
        patiently(UNREACHABLE, |_| true, Backoff::new(), &mut shutdown, &readiness, connect)
            .await?
    else {
        return Ok(());
    };
    readiness.set_nats(nats.clone());
    let publisher = Publisher::new(nats, &config.stream, crate::nats::connect::ACK_TIMEOUT);
    let nats_version = publisher.server_version();
    if let Some(warning) = crate::nats::server_version::unsupported(&nats_version) {
        warn!("{warning}");
    }
    Metrics::nats_info(&nats_version, false);
    let set_up = || ensure_stream_and_slot(config, &client, &publisher, &args.slot);
    let backoff = || Backoff::capped(JETSTREAM_RETRY_CAP);
    let Some(claims) =
        patiently(UNANSWERED, jetstream_unanswered, backoff(), &mut shutdown, &readiness, set_up)
            .await?
    else {
        return Ok(());
    };
    Metrics::nats_info(&publisher.server_version(), true);
    let (_, version) = admin::server_version(&client).await?;
    let slot = admin::slot_state(&client, &config.slot).await?;
    Metrics::postgres_info(
        &version,
        slot.as_ref().and_then(|s| s.failover),
        slot.and_then(|s| s.synced),
    );
    drop(client);

    let progress = Arc::new(Progress::default());
    tasks.spawn(crate::service::telemetry::watch_stalls(
        progress.clone(),
        readiness.clone(),
        args.stall_timeout,
    ));
    let mut memory = Memory::new(progress, nats_disconnects);
    if let Some(keep) = args.retention {
        // Dead letters of earlier runs that lack their payload: those rows must stay.
        let subject = &config.pipeline.dead_letter_subject;
        let read = || async {
            publisher.ids_of_letters_without_payload(subject).await.with_context(|| {
                format!("reading the dead letters on {subject} that --retention must keep")
            })
        };
        let Some(ids) =
            patiently(UNANSWERED, jetstream_unanswered, backoff(), &mut shutdown, &readiness, read)
                .await?
        else {
            return Ok(());
        };
        for id in ids {
            memory.kept_rows.keep_letter_id(&id);
        }
        let roles = &config.pipeline.roles;
        let columns = crate::service::retention::Columns {
            created_at: roles.created_at.clone(),
            id: roles.id.clone(),
        };
        tasks.spawn(crate::service::retention::run(
            config.database.clone(),
            config.pg_tls.clone(),
            config.table.clone(),
            columns,
            keep,
            memory.published_up_to.clone(),
            memory.kept_rows.clone(),
            shutdown.clone(),
        ));
    }
    let target = Target {
        config,
        pipeline: PipelineConfig {
            max_in_flight_bytes: args.max_in_flight_bytes,
            message_prefix: Some(args.message_prefix.clone()).filter(|p| !p.is_empty()),
            ..config.pipeline.clone()
        },
        database,
        publisher,
        dialer: Dialer::new(&config.nats),
        claims,
        failover: args.slot.failover,
        from_standby: args.slot.from_standby,
    };
    let outcome = attempts(&target, &mut memory, &mut shutdown, &readiness).await;
    tasks.shutdown().await;
    outcome
}

/// Connection attempts until shutdown or a failure that retrying cannot mend, waiting
/// between them as `RetryPolicy` says.
async fn attempts(
    target: &Target<'_>,
    memory: &mut Memory,
    shutdown: &mut Shutdown,
    readiness: &Readiness,
) -> anyhow::Result<()> {
    let mut policy = RetryPolicy::default();
    let mut standby_announced = false;
    let mut recovery_announced = false;
    let mut repeats = RepeatedError::default();
    loop {
        let started = Instant::now();
        // Acks over all attempts, recorded when each attempt ends.
        let acked_before = memory.progress.read().acks;
        let outcome = target.stream_once(memory, shutdown, readiness).await;
        readiness.set_streaming(false);
        let err = match outcome {
            Ok(Ended::Drained { confirmed }) => {
                info!(
                    confirmed = %tokio_postgres::types::PgLsn::from(confirmed),
                    published = memory.published,
                    dead_letters = memory.dead_letters,
                    "stopped"
                );
                return Ok(());
            }
            Err(err) => err,
        };
        let Next::RetryAfter(delay) = policy.after(err.failure(), started.elapsed()) else {
            return Err(err.into());
        };
        match &err {
            PipelineError::SlotBusy { slot } => {
                readiness.set_standby(slot);
                if !standby_announced {
                    info!(%slot, "slot is in use by another pgoutbox; waiting as hot standby");
                    standby_announced = true;
                }
            }
            PipelineError::InRecovery { .. } => {
                if !recovery_announced {
                    warn!("{err}");
                    recovery_announced = true;
                }
                readiness.set_retrying_after(err.to_string());
            }
            _ => {
                if memory.progress.read().acks > acked_before {
                    repeats = RepeatedError::default(); // it recovered in between
                }
                match &err {
                    PipelineError::Postgres(_) => Metrics::reconnect(ReconnectTarget::Postgres),
                    PipelineError::Nats(failure) => {
                        if let Some(kind) = failure.kind.publish_error_label() {
                            Metrics::publish_error(kind);
                        }
                    }
                    _ => {}
                }
                let error = err.to_string();
                match repeats.note(&error) {
                    Some(repeated) => warn!(%error, retry_in = ?delay, repeated, "reconnecting"),
                    None => tracing::debug!(%error, retry_in = ?delay, "reconnecting"),
                }
                readiness.set_retrying_after(error);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.requested() => return Ok(()),
        }
    }
}

/// Where each attempt streams from and to: fixed for the life of `run`.
struct Target<'a> {
    config: &'a Config,
    pipeline: PipelineConfig,
    /// The configured connection with the advertised `application_name`.
    database: tokio_postgres::Config,
    publisher: Publisher,
    /// Opens each attempt's publishing connection.
    dialer: Dialer<'a>,
    claims: Claims,
    /// `--failover`: the slot must be a failover slot (17+, checked at setup).
    failover: bool,
    /// `--from-standby`: a server in recovery is where the slot lives, not a wait.
    from_standby: bool,
}

impl Target<'_> {
    /// One connection attempt: read where the stream ends, make sure this source still holds
    /// the stream, decide what the tail lets us skip, start replication, stream.
    async fn stream_once(
        &self,
        memory: &mut Memory,
        shutdown: &mut Shutdown,
        readiness: &Readiness,
    ) -> Result<Ended, PipelineError> {
        let Target {
            config,
            pipeline,
            database,
            publisher,
            dialer,
            claims,
            failover,
            from_standby,
        } = self;
        let tail =
            leader_probe("reading the end of the stream", "no stream leader?", publisher.tail())
                .await?;
        // async-nats may have moved to another server of the list since.
        Metrics::nats_info(&publisher.server_version(), true);
        let mut conn = ReplicationConnection::connect(database, &config.pg_tls).await?;
        let slot = &config.slot;
        let identity = conn.identify_system().await?;
        // A standby (or one being promoted) has no say about the slot yet: wait.
        let recovery = conn.simple_query("SELECT pg_is_in_recovery()").await?;
        if !from_standby
            && recovery.first().and_then(|r| r.first()).and_then(Option::as_deref) == Some("t")
        {
            return Err(PipelineError::InRecovery { slot: slot.clone() });
        }
        let outbox_table = match &pipeline.table {
            Some(table) => {
                let query = outbox_table::query(table, &config.publication);
                let rows = conn.simple_query(&query).await?;
                Some(outbox_table::judge(&rows, table, &config.publication)?)
            }
            None => None,
        };
        let source = Source::new(identity.system_id, identity.timeline, &identity.database, slot);
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
        let skip_through = match judge_tail(&source, identity.wal_end, &history, &tail.origin) {
            TailVerdict::SkipThrough(position) => Some(position),
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
                "SELECT confirmed_flush_lsn::text, wal_status, active, \
                        to_jsonb(s) ->> 'failover', to_jsonb(s) ->> 'invalidation_reason' \
                 FROM pg_replication_slots s \
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
        let messages = pipeline.message_prefix.is_some();
        conn.start_replication(slot, start, &config.publication, messages)
            .await
            .map_err(|err| PipelineError::from_start_replication(slot, err))?;
        // Stopped when this attempt ends, with the guard.
        let liveness = Liveness::spawn(database, &config.pg_tls, slot, conn.backend_pid());
        readiness.set_streaming(true);
        info!(
            %slot,
            %source,
            from = %tokio_postgres::types::PgLsn::from(start),
            stream_sequence = tail.last_sequence,
            skip_through = skip_through.map(|p| p.to_string()),
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
            table: outbox_table,
        };
        let outbound = publisher.outbound(dialer).await.map_err(|err| {
            NatsFailure::new(
                NatsFailureKind::Request,
                format!("opening the publishing connection: {err}"),
            )
        })?;
        Pipeline::new(pipeline, conn, outbound, memory, resume, liveness.verdict(), publisher)
            .run(shutdown)
            .await
    }
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
