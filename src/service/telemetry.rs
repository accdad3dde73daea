//! The ops surface over HTTP: `/metrics` (Prometheus text), `/healthz` (alive) and
//! `/readyz` (streaming from Postgres and connected to NATS, else 503 with the reason).
//!
//! Metrics go through the `metrics` facade; [`Metrics`] keeps the handles so the pipeline
//! updates them with an atomic add, without a registry lookup per row.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::service::error::NatsFailureKind;

/// Where `/metrics`, `/healthz` and `/readyz` are served unless `--http-addr` says otherwise.
/// A `SocketAddr`, so it prints as `127.0.0.1:9717`.
pub const DEFAULT_HTTP_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9717);

/// The replication connection's `application_name` names where its process serves HTTP,
/// e.g. `pgoutbox@127.0.0.1:9717`: `status` finds the slot holder's `/metrics` through
/// `pg_stat_replication`, and a DBA sees where to look.
pub const ADVERTISED_PREFIX: &str = "pgoutbox@";

/// The HTTP address a slot holder advertised in its `application_name`, made reachable
/// (see [`reachable`]) from the address it connected to Postgres from.
pub fn advertised_http_addr(
    application_name: &str,
    client_addr: Option<&str>,
) -> Option<SocketAddr> {
    let addr: SocketAddr = application_name.strip_prefix(ADVERTISED_PREFIX)?.parse().ok()?;
    let host = client_addr.and_then(|c| c.split('/').next()?.parse().ok());
    Some(reachable(addr, host))
}

/// Where to reach a listen address: one that listens on every interface is reached on
/// `host` (its machine), or on loopback when that is unknown.
pub fn reachable(addr: SocketAddr, host: Option<std::net::IpAddr>) -> SocketAddr {
    match addr.ip().is_unspecified() {
        true => {
            SocketAddr::new(host.unwrap_or(std::net::IpAddr::from([127, 0, 0, 1])), addr.port())
        }
        false => addr,
    }
}

/// Buckets of the commit-to-ack histogram, in seconds.
const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

mod describe;
pub mod names;
mod readiness;

pub use readiness::{Readiness, watch_stalls};

/// What `pgoutbox_reconnects_total{target}` counts reconnections to.
#[derive(Debug, Clone, Copy)]
pub enum ReconnectTarget {
    Postgres,
    Nats,
}

impl ReconnectTarget {
    fn as_str(self) -> &'static str {
        match self {
            ReconnectTarget::Postgres => "postgres",
            ReconnectTarget::Nats => "nats",
        }
    }
}

/// The `table` label's name on the per-row counters.
pub const TABLE_LABEL: &str = "table";

/// The per-row counters of one table: each series labelled `table="<label>"`, the label
/// being the table's entry ([`TableEntry::metrics_label`]) or `(emitted)`. Lag, in flight and
/// the confirmed LSN stay unlabelled: one slot serves every table.
///
/// [`TableEntry::metrics_label`]: crate::domain::outbox::TableEntry::metrics_label
pub struct TableCounters {
    pub rows_published: Counter,
    pub bytes_published: Counter,
    pub dead_letters: Counter,
    pub duplicates: Counter,
}

impl TableCounters {
    fn of(label: &str) -> TableCounters {
        let series = |name: &'static str| counter!(name, TABLE_LABEL => label.to_owned());
        TableCounters {
            rows_published: series(names::ROWS_PUBLISHED),
            bytes_published: series(names::BYTES_PUBLISHED),
            dead_letters: series(names::DEAD_LETTERS),
            duplicates: series(names::DUPLICATES),
        }
    }
}

/// Each table's counters, by label, looked up once per message: the last one found is
/// kept, since rows come in runs of one table.
#[derive(Default)]
pub struct CountersByTable {
    by_label: std::collections::HashMap<String, Arc<TableCounters>>,
    last: Option<(String, Arc<TableCounters>)>,
}

impl CountersByTable {
    /// The counters of `label`, made (at 0) the first time it is asked for.
    pub fn of(&mut self, label: &str) -> Arc<TableCounters> {
        if let Some((last, counters)) = &self.last
            && last == label
        {
            return Arc::clone(counters);
        }
        let counters = Arc::clone(
            self.by_label
                .entry(label.to_owned())
                .or_insert_with(|| Arc::new(TableCounters::of(label))),
        );
        self.last = Some((label.to_owned(), Arc::clone(&counters)));
        counters
    }
}

