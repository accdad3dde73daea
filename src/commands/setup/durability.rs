//! What the stream can lose of what it acknowledged, and what it lost: `setup` (and `run`'s
//! setup) says so before streaming (issues 46, 56).

use tokio_postgres::types::PgLsn;
use tracing::{info, warn};

use crate::domain::horizon::Forgotten;
use crate::nats::publisher::Publisher;
use crate::postgres::acknowledged;
use crate::postgres::admin;
use crate::service::acknowledgements::stream_identity;
use crate::service::telemetry::names;
use crate::settings::config::Config;

/// A warning and `pgoutbox_stream_recreated_total` when the stream is not the one pgoutbox
/// recorded under its name: it was deleted (by an operator, or lost with its server) and
/// made again, and the history the old one held is not in it. Never created again in
/// silence; the table's rows come back with `run --backfill`.
pub(super) async fn say_if_the_stream_was_made_again(
    config: &Config,
    client: &tokio_postgres::Client,
    publisher: &Publisher,
) {
    let Some(now) = stream_identity(publisher, &config.stream).await else { return };
    let table = acknowledged::table_in(&config.own_schema);
    let made_again = acknowledged::made_again(client, &table, &config.slot, &now).await;
    if let Ok(Some(before)) = made_again
        && !before.recorded
    {
        metrics::counter!(names::STREAM_RECREATED).increment(1);
        warn!(stream = %config.stream, "the stream was deleted and created again since pgoutbox \
            last recorded it ({before}): what the old one held is not in it; `pgoutbox run \
            --backfill` (stopped first) refills it from the outbox tables, emitted events \
            cannot come back");
    }
}

/// One line on what the stream can lose of what it acknowledged (`status` says it too): a
/// warning for a stream that loses writes at any crash (memory storage, async persistence),
/// information for one replica without `--durability-horizon`, which loses them only when
/// its host loses power and is what a first try runs (issue 46).
pub(super) async fn say_what_the_stream_can_lose(config: &Config, publisher: &Publisher) {
    use async_nats::jetstream::stream::{PersistenceMode, StorageType};
    let Ok(Some(info)) = publisher.stream_info().await else { return };
    let horizon = config.pipeline.durability_horizon;
    let said = crate::nats::durability::durability(&info.config, horizon);
    let stream = &config.stream;
    if info.config.storage == StorageType::Memory
        || info.config.persist_mode == Some(PersistenceMode::Async)
    {
        warn!(%stream, "the stream can lose acknowledged events: {said}");
    } else if info.config.num_replicas <= 1 && horizon.is_zero() {
        info!(%stream, "{said}");
    }
}

/// Whether `--durability-horizon` keeps what a power loss of each of the stream's servers
/// can take back, by their `/varz` (`--nats-monitor-url`): a warning naming the server, its
/// interval and what to set when it is shorter; where it cannot read one, a warning saying
/// what the horizon assumes (issue 70).
pub async fn say_whether_the_horizon_covers_the_servers(config: &Config) {
    use crate::nats::monitor::{self, Verdict};
    let horizon = config.pipeline.durability_horizon;
    let assumed = format!(
        "--durability-horizon {} s assumes the stream's servers sync to disk at least every {} \
         s (nats-server's default: 120 s)",
        horizon.as_secs_f64(),
        horizon.saturating_sub(monitor::PASS_ALLOWANCE).as_secs_f64()
    );
    // Without the setting, `run` says what the horizon assumes as it starts.
    if config.nats_monitor_urls.is_empty() {
        return;
    }
    for url in &config.nats_monitor_urls {
        match monitor::read(url).await {
            Ok(server) => match server.sync.judge(horizon) {
                Verdict::Covered => {
                    info!(server = %url, version = %server.version, sync_interval = %server.sync,
                        "the durability horizon covers the server's sync interval");
                }
                Verdict::Short { needed } => warn!(server = %url, version = %server.version,
                    sync_interval = %server.sync,
                    "the server syncs to disk every {}: --durability-horizon {} s is shorter than \
                     that and a sync pass, so a power loss of it can take back acknowledged events \
                     the slot no longer holds; set --durability-horizon {}s, or sync_interval at \
                     most {} s on the server (always: each write synced)",
                    server.sync, horizon.as_secs_f64(), needed.as_secs(),
                    horizon.saturating_sub(monitor::PASS_ALLOWANCE).as_secs()),
                Verdict::Unknown => info!(server = %url, version = %server.version,
                    "the server does not report its sync interval; {assumed}"),
            },
            Err(err) => warn!("could not read how the server syncs: {err}; {assumed}"),
        }
    }
}

/// What the stream forgot of what JetStream acknowledged, by the record in Postgres
/// (`postgres::acknowledged`), when the slot confirmed past it: the WAL cannot bring it back.
pub(super) async fn forgotten_past_the_slot(
    config: &Config,
    client: &tokio_postgres::Client,
    publisher: &Publisher,
    slot: &admin::SlotState,
) -> anyhow::Result<Option<Forgotten>> {
    let Some(stream) = stream_identity(publisher, &config.stream).await else { return Ok(None) };
    let table = acknowledged::table_in(&config.own_schema);
    let Some(stored) = acknowledged::recorded(client, &table, &config.slot, &stream).await? else {
        return Ok(None);
    };
    let confirmed = slot.confirmed_flush_lsn.as_deref().and_then(|l| l.parse::<PgLsn>().ok());
    let tail = publisher.tail(None).await?;
    let judged = Forgotten::judge(
        stored,
        tail.last_sequence,
        tail.origin.position,
        confirmed.map_or(0, u64::from),
    );
    Ok(judged.filter(|forgotten| !forgotten.refilled()))
}
