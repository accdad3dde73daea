//! `pgoutbox run`: set up, then stream until SIGINT/SIGTERM, reconnecting on failures.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry_sdk::trace::Tracer;
use tracing::{info, warn};

use super::setup::{ensure_stream_and_slot, prepare_database};
use crate::domain::retry::{Attempt, Backoff, Next, RepeatedError, RetryPolicy};
use crate::domain::stall::Progress;
use crate::nats::publisher::Publisher;
use crate::service::error::{NatsFailureKind, PipelineError};
use crate::service::pipeline::{Ended, Memory};
use crate::service::seed::SeedKind;
use crate::service::shutdown::Shutdown;
use crate::service::telemetry::{self, Metrics, Readiness, ReconnectTarget};
use crate::service::traces::Tracing;
use crate::settings::cli::RunArgs;
use crate::settings::config::{Config, ProcessEnv};
use attempt::Target;
use startup::Tasks;
use waiting::{
    JETSTREAM_RETRY_CAP, UNANSWERED, jetstream_unanswered, patiently, wait_until_primary,
};

/// How long an ending `run` waits to record what JetStream acknowledged last.
const RECORD_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(5);

mod attempt;
mod startup;
mod waiting;

pub async fn run(config: &Config, args: &RunArgs) -> anyhow::Result<()> {
    if config.messages_only && args.slot.message_prefix.is_empty() {
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
    let mut tasks = Tasks::new();
    let mut shutdown = Shutdown::listen(&mut tasks)?;
    let prometheus = telemetry::install_recorder()?;
    telemetry::keep_histograms_folded(prometheus.clone(), &mut tasks);
    startup::export_metrics(config, args);
    startup::announce_durability(config.pipeline.durability_horizon);
    let readiness = Arc::new(Readiness::default());
    let http_addr = startup::serve_http(args, prometheus, &readiness, &mut tasks).await?;
    let database = startup::advertised(config, http_addr);
    if !args.slot.from_standby && !wait_until_primary(config, &mut shutdown, &readiness).await? {
        return Ok(());
    }
    let client = prepare_database(config, args.slot.from_standby).await?;
    startup::check_database(&client, config, args).await?;
    let Some((publisher, nats_disconnects)) =
        startup::connect_nats(config, &mut shutdown, &readiness).await?
    else {
        return Ok(());
    };
    let seed = SeedKind::asked(args.recover, args.backfill);
    let set_up = || ensure_stream_and_slot(config, &client, &publisher, &args.slot, seed);
    let backoff = Backoff::capped(JETSTREAM_RETRY_CAP);
    let Some((claims, seeding)) =
        patiently(UNANSWERED, jetstream_unanswered, backoff, &mut shutdown, &readiness, set_up)
            .await?
    else {
        return Ok(());
    };
    startup::export_versions(&client, config, &publisher).await?;
    drop(client);

    let progress = Arc::new(Progress::default());
    let stall_timeout = args.stall_timeout;
    tasks.spawn(telemetry::watch_stalls(progress.clone(), readiness.clone(), stall_timeout));
    let mut memory = Memory::new(progress, nats_disconnects);
    // A stream seeded from the table is rebuilt: the record of what it acknowledged before
    // is not compared with it.
    memory.recorded_read = seeding.is_some();
    memory.seed_wanted = seeding;
    memory.tracer = tracer;
    if let Some(keep) = args.retention {
        let waiting = (&mut shutdown, &*readiness);
        let retention = (config, keep);
        if !startup::start_retention(retention, &publisher, &mut memory, waiting, &mut tasks)
            .await?
        {
            return Ok(());
        }
    }
    let (stopped, stopped_rx) = tokio::sync::watch::channel(false);
    let recorder = startup::start_recorder(config, &publisher, &memory, stopped_rx);
    if !args.verify_every.is_zero() {
        let published = memory.published_up_to.clone();
        tasks.spawn(crate::service::delivery_check::run_every(
            crate::service::delivery_check::Scope::of(config),
            publisher.clone(),
            args.verify_every,
            published,
            shutdown.clone(),
        ));
    }
    let target = Target::of((config, args), database, publisher, claims);
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
    let mut announced = Announced::default();
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
        if overtaken(target, &err)
            && let Some(pause) = policy.after_overtaken(attempt)
        {
            info!(%err, "the stream took a message pgoutbox did not write (a scheduled row \
                delivered?); streaming on behind it");
            tokio::select! {
                () = tokio::time::sleep(pause) => continue,
                () = shutdown.requested() => return Ok(()),
            }
        }
        announced.failure(&err, acknowledged, delay, readiness);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.requested() => return Ok(()),
        }
    }
}

/// Whether a scheduled row the server delivered into the stream overtook the attempt's
/// next message: the next attempt reads the tail past it and anchors behind it, as soon as
/// `RetryPolicy::after_overtaken` says. Not an error: it is how every delivery ends an
/// attempt.
fn overtaken(target: &Target<'_>, err: &PipelineError) -> bool {
    matches!(err, PipelineError::Nats(failure) if failure.kind == NatsFailureKind::OutOfOrder)
        && target.config.schedules().next().is_some()
}

/// What the failures of attempts were told as so far: waiting as a standby and for a
/// primary once each, an error again and again once per repeat count.
#[derive(Default)]
struct Announced {
    standby: bool,
    recovery: bool,
    repeats: RepeatedError,
}

impl Announced {
    /// Says why an attempt ended, on `/readyz`, in the log and in the metrics, before the
    /// next one in `delay`.
    fn failure(
        &mut self,
        err: &PipelineError,
        acknowledged: bool,
        delay: std::time::Duration,
        readiness: &Readiness,
    ) {
        match err {
            PipelineError::SlotBusy { slot } => {
                readiness.set_standby(slot);
                if !self.standby {
                    info!(%slot, "slot is in use by another pgoutbox; waiting as hot standby");
                    self.standby = true;
                }
            }
            PipelineError::InRecovery { .. } => {
                if !self.recovery {
                    warn!("{err}");
                    self.recovery = true;
                }
                readiness.set_retrying_after(err.to_string());
            }
            _ => {
                if acknowledged {
                    self.repeats = RepeatedError::default(); // it recovered in between
                }
                count_reconnect(err);
                let error = err.to_string();
                match self.repeats.note(&error) {
                    Some(repeated) => warn!(%error, retry_in = ?delay, repeated, "reconnecting"),
                    None => tracing::debug!(%error, retry_in = ?delay, "reconnecting"),
                }
                readiness.set_retrying_after(error);
            }
        }
    }
}

/// Counts a reconnection to Postgres, or a publish error by kind.
fn count_reconnect(err: &PipelineError) {
    match err {
        PipelineError::Postgres(_) => Metrics::reconnect(ReconnectTarget::Postgres),
        PipelineError::Nats(failure) => {
            if let Some(kind) = failure.kind.publish_error_label() {
                Metrics::publish_error(kind);
            }
        }
        _ => {}
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
