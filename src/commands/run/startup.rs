//! The steps `run` takes before its first attempt, each named for what an operator would
//! see it do: metrics and HTTP, checks on the database, NATS, and the tasks beside the
//! pipeline (`--retention`, the record of what JetStream acknowledged, `--verify-every`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tracing::{info, warn};

use super::waiting::{
    JETSTREAM_RETRY_CAP, UNANSWERED, UNREACHABLE, jetstream_unanswered, patiently,
};
use crate::domain::outbox::{EMITTED_LABEL, TableEntry, letter_row_in};
use crate::domain::retry::Backoff;
use crate::nats::publisher::Publisher;
use crate::postgres::{acknowledged, admin};
use crate::service::pipeline::Memory;
use crate::service::shutdown::Shutdown;
use crate::service::telemetry::{self, Metrics, Readiness, ReconnectTarget};
use crate::settings::cli::RunArgs;
use crate::settings::config::Config;

/// The tasks that run beside the pipeline, stopped and awaited when `run` ends.
pub type Tasks = tokio::task::JoinSet<()>;

/// The series exported from the start: each table's, the durability horizon, and those
/// PgoutboxAdoptionStalled and PgoutboxTablesUnread read.
pub fn export_metrics(config: &Config, args: &RunArgs) {
    let emitted = (!args.slot.message_prefix.is_empty()).then_some(EMITTED_LABEL.to_owned());
    let labels: Vec<String> =
        config.pipeline.tables.iter().map(TableEntry::metrics_label).chain(emitted).collect();
    Metrics::tables(labels.iter().map(String::as_str));
    let horizon = config.pipeline.durability_horizon.as_secs_f64();
    metrics::gauge!(telemetry::names::DURABILITY_HORIZON_SECONDS).set(horizon);
    metrics::gauge!(telemetry::names::ADOPTION_ROWS_READ).set(0.0);
    metrics::counter!(telemetry::names::TABLES_UNREAD).increment(0);
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `--http-addr`, or on the default address
/// when it is free (else says so, and serves none): where it listens.
pub async fn serve_http(
    args: &RunArgs,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
    readiness: &Arc<Readiness>,
    tasks: &mut Tasks,
) -> anyhow::Result<Option<SocketAddr>> {
    if let Some(addr) = args.http_addr {
        let bound = telemetry::serve(addr, prometheus, readiness.clone(), tasks)
            .await
            .with_context(|| format!("listening on --http-addr {addr}"))?;
        return Ok(Some(bound));
    }
    let addr = telemetry::DEFAULT_HTTP_ADDR;
    match telemetry::serve(addr, prometheus, readiness.clone(), tasks).await {
        Ok(bound) => Ok(Some(bound)),
        Err(err) => {
            warn!(%err, "no HTTP endpoints: the default {addr} is taken; set --http-addr");
            Ok(None)
        }
    }
}

/// The database settings, with the HTTP address as `application_name` (unless one is set),
/// so that `pgoutbox status` finds this process's metrics from the slot's walsender.
pub fn advertised(config: &Config, http_addr: Option<SocketAddr>) -> tokio_postgres::Config {
    let mut database = config.database.clone();
    if let Some(addr) = http_addr
        && database.get_application_name().is_none()
    {
        database.application_name(format!("{}{addr}", telemetry::ADVERTISED_PREFIX));
    }
    database
}

/// What the settings ask of the database, checked before streaming: who may emit events,
/// and the columns `--retention` needs.
pub async fn check_database(
    client: &tokio_postgres::Client,
    config: &Config,
    args: &RunArgs,
) -> anyhow::Result<()> {
    if !args.slot.message_prefix.is_empty() {
        crate::commands::setup::warn_if_public_may_emit(client).await;
        let template = &config.pipeline.defaults.template;
        if template.names_table() {
            warn!(%template, prefix = %args.slot.message_prefix,
                "emitted events become dead letters: the subject template names the row's \
                 table ({{$schema}}, {{$table}}), which an event's content may not say; set \
                 --message-prefix '' to stream tables only");
        }
    }
    if args.retention.is_some() {
        // A pattern's tables are looked at on each pass (`retention::servable`).
        for entry in config.pipeline.tables.iter().filter(|e| e.pattern.is_none()) {
            let column = &entry.roles.created_at;
            admin::check_prerequisites(
                client,
                &entry.table,
                &[("created-at column (for --retention)", column)],
            )
            .await?;
        }
    }
    Ok(())
}

/// Connects to NATS, patiently while it is unreachable, and says which server it is: the
/// publisher, and the count of disconnects the pipeline watches. `None`: shut down first.
pub async fn connect_nats(
    config: &Config,
    shutdown: &mut Shutdown,
    readiness: &Readiness,
) -> anyhow::Result<Option<(Publisher, tokio::sync::watch::Receiver<u64>)>> {
    let (disconnects, watched) = tokio::sync::watch::channel(0);
    let disconnects = Arc::new(disconnects);
    let connect = || {
        crate::nats::connect::connect_nats_watched(&config.nats, disconnects.clone(), || {
            Metrics::reconnect(ReconnectTarget::Nats)
        })
    };
    let connected =
        patiently(UNREACHABLE, |_| true, Backoff::new(), shutdown, readiness, connect).await?;
    let Some(nats) = connected else { return Ok(None) };
    readiness.set_nats(nats.clone());
    let publisher = Publisher::new(nats, &config.stream, crate::nats::connect::ACK_TIMEOUT)
        .with_schedules(config.schedules().cloned().collect());
    let nats_version = publisher.server_version();
    if let Some(warning) = crate::nats::server_version::unsupported(&nats_version) {
        warn!("{warning}");
    }
    Metrics::nats_info(&nats_version, false);
    Ok(Some((publisher, watched)))
}

/// The servers' versions and the slot's failover state, on `/metrics`.
pub async fn export_versions(
    client: &tokio_postgres::Client,
    config: &Config,
    publisher: &Publisher,
) -> anyhow::Result<()> {
    Metrics::nats_info(&publisher.server_version(), true);
    let (_, version) = admin::server_version(client).await?;
    let slot = admin::slot_state(client, &config.slot).await?;
    Metrics::postgres_info(
        &version,
        slot.as_ref().and_then(|s| s.failover),
        slot.and_then(|s| s.synced),
    );
    Ok(())
}

/// `--retention`: the rows whose dead letters of earlier runs lack their payload are kept,
/// then the deleting task starts. `false`: shut down while reading those letters.
pub async fn start_retention(
    (config, keep): (&Config, std::time::Duration),
    publisher: &Publisher,
    memory: &mut Memory,
    (shutdown, readiness): (&mut Shutdown, &Readiness),
    tasks: &mut Tasks,
) -> anyhow::Result<bool> {
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
        let backoff = Backoff::capped(JETSTREAM_RETRY_CAP);
        let letters =
            patiently(UNANSWERED, jetstream_unanswered, backoff, shutdown, readiness, read);
        let Some(rows) = letters.await? else { return Ok(false) };
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
        memory.confirmed_up_to.clone(),
        memory.kept_rows.clone(),
        shutdown.clone(),
    ));
    Ok(true)
}