/// The pipeline's instruments.
#[derive(Clone)]
pub struct Metrics {
    pub transactions: Counter,
    pub non_transactional_messages: Counter,
    pub messages_in_flight: Gauge,
    pub confirmed_lsn: Gauge,
    pub replication_lag_bytes: Gauge,
    pub durability_held_bytes: Gauge,
    pub durability_held_seconds: Gauge,
    pub durability_next_release_seconds: Gauge,
    pub durability_needed_bytes: Gauge,
    pub seed_rows_done: Gauge,
    pub seed_rows_left: Gauge,
    pub seed_rows_per_second: Gauge,
    pub replay_rows: Gauge,
    pub replay_rows_done: Gauge,
    pub replay_rows_left: Gauge,
    pub replay_rows_per_second: Gauge,
    pub replayed_rows_unreadable: Counter,
    pub commit_to_ack: Histogram,
    pub commit_to_receive: Histogram,
    pub receive_to_ack: Histogram,
    pub ack_to_confirm: Histogram,
}

impl Metrics {
    pub fn new() -> Self {
        Metrics {
            transactions: counter!(names::TRANSACTIONS),
            non_transactional_messages: counter!(names::NON_TRANSACTIONAL_MESSAGES),
            messages_in_flight: gauge!(names::MESSAGES_IN_FLIGHT),
            confirmed_lsn: gauge!(names::CONFIRMED_LSN),
            replication_lag_bytes: gauge!(names::REPLICATION_LAG_BYTES),
            durability_held_bytes: gauge!(names::DURABILITY_HELD_BYTES),
            durability_held_seconds: gauge!(names::DURABILITY_HELD_SECONDS),
            durability_next_release_seconds: gauge!(names::DURABILITY_NEXT_RELEASE_SECONDS),
            durability_needed_bytes: gauge!(names::DURABILITY_NEEDED_BYTES),
            seed_rows_done: gauge!(names::SEED_ROWS_DONE),
            seed_rows_left: gauge!(names::SEED_ROWS_LEFT),
            seed_rows_per_second: gauge!(names::SEED_ROWS_PER_SECOND),
            replay_rows: gauge!(names::REPLAY_ROWS),
            replay_rows_done: gauge!(names::REPLAY_ROWS_DONE),
            replay_rows_left: gauge!(names::REPLAY_ROWS_LEFT),
            replay_rows_per_second: gauge!(names::REPLAY_ROWS_PER_SECOND),
            replayed_rows_unreadable: counter!(names::REPLAYED_ROWS_UNREADABLE),
            commit_to_ack: histogram!(names::COMMIT_TO_ACK),
            commit_to_receive: histogram!(names::COMMIT_TO_RECEIVE),
            receive_to_ack: histogram!(names::RECEIVE_TO_ACK),
            ack_to_confirm: histogram!(names::ACK_TO_CONFIRM),
        }
    }

