//! `pgoutbox run`: set up, then stream until SIGINT/SIGTERM, reconnecting on failures.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use opentelemetry_sdk::trace::Tracer;
use tracing::{info, warn};

use super::setup::{ensure_stream_and_slot, prepare_database};
use crate::domain::outbox::{EMITTED_LABEL, TableEntry, letter_row_in};
use crate::domain::retry::{Attempt, Backoff, Next, RepeatedError, RetryPolicy};
use crate::domain::stall::Progress;
use crate::nats::handshake::Dialer;
use crate::nats::publisher::Publisher;
use crate::postgres::{acknowledged, admin};
use crate::service::error::{NatsFailureKind, PipelineError};
use crate::service::pipeline::{Ended, Memory};
use crate::service::seed::SeedKind;
use crate::service::shutdown::Shutdown;
use crate::service::telemetry::{self, Metrics, Readiness, ReconnectTarget};
use crate::service::traces::Tracing;
use crate::settings::cli::RunArgs;
use crate::settings::config::PipelineConfig;
use crate::settings::config::{Config, ProcessEnv};
use attempt::Target;
use waiting::{
    JETSTREAM_RETRY_CAP, UNANSWERED, UNREACHABLE, jetstream_unanswered, patiently,
    wait_until_primary,
};

/// How long an ending `run` waits to record what JetStream acknowledged last.
const RECORD_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(5);

mod attempt;
mod waiting;

pub async fn run(config: &Config, args: &RunArgs) -> anyhow::Result<()> {
    if config.messages_only && args.message_prefix.is_empty() {
        anyhow::bail!(
            "--messages-only with an empty --message-prefix streams nothing: set a prefix"
        );
    }
    if config.messages_only && (args.recover || args.backfill) {
        anyhow::bail!(
            "--recover and --backfill publish rows of the outbox table, and --messages-only \
             reads no table: drop one"
        );
    }
    if config.messages_only && args.retention.is_some() {
        anyhow::bail!(
            "--retention deletes outbox rows, and --messages-only reads no table: drop one"
        );
    }
    let tracing = Tracing::from_env(&ProcessEnv);
    let outcome = serve(config, args, tracing.as_ref().map(Tracing::tracer)).await;
    if let Some(tracing) = tracing {
        // Bounded (`traces::SHUTDOWN_TIMEOUT`), and off the runtime's only thread.
        let _ = tokio::task::spawn_blocking(move || tracing.shutdown()).await;
    }
    outcome
}