/// Records what JetStream acknowledged in Postgres every second, until `stopped`.
pub fn start_recorder(
    config: &Config,
    publisher: &Publisher,
    memory: &Memory,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(crate::service::acknowledgements::record_every(
        config.database.clone(),
        config.pg_tls.clone(),
        (acknowledged::table_in(&config.own_schema), config.slot.clone()),
        publisher.clone(),
        memory.acknowledged.clone(),
        stopped,
    ))
}

/// One line on what the durability horizon keeps, or, at `0s`, what that gives up.
pub fn announce_durability(horizon: std::time::Duration) {
    if horizon.is_zero() {
        warn!(
            "--durability-horizon 0s: an event JetStream acknowledged is confirmed at once, \
            so a nats-server that loses power (or any crash of an R1 stream without \
            sync_interval: always) loses what it had not synced, up to 2 min of events; table \
            rows then come back only with `pgoutbox run --recover`, emitted events not at all"
        );
    } else {
        let assumed = horizon.saturating_sub(crate::nats::monitor::PASS_ALLOWANCE);
        info!(
            horizon_s = horizon.as_secs_f64(),
            "durability horizon: the slot is confirmed only once the stream still holds, that \
            long after, what JetStream acknowledged; a power loss of nats-server within it is \
            published again from the WAL, if the servers sync to disk at least every {} s \
            (--nats-monitor-url checks it)",
            assumed.as_secs()
        );
    }
}
