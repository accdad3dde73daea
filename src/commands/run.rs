//! `pgoutbox run`: set up, then stream until SIGINT/SIGTERM, reconnecting on failures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use tracing::{info, warn};

use super::Backoff;
use super::setup::{ensure_stream_and_slot, prepare_database};
use crate::cli::RunArgs;
use crate::config::Config;
use crate::error::PipelineError;
use crate::pipeline::{Ended, Memory, Pipeline};
use crate::publisher::Publisher;
use crate::replication::ReplicationConnection;
use crate::replication::connection::quote_literal;
use crate::shutdown::Shutdown;
use crate::telemetry::{self, Metrics, Readiness};

/// A connection that streamed at least this long earns a fresh backoff.
const HEALTHY_RUN: Duration = Duration::from_secs(10);
/// How often a standby checks whether the slot became free.
const STANDBY_POLL: Duration = Duration::from_secs(1);

pub async fn run(config: &Config, args: &RunArgs) -> anyhow::Result<()> {
    let mut shutdown = Shutdown::listen()?;
    let prometheus = telemetry::install_recorder()?;
    let readiness = Arc::new(Readiness::default());
    match args.http_addr {
        Some(addr) => {
            telemetry::serve(addr, prometheus, readiness.clone())
                .await
                .with_context(|| format!("listening on --http-addr {addr}"))?;
        }
        None => {
            let addr = telemetry::DEFAULT_HTTP_ADDR;
            if let Err(err) = telemetry::serve(addr.into(), prometheus, readiness.clone()).await {
                warn!(%err, "no HTTP endpoints: the default {addr:?} is taken; set --http-addr");
            }
        }
    }
    let client = prepare_database(config).await?;
    if args.retention.is_some() {
        let column = &config.pipeline.roles.created_at;
        crate::slot::check_prerequisites(
            &client,
            &config.table,
            &[("created-at column (for --retention)", column)],
        )
        .await?;
    }
    let Some(nats) = connect_nats_patiently(config, &mut shutdown).await else {
        return Ok(());
    };
    readiness.set_nats(nats.clone());
    let publisher = Publisher::new(nats, &config.stream, super::ACK_TIMEOUT);
    ensure_stream_and_slot(config, &client, &publisher, args.slot.recreate_slot).await?;
    drop(client);

    let mut memory = Memory::new(readiness.clone(), args.stall_timeout);
    if let Some(keep) = args.retention {
        let column = config.pipeline.roles.created_at.clone();
        tokio::spawn(crate::retention::run(
            config.database.clone(),
            config.pg_tls.clone(),
            config.table.clone(),
            column,
            keep,
            memory.published_up_to.clone(),
            shutdown.clone(),
        ));
    }
    let mut backoff = Backoff::new();
    let mut standby_announced = false;
    loop {
        let started = Instant::now();
        let outcome = stream_once(config, &publisher, &mut memory, &mut shutdown, &readiness).await;
        readiness.set_streaming(false);
        let delay = match outcome {
            Ok(Ended::Drained { confirmed }) => {
                info!(
                    confirmed = %tokio_postgres::types::PgLsn::from(confirmed),
                    published = memory.published,
                    dead_letters = memory.dead_letters,
                    "stopped"
                );
                return Ok(());
            }
            Err(PipelineError::SlotBusy { slot }) => {
                if !standby_announced {
                    info!(%slot, "slot is in use by another pgoutbox; waiting as hot standby");
                    standby_announced = true;
                }
                STANDBY_POLL
            }
            Err(err) if err.is_retryable() => {
                if let PipelineError::Postgres(_) = err {
                    Metrics::reconnect("postgres");
                }
                if started.elapsed() >= HEALTHY_RUN {
                    backoff.reset();
                }
                let delay = backoff.next_delay();
                warn!(error = %err, retry_in = ?delay, "reconnecting");
                delay
            }
            Err(err) => return Err(err.into()),
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.requested() => return Ok(()),
        }
    }
}

/// One connection attempt: read where the stream ends, start replication, stream.
async fn stream_once(
    config: &Config,
    publisher: &Publisher,
    memory: &mut Memory,
    shutdown: &mut Shutdown,
    readiness: &Readiness,
) -> Result<Ended, PipelineError> {
    let tail = publisher
        .tail()
        .await
        .map_err(|err| PipelineError::Nats(format!("reading the end of the stream: {err}")))?;
    let mut conn = ReplicationConnection::connect(&config.database, &config.pg_tls).await?;
    let slot = &config.slot;
    let rows = conn
        .simple_query(&format!(
            "SELECT confirmed_flush_lsn::text, wal_status, active FROM pg_replication_slots \
             WHERE slot_name = {}",
            quote_literal(slot)
        ))
        .await?;
    let Some(row) = rows.first() else {
        return Err(PipelineError::SlotMissing { slot: slot.clone() });
    };
    if row.get(1).and_then(Option::as_deref) == Some("lost") {
        let detail = "wal_status = lost".to_owned();
        return Err(PipelineError::SlotInvalidated { slot: slot.clone(), detail });
    }
    let start: u64 = row
        .first()
        .and_then(Option::as_deref)
        .and_then(|lsn| lsn.parse::<tokio_postgres::types::PgLsn>().ok())
        .map(u64::from)
        .unwrap_or(0);
    conn.start_replication(slot, start, &config.publication)
        .await
        .map_err(|err| PipelineError::from_start_replication(slot, err))?;
    readiness.set_streaming(true);
    info!(
        %slot,
        from = %tokio_postgres::types::PgLsn::from(start),
        stream_sequence = tail.last_sequence,
        "streaming"
    );
    Pipeline::new(&config.pipeline, conn, publisher, memory, start, tail).run(shutdown).await
}

/// NATS may come up after us: retry with backoff, saying so, until it answers.
async fn connect_nats_patiently(
    config: &Config,
    shutdown: &mut Shutdown,
) -> Option<async_nats::Client> {
    let mut backoff = Backoff::new();
    loop {
        match super::connect_nats(config).await {
            Ok(client) => return Some(client),
            Err(err) => {
                let delay = backoff.next_delay();
                warn!(error = format!("{err:#}"), retry_in = ?delay, "NATS unreachable; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.requested() => return None,
                }
            }
        }
    }
}