/// Sets up, then streams until shutdown; `tracer` makes spans when traces are configured.
async fn serve(config: &Config, args: &RunArgs, tracer: Option<Tracer>) -> anyhow::Result<()> {
    // Every task beside the pipeline (signals, HTTP, stall watch, retention), stopped and
    // awaited when `run` ends.
    let mut tasks = tokio::task::JoinSet::new();
    let mut shutdown = Shutdown::listen(&mut tasks)?;
    let prometheus = telemetry::install_recorder()?;
    let emitted = (!args.message_prefix.is_empty()).then_some(EMITTED_LABEL.to_owned());
    let labels: Vec<String> =
        config.pipeline.tables.iter().map(TableEntry::metrics_label).chain(emitted).collect();
    Metrics::tables(labels.iter().map(String::as_str));
    let horizon = config.pipeline.durability_horizon.as_secs_f64();
    metrics::gauge!(crate::service::telemetry::names::DURABILITY_HORIZON_SECONDS).set(horizon);
    // Exported from the start, so that PgoutboxAdoptionStalled and PgoutboxTablesUnread
    // have a series to read.
    metrics::gauge!(crate::service::telemetry::names::ADOPTION_ROWS_READ).set(0.0);
    metrics::counter!(crate::service::telemetry::names::TABLES_UNREAD).increment(0);
    announce_durability(config.pipeline.durability_horizon);
    let readiness = Arc::new(Readiness::default());
    let http_addr = match args.http_addr {
        Some(addr) => Some(
            telemetry::serve(addr, prometheus, readiness.clone(), &mut tasks)
                .await
                .with_context(|| format!("listening on --http-addr {addr}"))?,
        ),
        None => {
            let addr = telemetry::DEFAULT_HTTP_ADDR;
            match telemetry::serve(addr, prometheus, readiness.clone(), &mut tasks).await {
                Ok(bound) => Some(bound),
                Err(err) => {
                    warn!(%err, "no HTTP endpoints: the default {addr} is taken; set --http-addr");
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
    if !args.message_prefix.is_empty() {
        super::setup::warn_if_public_may_emit(&client).await;
        let template = &config.pipeline.defaults.template;
        if template.names_table() {
            warn!(%template, prefix = %args.message_prefix,
                "emitted events become dead letters: the subject template names the row's \
                 table ({{$schema}}, {{$table}}), which an event's content may not say; set \
                 --message-prefix '' to stream tables only");
        }
    }
    if args.retention.is_some() {
        // A pattern's tables are looked at on each pass (`retention::servable`).
        for entry in config.pipeline.tables.iter().filter(|e| e.pattern.is_none()) {
            let column = &entry.roles.created_at;
            crate::postgres::admin::check_prerequisites(
                &client,
                &entry.table,
                &[("created-at column (for --retention)", column)],
            )
            .await?;
        }
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
    let publisher = Publisher::new(nats, &config.stream, crate::nats::connect::ACK_TIMEOUT)
        .with_schedules(config.schedules().cloned().collect());
    let nats_version = publisher.server_version();
    if let Some(warning) = crate::nats::server_version::unsupported(&nats_version) {
        warn!("{warning}");
    }
    Metrics::nats_info(&nats_version, false);
    let seed = match (args.recover, args.backfill) {
        (true, _) => Some(SeedKind::Recover),
        (_, true) => Some(SeedKind::Backfill),
        _ => None,
    };
    let set_up = || ensure_stream_and_slot(config, &client, &publisher, &args.slot, seed);
    let backoff = || Backoff::capped(JETSTREAM_RETRY_CAP);
    let Some((claims, seeding)) =
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
    // A stream seeded from the table is rebuilt: the record of what it acknowledged before
    // is not compared with it.
    memory.recorded_read = seeding.is_some();
    memory.seed_wanted = seeding;
    memory.tracer = tracer;
    if let Some(keep) = args.retention {
        // Dead letters of earlier runs that lack their payload: those rows must stay.
        let mut subjects: Vec<&str> =
            config.pipeline.tables.iter().map(|e| e.dead_letter_subject.as_str()).collect();
        subjects.sort_unstable();
        subjects.dedup();
        for subject in subjects {
            let read = || async {
                publisher.rows_of_letters_without_payload(subject).await.with_context(|| {
                    format!("reading the dead letters on {subject} that --retention must keep")
                })
            };
            let Some(rows) = patiently(
                UNANSWERED,
                jetstream_unanswered,
                backoff(),
                &mut shutdown,
                &readiness,
                read,
            )
            .await?
            else {
                return Ok(());
            };
            for (table, id) in rows {
                for entry in &config.pipeline.tables {
                    if let Some((table, row)) = letter_row_in(entry, &table, &id) {
                        memory.kept_rows.keep_letter_id(&table, &row);
                    }
                }
            }
        }
        let tables = config
            .pipeline
            .tables
            .iter()
            .map(|entry| crate::service::retention::RetainedTable {
                table: entry.table.clone(),
                pattern: entry.pattern.clone(),
                created_at: entry.roles.created_at.clone(),
                id: entry.roles.id.clone(),
            })
            .collect();
        let scope = crate::service::retention::Scope {
            tables,
            slot: config.slot.clone(),
            publication: config.publication.clone(),
            trusted: config.trusted_owners.clone(),
            acknowledged: memory.acknowledged.clone(),
        };
        tasks.spawn(crate::service::retention::run(
            config.database.clone(),
            config.pg_tls.clone(),
            scope,
            keep,
            memory.published_up_to.clone(),
            memory.kept_rows.clone(),
            shutdown.clone(),
        ));
    }
    let (stopped, stopped_rx) = tokio::sync::watch::channel(false);
    let recorder = tokio::spawn(crate::service::acknowledgements::record_every(
        config.database.clone(),
        config.pg_tls.clone(),
        (acknowledged::table_beside(&config.pipeline.replay_table), config.slot.clone()),
        publisher.clone(),
        memory.acknowledged.clone(),
        stopped_rx,
    ));
    if !args.verify_every.is_zero() {
        tasks.spawn(crate::service::delivery_check::run_every(
            crate::service::delivery_check::Scope::of(config),
            publisher.clone(),
            args.verify_every,
            memory.published_up_to.clone(),
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
        seed_margin: args.recover_margin,
    };
    let outcome = attempts(&target, &mut memory, &mut shutdown, &readiness).await;
    if let Some(seed) = memory.seed.take() {
        seed.abandon(config).await;
    }
    // The last acknowledgement recorded, bounded: a Postgres that is gone does not hold
    // the exit.
    stopped.send_replace(true);
    let _ = tokio::time::timeout(RECORD_AT_EXIT, recorder).await;
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
            Ok(Some(Ended::Drained { confirmed })) => {
                info!(
                    confirmed = %tokio_postgres::types::PgLsn::from(confirmed),
                    published = memory.published,
                    dead_letters = memory.dead_letters,
                    "stopped"
                );
                return Ok(());
            }
            Ok(Some(Ended::Seeded)) => match finish_seed(target, memory).await {
                Ok(()) => continue,
                Err(err) => err,
            },
            Ok(None) => return Ok(()),
            Err(err) => err,
        };
        let acknowledged = memory.progress.read().acks > acked_before;
        let attempt = Attempt { ran_for: started.elapsed(), acknowledged };
        let Next::RetryAfter(delay) = policy.after(err.failure(), attempt) else {
            return Err(err.into());
        };
        // A scheduled row the server delivered into the stream overtook the attempt's next
        // message: the next attempt reads the tail past it and anchors behind it, at once
        // when this one had got on (else, as any refusal, after the backoff). Not an error:
        // it is how every delivery ends an attempt.
        let overtaken = matches!(&err, PipelineError::Nats(failure)
            if failure.kind == NatsFailureKind::OutOfOrder)
            && target.config.schedules().next().is_some()
            && acknowledged;
        if overtaken {
            info!(%err, "the stream took a message pgoutbox did not write (a scheduled row \
                delivered?); streaming on behind it");
            continue;
        }
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
                if acknowledged {
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

/// Every row of the seed is in the stream: its slot becomes the slot, and streaming goes on
/// from where the seed's snapshot ended.
async fn finish_seed(target: &Target<'_>, memory: &mut Memory) -> Result<(), PipelineError> {
    if let Some(seed) = memory.seed.take() {
        let end = seed.consistent_point;
        seed.finish(target.config, &target.config.slot).await?;
        // Its rows come from the table, which the slot cannot give back: nothing past the
        // seed's end is confirmed until the stream still holds its last row a horizon
        // later, and a loss found before that seeds them again (`attempt::seed_again`).
        if let (Some(horizon), Some(stored)) = (memory.horizon.as_mut(), memory.stored) {
            horizon.pin(stored, std::time::Instant::now(), end);
        }
    }
    memory.seed_wanted = None;
    memory.forget_seed_rows();
    Metrics::seed_rows(0);
    Ok(())
}

/// One line on what the durability horizon keeps, or, at `0s`, what that gives up.
fn announce_durability(horizon: std::time::Duration) {
    if horizon.is_zero() {
        warn!(
            "--durability-horizon 0s: an event JetStream acknowledged is confirmed at once, \
            so a nats-server that loses power (or any crash of an R1 stream without \
            sync_interval: always) loses what it had not synced, up to 2 min of events; table \
            rows then come back only with `pgoutbox run --recover`, emitted events not at all"
        );
    } else {
        info!(
            horizon_s = horizon.as_secs_f64(),
            "durability horizon: the slot is confirmed \
            only once the stream still holds, that long after, what JetStream acknowledged; a \
            power loss of nats-server within it is published again from the WAL"
        );
    }
}

/// Purges the chunks of puts cut short, once this process holds the slot and before it
/// stores anything (housekeeping: a failure is logged, and the next start tries again).
async fn sweep_orphan_chunks(publisher: &Publisher, bucket: &str) {
    let js = publisher.context();
    match crate::nats::large_payloads::sweep_orphan_chunks(js, bucket).await {
        Ok(0) => {}
        Ok(purged) => info!(%bucket, purged, "purged chunks no object names (puts cut short)"),
        Err(err) => warn!(%bucket, %err, "could not purge the chunks of puts cut short"),
    }
    if let Some(bytes) = crate::nats::large_payloads::bucket_bytes(js, bucket).await {
        metrics::gauge!(telemetry::names::OBJECT_STORE_BYTES).set(bytes as f64);
    }
}