    /// Puts the per-row counters of each of `labels` (every table's, and `(emitted)` when
    /// emitted messages are streamed) at 0, so that each table's series are there from the
    /// start, for `rate()` and `increase()`.
    pub fn tables<'a>(labels: impl IntoIterator<Item = &'a str>) {
        for label in labels {
            let counters = TableCounters::of(label);
            for counter in [
                counters.rows_published,
                counters.bytes_published,
                counters.dead_letters,
                counters.duplicates,
            ] {
                counter.increment(0);
            }
        }
    }

    /// A seed began with this many rows to read; 0 when it ended.
    pub fn seed_rows(total: u64) {
        gauge!(names::SEED_ROWS).set(total as f64);
        gauge!(names::SEED_ROWS_DONE).set(0.0);
        gauge!(names::SEED_ROWS_LEFT).set(total as f64);
    }

    /// A publish that was not acknowledged, by kind (timeout, refused, ...).
    pub fn publish_error(kind: &str) {
        counter!(names::PUBLISH_ERRORS, "kind" => kind.to_owned()).increment(1);
    }

    /// What pgoutbox streams from, read at setup.
    pub fn postgres_info(version: &str, failover: Option<bool>, synced: Option<bool>) {
        let word = |v: Option<bool>| v.map_or("unknown", |b| if b { "true" } else { "false" });
        let labels = [
            ("version", version.to_owned()),
            ("failover", word(failover).to_owned()),
            ("synced", word(synced).to_owned()),
        ];
        gauge!(names::POSTGRES_INFO, &labels).set(1.0);
    }

    /// The nats-server pgoutbox is connected to, and whether JetStream answered it. The
    /// previous labels are dropped, so that one series says where things stand.
    pub fn nats_info(version: &str, jetstream_answered: bool) {
        static LAST: std::sync::Mutex<Option<(String, bool)>> = std::sync::Mutex::new(None);
        let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
        let now = (version.to_owned(), jetstream_answered);
        if last.as_ref() == Some(&now) {
            return;
        }
        if let Some((version, answered)) = last.take() {
            let labels = [("version", version), ("jetstream", answered.to_string())];
            gauge!(names::NATS_INFO, &labels).set(0.0);
        }
        let labels = [("version", now.0.clone()), ("jetstream", now.1.to_string())];
        gauge!(names::NATS_INFO, &labels).set(1.0);
        *last = Some(now);
    }

    /// A reconnection after a failure of `target`.
    pub fn reconnect(target: ReconnectTarget) {
        counter!(names::RECONNECTS, "target" => target.as_str()).increment(1);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// How often the latency samples are folded into their histograms when nobody scrapes
/// `/metrics`: the recorder keeps each sample until then (about 64 bytes a transaction:
/// the steady-state soak saw pgoutbox's memory grow from 27 to 116 MB in 25 minutes at
/// 1,000 rows/s, with no scraper).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Folds the latency samples into their histograms every [`UPKEEP_EVERY`], so that memory
/// stays flat whether or not anything scrapes `/metrics`.
pub fn keep_histograms_folded(prometheus: PrometheusHandle, tasks: &mut JoinSet<()>) {
    tasks.spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        loop {
            every.tick().await;
            prometheus.run_upkeep();
        }
    });
}

/// Installs the Prometheus recorder and describes every metric; call once, before any
/// metric is touched.
pub fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    let mut builder = PrometheusBuilder::new();
    for name in [
        names::COMMIT_TO_ACK,
        names::COMMIT_TO_RECEIVE,
        names::RECEIVE_TO_ACK,
        names::ACK_TO_CONFIRM,
    ] {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.into()), LATENCY_BUCKETS)?;
    }
    let handle = builder.install_recorder()?;
    describe::describe();
    Ok(handle)
}

#[derive(Clone)]
struct AppState {
    prometheus: PrometheusHandle,
    readiness: Arc<Readiness>,
    /// The standard `process_*` metrics, read at each scrape.
    process: Arc<metrics_process::Collector>,
}

/// Binds `addr` (failing now if it cannot) and serves until the process ends; returns the
/// address bound.
pub async fn serve(
    addr: SocketAddr,
    prometheus: PrometheusHandle,
    readiness: Arc<Readiness>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(AppState { prometheus, readiness, process: Arc::new(process_collector()) });
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    tasks.spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(error = %err, "HTTP server stopped");
        }
    });
    Ok(addr)
}

fn process_collector() -> metrics_process::Collector {
    let collector = metrics_process::Collector::default();
    collector.describe();
    collector.collect();
    collector
}

async fn metrics_text(State(state): State<AppState>) -> String {
    state.process.collect();
    state.prometheus.run_upkeep();
    state.prometheus.render()
}

async fn ready(State(state): State<AppState>) -> (StatusCode, String) {
    match state.readiness.not_ready_because() {
        None => (StatusCode::OK, "ready\n".into()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::advertised_http_addr;

    #[test]
    fn the_advertised_address_is_read_back_from_application_name() {
        let addr = |name, client| advertised_http_addr(name, client).map(|a| a.to_string());
        assert_eq!(addr("pgoutbox@127.0.0.1:9717", None).as_deref(), Some("127.0.0.1:9717"));
        assert_eq!(addr("pgoutbox@[::1]:80", None).as_deref(), Some("[::1]:80"));
        assert_eq!(
            addr("pgoutbox@0.0.0.0:9717", Some("10.1.2.3/32")).as_deref(),
            Some("10.1.2.3:9717")
        );
        assert_eq!(addr("pgoutbox@0.0.0.0:9717", None).as_deref(), Some("127.0.0.1:9717"));
        assert_eq!(addr("pgoutbox", None), None);
        assert_eq!(addr("psql", Some("10.1.2.3")), None);
    }
}
