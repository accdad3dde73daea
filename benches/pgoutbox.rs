//! pgoutbox next to the physical limits and next to a polling relay, in one run on one
//! machine. Run with `cargo bench --bench pgoutbox` (about 17 minutes on 2 cores) or
//! `cargo bench --bench pgoutbox -- --quick` (about 3 minutes, smaller and one run).
//! `--small-transactions`, `--large-payloads`, `--durability` and `--schedules` run one part
//! alone (docs/performance.md).
//!
//! Every figure is the median of the runs, with min and max. Throwaway PostgreSQL and
//! nats-server processes are started exactly as the integration tests start them.

// The benchmark prints its figures: println! is fine here (clippy.toml forbids it in src/).
#![allow(clippy::disallowed_macros)]

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports, dead_code)]
mod support;

mod durability;
mod floor;
mod large_payloads;
mod schedules;
mod small_transactions;

use std::collections::VecDeque;
use std::future::IntoFuture;
use std::process::Command;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::pull::OrderedConfig, stream};
use futures_util::StreamExt;
use support::cluster::NatsCluster;
use support::pgoutbox::{Pgoutbox, command};
use support::{Nats, Postgres};

/// The single-row steps: rate, and whether a CPU hog contends the cores.
/// Rate, cores contended, and the durability horizon (`None`: the default, 150 s): the
/// last step is the default's cost, beside the same rate without a horizon.
const SMALL_STEPS: [(u64, bool, Option<&str>); 4] =
    [(1_000, false, None), (3_000, false, None), (3_000, true, None), (3_000, false, Some("0s"))];
const SMALL_LABELS: [&str; 4] =
    ["@1,000/s", "@3,000/s", "@3,000/s, contended", "@3,000/s, --durability-horizon 0s"];

/// Payloads of about 250 bytes, 100 rows a transaction, as the issue specifies.
const PAD: usize = 220;
const ROWS_PER_TX: usize = 100;
const IN_FLIGHT: usize = 4096;

type AckFuture = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
            > + Send,
    >,
>;

struct Settings {
    rows: usize,
    runs: usize,
    latency_seconds: u64,
    /// How long rows are written at 1,000/s while the R3 stream's leader is killed.
    election_seconds: u64,
    /// `--small-transactions`: only the single-row steps (issue 31's tail and CPU figures).
    only_small: bool,
}

#[derive(Default)]
struct Figures {
    decode: Vec<f64>,
    publish: Vec<f64>,
    both: Vec<f64>,
    drain: Vec<f64>,
    drain_cpu_us_per_row: Vec<f64>,
    drain_wal_per_row: Vec<f64>,
    /// The same drain with OpenTelemetry traces sampled at 1 % and at 100 %, exported to a
    /// receiver in this process: rows/s and CPU µs per row of pgoutbox.
    traced_drain: [Vec<f64>; 2],
    traced_cpu_us_per_row: [Vec<f64>; 2],
    /// `pgoutbox replay` of the whole table into a stream of its own, rows/s.
    replay: Vec<f64>,
    /// The same, handed to the pgoutbox streaming into that stream through the WAL.
    replay_live: Vec<f64>,
    /// `pgoutbox run --backfill` of the whole table into a new stream, rows/s.
    seed: Vec<f64>,
    /// Rows whose ids the stream holds (a `bigserial` outbox truncated with its sequence
    /// restarted), each becoming its dead letter in place, rows/s.
    collisions: Vec<f64>,
    rss_mb: Vec<f64>,
    lat_1k: Vec<[f64; 4]>,
    lat_5k: Vec<[f64; 4]>,
    /// The floor at 5,000/s: pg_recvlogical's arrival, and one NATS hop further (p50, p99, p99.9).
    floor_5k: Vec<[f64; 3]>,
    floor_5k_nats: Vec<[f64; 3]>,
    /// pgoutbox at 5,000/s, mean ms per stage: commit → received, received → acked,
    /// acked → confirmed.
    stages_5k: Vec<[f64; 3]>,
    lat_10k: Vec<[f64; 4]>,
    /// Single-row transactions beside their floor: at 1,000/s, 3,000/s, and 3,000/s with
    /// the cores contended.
    small: [Vec<small_transactions::Step>; 4],
    relay_drain: Vec<f64>,
    relay_wal_per_row: Vec<f64>,
    insert_wal_per_row: Vec<f64>,
    relay_lat_100ms: Vec<[f64; 4]>,
    relay_lat_1s: Vec<[f64; 4]>,
    r3_publish: Vec<f64>,
    r3_drain: Vec<f64>,
    election_ms: Vec<f64>,
    election_gap_ms: Vec<f64>,
    election_max_latency_ms: Vec<f64>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(floor::RELAY_FLAG) {
        return floor::relay_main(&args[2..]);
    }
    if !args.iter().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs bench targets too; the benchmark is for `cargo bench`.
        println!("benchmark skipped: run it with `cargo bench --bench pgoutbox [-- --quick]`");
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let only_small = args.iter().any(|a| a == "--small-transactions");
    let settings = if quick {
        Settings { rows: 20_000, runs: 1, latency_seconds: 3, election_seconds: 8, only_small }
    } else {
        Settings { rows: 200_000, runs: 3, latency_seconds: 10, election_seconds: 12, only_small }
    };
    let nats_server = support::nats::server_binary();
    let version = Command::new(&nats_server).arg("--version").output().expect("nats-server");
    let version = String::from_utf8_lossy(&version.stdout);
    eprintln!("nats-server under test: {} ({})", version.trim(), nats_server.display());
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    if args.iter().any(|a| a == "--large-payloads") {
        let mut figures = large_payloads::Figures::default();
        for run in 0..settings.runs {
            eprintln!("run {} of {}", run + 1, settings.runs);
            runtime.block_on(large_payloads::run(&mut figures));
        }
        return large_payloads::print(&figures);
    }
    if args.iter().any(|a| a == "--schedules") {
        let mut figures = schedules::Figures::default();
        for run in 0..settings.runs {
            eprintln!("run {} of {}", run + 1, settings.runs);
            runtime.block_on(schedules::run(&mut figures));
        }
        return schedules::print(&figures);
    }
    if args.iter().any(|a| a == "--durability") {
        let mut figures = durability::Figures::default();
        for run in 0..settings.runs.min(2) {
            eprintln!("run {} of {}", run + 1, settings.runs.min(2));
            runtime.block_on(durability::run(&mut figures));
        }
        return durability::print(&figures);
    }
    let mut figures = Figures::default();
    for run in 0..settings.runs {
        eprintln!("run {} of {}", run + 1, settings.runs);
        runtime.block_on(one_run(&settings, &mut figures));
    }
    print_report(&settings, &figures);
}

async fn one_run(s: &Settings, f: &mut Figures) {
    let pg = Postgres::start();
    let nats = Nats::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.expect("NATS"));
    pg.psql(include_str!("../sql/outbox.sql"));
    let setup = command(&pg, &nats).arg("setup").output().expect("pgoutbox setup");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));
    if s.only_small {
        return small_steps(&pg, &nats, &js, s, f).await;
    }
    for slot in ["limit_a", "limit_c"] {
        pg.psql(&format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"));
    }

    // The traced drains' slots, made before the rows so that they decode them too.
    for (stream, _) in TRACED {
        let traced = command(&pg, &nats).args(own_slot_and_stream(stream)).arg("setup").output();
        let traced = traced.expect("pgoutbox setup");
        assert!(traced.status.success(), "{}", String::from_utf8_lossy(&traced.stderr));
    }

    eprintln!("  inserting {} rows", s.rows);
    let before_insert = wal_lsn(&pg);
    insert_rows(&pg, "outbox", s.rows);
    let end_lsn = wal_lsn(&pg);
    f.insert_wal_per_row.push(wal_bytes(&pg, &before_insert, &end_lsn) / s.rows as f64);

    eprintln!("  limits");
    let t = decode_with_pg_recvlogical(&pg, "limit_a", &end_lsn);
    f.decode.push(s.rows as f64 / t);
    let t = raw_publish(&js, "LIMIT_B", 1, s.rows).await;
    f.publish.push(s.rows as f64 / t);
    let pg_ref = &pg;
    let end = end_lsn.clone();
    let started = Instant::now();
    let decode = tokio::task::spawn_blocking({
        let (bin, port) = (pg_bin(), pg_ref.port());
        move || recvlogical(&bin, port, "limit_c", &end)
    });
    raw_publish(&js, "LIMIT_C", 1, s.rows).await;
    decode.await.expect("decode task");
    f.both.push(s.rows as f64 / started.elapsed().as_secs_f64());
    for slot in ["limit_a", "limit_c"] {
        pg.psql(&format!("SELECT pg_drop_replication_slot('{slot}')"));
    }
    for name in ["LIMIT_B", "LIMIT_C"] {
        let _ = js.delete_stream(name).await;
    }

    eprintln!("  pgoutbox drain");
    let wal_before_drain = wal_lsn(&pg);
    let started = Instant::now();
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_for_count(&js, "OUTBOX", s.rows as u64, Duration::from_secs(600)).await;
    let took = started.elapsed().as_secs_f64();
    f.drain.push(s.rows as f64 / took);
    f.drain_cpu_us_per_row.push(cpu_seconds(app.pid()) * 1e6 / s.rows as f64);
    let wal_after_drain = wal_lsn(&pg);
    f.drain_wal_per_row
        .push(wal_bytes(&pg, &wal_before_drain, &wal_after_drain).max(0.0) / s.rows as f64);

    traced_drains(&pg, &nats, &js, s, f).await;

    eprintln!("  pgoutbox latency");
    let offset = s.rows as u64;
    f.lat_1k.push(latency(&pg, &js, "OUTBOX", offset, 1_000, s.latency_seconds).await);
    f.rss_mb.push(support::peak_rss_bytes(app.pid()) as f64 / 1e6);
    drop(app);

    eprintln!("  pgoutbox replay");
    let started = Instant::now();
    let replay = command(&pg, &nats)
        .args(["--stream", "REPLAYED", "--subject-template", "replayed.{aggregate_type}.x"])
        .args(["--dead-letter-subject", "replayed.dead_letter"])
        .args(["replay", "--created-from", "-infinity"])
        .output()
        .expect("pgoutbox replay");
    assert!(replay.status.success(), "{}", String::from_utf8_lossy(&replay.stderr));
    let replayed = stream_count(&js, "REPLAYED").await;
    f.replay.push(replayed as f64 / started.elapsed().as_secs_f64());
    let _ = js.delete_stream("REPLAYED").await;

    eprintln!("  pgoutbox replay through a live pgoutbox, and run --backfill");
    let table_rows: u64 = pg.psql("SELECT count(*) FROM outbox").parse().expect("a count");
    let live = own_slot_and_stream("REPLAY_LIVE");
    let mut run = command(&pg, &nats);
    run.args(&live).arg("run");
    let app = Pgoutbox::spawn(run);
    wait_slot_active(&pg, "replay_live", true).await;
    let started = Instant::now();
    let replay = command(&pg, &nats)
        .args(&live)
        .args(["replay", "--created-from", "-infinity"])
        .output()
        .expect("pgoutbox replay");
    assert!(replay.status.success(), "{}", String::from_utf8_lossy(&replay.stderr));
    let replayed = stream_count(&js, "REPLAY_LIVE").await;
    assert_eq!(replayed, table_rows, "{}", String::from_utf8_lossy(&replay.stderr));
    f.replay_live.push(replayed as f64 / started.elapsed().as_secs_f64());
    drop(app);
    let backfill = own_slot_and_stream("BACKFILL");
    let started = Instant::now();
    let mut run = command(&pg, &nats);
    run.args(&backfill).args(["run", "--backfill"]);
    let app = Pgoutbox::spawn(run);
    wait_for_count(&js, "BACKFILL", table_rows, Duration::from_secs(600)).await;
    f.seed.push(table_rows as f64 / started.elapsed().as_secs_f64());
    // The seed's slot becomes `backfill` once the seed is acknowledged.
    wait_slot_active(&pg, "backfill", true).await;
    drop(app);
    for (slot, stream) in [("replay_live", "REPLAY_LIVE"), ("backfill", "BACKFILL")] {
        wait_slot_active(&pg, slot, false).await;
        pg.psql(&format!("SELECT pg_drop_replication_slot('{slot}')"));
        let _ = js.delete_stream(stream).await;
    }

    eprintln!("  colliding rows after TRUNCATE ... RESTART IDENTITY");
    f.collisions.push(collisions(&pg, &nats, &js, s.rows / 2).await);

    eprintln!("  latency floor at 5,000/s");
    let floor = floor::measure(&pg, &nats.url(), &js, 5_000, s.latency_seconds).await;
    f.floor_5k.push(floor.arrival);
    f.floor_5k_nats.push(floor.stored);
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_caught_up(&pg).await;
    eprintln!("  pgoutbox latency at 5,000/s and 10,000/s");
    let before = stage_sums(app.http_port());
    let offset = stream_count(&js, "OUTBOX").await;
    f.lat_5k.push(latency(&pg, &js, "OUTBOX", offset, 5_000, s.latency_seconds).await);
    f.stages_5k.push(stage_means(before, stage_sums(app.http_port())));
    let offset = stream_count(&js, "OUTBOX").await;
    f.lat_10k.push(latency(&pg, &js, "OUTBOX", offset, 10_000, s.latency_seconds).await);
    drop(app);
    small_steps(&pg, &nats, &js, s, f).await;

    eprintln!("  polling relay");
    pg.psql(
        "CREATE TABLE outbox_polling (LIKE outbox INCLUDING DEFAULTS, sent boolean NOT NULL \
         DEFAULT false, sent_at timestamptz); \
         CREATE INDEX outbox_polling_unsent ON outbox_polling (created_at) WHERE NOT sent",
    );
    create_stream(&js, "RELAY", "relay.>", 1).await;
    insert_rows(&pg, "outbox_polling", s.rows);
    let before = wal_lsn(&pg);
    let relay = Relay::start(&pg, &nats, Duration::from_millis(100)).await;
    let started = Instant::now();
    wait_for_count(&js, "RELAY", s.rows as u64, Duration::from_secs(600)).await;
    f.relay_drain.push(s.rows as f64 / started.elapsed().as_secs_f64());
    relay.wait_idle(&pg).await;
    f.relay_wal_per_row.push(wal_bytes(&pg, &before, &wal_lsn(&pg)) / s.rows as f64);
    let offset = stream_count(&js, "RELAY").await;
    let table = "outbox_polling";
    f.relay_lat_100ms
        .push(latency_on(&pg, &js, "RELAY", table, offset, 1_000, s.latency_seconds).await);
    relay.stop().await;
    let relay = Relay::start(&pg, &nats, Duration::from_secs(1)).await;
    let offset = stream_count(&js, "RELAY").await;
    f.relay_lat_1s
        .push(latency_on(&pg, &js, "RELAY", table, offset, 1_000, s.latency_seconds).await);
    relay.stop().await;

    r3_cluster(&pg, s, f).await;
}

async fn small_steps(
    pg: &Postgres,
    nats: &Nats,
    js: &jetstream::Context,
    s: &Settings,
    f: &mut Figures,
) {
    for (i, (rate, contended, horizon)) in SMALL_STEPS.into_iter().enumerate() {
        let how = if contended { ", cores contended" } else { "" };
        eprintln!("  single-row transactions at {rate}/s{how}: floor, then pgoutbox");
        let load =
            small_transactions::Load { rate, seconds: s.latency_seconds, contended, horizon };
        let step = small_transactions::step(pg, nats, js, load);
        f.small[i].push(step.await);
    }
}

/// The drain into an R3 stream on a three-server cluster, then the longest pause in stored
/// messages while rows arrive at 1,000/s and the stream's leader is killed (kill -9).
async fn r3_cluster(pg: &Postgres, s: &Settings, f: &mut Figures) {
    eprintln!("  R3 stream on a three-server cluster: drain");
    let mut cluster = NatsCluster::start();
    let js = support::stream::jetstream(&cluster.urls()).await;
    let t = raw_publish(&js, "LIMIT_R3", 3, s.rows).await;
    f.r3_publish.push(s.rows as f64 / t);
    let _ = js.delete_stream("LIMIT_R3").await;
    let urls = cluster.urls();
    let on_cluster = |cmd: &mut Command| {
        cmd.env("PGOUTBOX_NATS_URL", &urls)
            .env("PGOUTBOX_STREAM_REPLICAS", "3")
            .env("PGOUTBOX_SLOT", "pgoutbox_r3");
    };
    let mut setup = command(pg, cluster.node(0));
    on_cluster(&mut setup);
    let setup = setup.arg("setup").output().expect("pgoutbox setup");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));
    insert_rows(pg, "outbox", s.rows);
    let mut run = command(pg, cluster.node(0));
    on_cluster(&mut run);
    run.arg("run");
    let started = Instant::now();
    let app = Pgoutbox::spawn(run);
    wait_for_count(&js, "OUTBOX", s.rows as u64, Duration::from_secs(600)).await;
    f.r3_drain.push(s.rows as f64 / started.elapsed().as_secs_f64());

    eprintln!("  R3 stream on a three-server cluster: leader election");
    let leader = cluster.wait_until_stream_healthy("OUTBOX", Duration::from_secs(60));
    let skip = stream_count(&js, "OUTBOX").await;
    let writer = tokio::spawn({
        let pg_url = pg.url();
        let seconds = s.election_seconds;
        async move { steady_writer_at(&pg_url, "outbox", 1_000, seconds).await }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.node(leader).kill();
    let killed = Instant::now();
    while cluster.stream_leader("OUTBOX").is_none() {
        assert!(killed.elapsed() < Duration::from_secs(60), "no new leader in 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f.election_ms.push(killed.elapsed().as_secs_f64() * 1e3);
    let (inserted, _) = writer.await.expect("writer");
    cluster.node(leader).start_again();
    wait_for_count(&js, "OUTBOX", skip + inserted, Duration::from_secs(120)).await;
    let times = stored_and_committed(&js, "OUTBOX", skip, inserted).await;
    let gap = times.windows(2).map(|w| w[1].0 - w[0].0).fold(0.0, f64::max);
    let worst = times.iter().map(|(stored, committed)| stored - committed).fold(0.0, f64::max);
    f.election_gap_ms.push(gap * 1e3);
    f.election_max_latency_ms.push(worst * 1e3);
    drop(app);
}

// ---------------------------------------------------------------------------------------
// Postgres helpers

fn pg_bin() -> std::path::PathBuf {
    let out = Command::new("pg_config").arg("--bindir").output().expect("pg_config");
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn wal_lsn(pg: &Postgres) -> String {
    pg.psql("SELECT pg_current_wal_lsn()")
}

fn wal_bytes(pg: &Postgres, from: &str, to: &str) -> f64 {
    pg.psql(&format!("SELECT pg_wal_lsn_diff('{to}', '{from}')")).parse().unwrap_or(0.0)
}

fn insert_rows(pg: &Postgres, table: &str, rows: usize) {
    let mut sql = String::new();
    for start in (0..rows).step_by(ROWS_PER_TX) {
        let end = (start + ROWS_PER_TX).min(rows) - 1;
        sql.push_str(&format!(
            "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', n::text, 'created', \
                    jsonb_build_object('n', n, 't', 0, 'pad', repeat('x', {PAD})) \
             FROM generate_series({start}, {end}) n;\n"
        ));
    }
    pg.psql(&sql);
}

/// Seconds for pg_recvlogical to drain the slot up to `end` through pgoutput.
fn decode_with_pg_recvlogical(pg: &Postgres, slot: &str, end: &str) -> f64 {
    recvlogical(&pg_bin(), pg.port(), slot, end)
}

fn recvlogical(bin: &std::path::Path, port: u16, slot: &str, end: &str) -> f64 {
    let started = Instant::now();
    let status = Command::new(bin.join("pg_recvlogical"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", "-d", "postgres"])
        .args(["--slot", slot, "--start", "--endpos", end, "-f", "/dev/null", "--no-loop"])
        .args(["-o", "proto_version=1", "-o", "publication_names=pgoutbox"])
        .status()
        .expect("pg_recvlogical");
    assert!(status.success(), "pg_recvlogical failed");
    started.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------------------------------
// NATS helpers

/// Retried while a cluster's meta leader does not count its peers as online yet: nats-server
/// 2.15 refuses an R3 stream then ("no suitable peers for placement, peer offline"), for a
/// moment after the meta leader is elected.
async fn create_stream(js: &jetstream::Context, name: &str, subject: &str, replicas: usize) {
    use async_nats::jetstream::{ErrorCode, context::CreateStreamErrorKind};
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let config = stream::Config {
            name: name.into(),
            subjects: vec![subject.into()],
            num_replicas: replicas,
            ..Default::default()
        };
        let err = match js.create_stream(config).await {
            Ok(_) => return,
            Err(err) => err,
        };
        let no_peers = matches!(err.kind(), CreateStreamErrorKind::JetStream(e)
            if e.error_code() == ErrorCode::CLUSTER_NO_PEERS);
        assert!(no_peers && Instant::now() < deadline, "create stream {name}: {err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn stream_count(js: &jetstream::Context, name: &str) -> u64 {
    match js.get_stream(name).await {
        Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    }
}

async fn wait_for_count(js: &jetstream::Context, name: &str, want: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while stream_count(js, name).await < want {
        assert!(Instant::now() < deadline, "{name} never reached {want} messages");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A message shaped like pgoutbox's: same size, same headers.
fn sample_message(n: usize) -> (HeaderMap, bytes::Bytes) {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", format!("6f1c1a52-0000-4000-8000-{n:012}").as_str());
    headers.insert("Outbox-Aggregate-Type", "order");
    headers.insert("Outbox-Aggregate-Id", n.to_string().as_str());
    headers.insert("Outbox-Event-Type", "created");
    headers.insert("Outbox-Created-At", "2026-11-22 10:00:00.000000+00");
    headers.insert("Pgoutbox-Position", format!("0/1A2B3C4D:{n}").as_str());
    let body = format!("{{\"n\": {n}, \"t\": 0, \"pad\": \"{}\"}}", "x".repeat(PAD));
    (headers, bytes::Bytes::from(body))
}

/// Seconds to publish `rows` messages with IN_FLIGHT acks outstanding, as pgoutbox does.
async fn raw_publish(
    js: &jetstream::Context,
    stream_name: &str,
    replicas: usize,
    rows: usize,
) -> f64 {
    let subjects = format!("{}.>", stream_name.to_lowercase());
    create_stream(js, stream_name, &subjects, replicas).await;
    let subject = format!("{}.order.created", stream_name.to_lowercase());
    let mut acks: VecDeque<AckFuture> = VecDeque::with_capacity(IN_FLIGHT);
    let started = Instant::now();
    for n in 0..rows {
        if acks.len() == IN_FLIGHT {
            acks.pop_front().expect("ack").await.expect("ack");
        }
        let (headers, body) = sample_message(n);
        let ack = js.publish_with_headers(subject.clone(), headers, body).await.expect("publish");
        acks.push_back(ack.into_future());
    }
    for ack in acks {
        ack.await.expect("ack");
    }
    started.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------------------------------
// Latency: single-row transactions at a steady rate; each payload carries the commit-time
// clock (clock_timestamp() in a one-statement transaction), compared with the time
// JetStream stored the message.

async fn latency(
    pg: &Postgres,
    js: &jetstream::Context,
    stream_name: &str,
    skip: u64,
    rate: u64,
    seconds: u64,
) -> [f64; 4] {
    latency_on(pg, js, stream_name, "outbox", skip, rate, seconds).await
}

/// Returns p50, p99, p99.9 in milliseconds and the achieved insert rate.
async fn latency_on(
    pg: &Postgres,
    js: &jetstream::Context,
    stream_name: &str,
    table: &str,
    skip: u64,
    rate: u64,
    seconds: u64,
) -> [f64; 4] {
    let (inserted, elapsed) = steady_writer_at(&pg.url(), table, rate, seconds).await;
    let want = skip + inserted;
    wait_for_count(js, stream_name, want, Duration::from_secs(120)).await;
    let times = stored_and_committed(js, stream_name, skip, inserted).await;
    let mut latencies: Vec<f64> =
        times.iter().map(|(stored, committed)| ((stored - committed) * 1e3).max(0.0)).collect();
    let [p50, p99, p999] = percentiles(&mut latencies);
    [p50, p99, p999, inserted as f64 / elapsed]
}

/// p50, p99 and p99.9 of `values`.
fn percentiles(values: &mut [f64]) -> [f64; 3] {
    values.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| values[((values.len() as f64 - 1.0) * q).round() as usize];
    [at(0.5), at(0.99), at(0.999)]
}

/// The arguments of a pgoutbox with its own slot and stream, both named after `stream`.
/// The traced drains: their stream (and slot), and the ratio of traces sampled.
const TRACED: [(&str, &str); 2] = [("TRACED_1", "0.01"), ("TRACED_100", "1.0")];

/// The drain again, from a slot of its own into a stream of its own, with traces sampled at
/// 1 % and at 100 % (`OTEL_TRACES_SAMPLER_ARG`) and exported to an OTLP receiver.
async fn traced_drains(
    pg: &Postgres,
    nats: &Nats,
    js: &jetstream::Context,
    s: &Settings,
    f: &mut Figures,
) {
    let receiver = support::otlp::Receiver::start().await;
    for (i, (stream, ratio)) in TRACED.into_iter().enumerate() {
        eprintln!("  pgoutbox drain, traces sampled at {ratio}");
        let mut run = command(pg, nats);
        run.args(own_slot_and_stream(stream))
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
            .env("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
            .env("OTEL_TRACES_SAMPLER_ARG", ratio)
            .arg("run");
        let started = Instant::now();
        let app = Pgoutbox::spawn(run);
        wait_for_count(js, stream, s.rows as u64, Duration::from_secs(600)).await;
        f.traced_drain[i].push(s.rows as f64 / started.elapsed().as_secs_f64());
        f.traced_cpu_us_per_row[i].push(cpu_seconds(app.pid()) * 1e6 / s.rows as f64);
        drop(app);
        let slot = stream.to_lowercase();
        wait_slot_active(pg, &slot, false).await;
        pg.psql(&format!("SELECT pg_drop_replication_slot('{slot}')"));
        let _ = js.delete_stream(stream).await;
    }
}

fn own_slot_and_stream(stream: &str) -> Vec<String> {
    let name = stream.to_lowercase();
    let template = format!("{name}.{{aggregate_type}}.x");
    let letters = format!("{name}.dead_letter");
    ["--slot", &name, "--stream", stream, "--subject-template", &template]
        .into_iter()
        .chain(["--dead-letter-subject", &letters])
        .map(str::to_owned)
        .collect()
}

/// `rows` rows of a `bigserial` outbox streamed, the table truncated with its sequence
/// restarted, and `rows` more: each reuses the id of a message inside the duplicate window
/// and goes to the dead-letter subject in its place. Returns those rows per second.
async fn collisions(pg: &Postgres, nats: &Nats, js: &jetstream::Context, rows: usize) -> f64 {
    pg.psql(
        "CREATE TABLE collide (id bigserial PRIMARY KEY, aggregate_type text, aggregate_id \
         text, event_type text, payload jsonb, headers jsonb, created_at timestamptz DEFAULT now())",
    );
    let mut args = own_slot_and_stream("COLLIDE");
    args.extend(["--table", "collide", "--publication", "collide"].map(str::to_owned));
    let mut run = command(pg, nats);
    run.args(&args).arg("run");
    let app = Pgoutbox::spawn(run);
    wait_slot_active(pg, "collide", true).await;
    insert_rows(pg, "collide", rows);
    wait_for_count(js, "COLLIDE", rows as u64, Duration::from_secs(600)).await;
    pg.psql("TRUNCATE collide RESTART IDENTITY");
    let started = Instant::now();
    insert_rows(pg, "collide", rows);
    wait_for_count(js, "COLLIDE", 2 * rows as u64, Duration::from_secs(900)).await;
    let per_second = rows as f64 / started.elapsed().as_secs_f64();
    drop(app);
    wait_slot_active(pg, "collide", false).await;
    pg.psql("SELECT pg_drop_replication_slot('collide')");
    let _ = js.delete_stream("COLLIDE").await;
    per_second
}

/// Waits until `slot` is held by a walsender (`active`) or by none.
async fn wait_slot_active(pg: &Postgres, slot: &str, active: bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let sql = format!("SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'");
    let want = if active { "t" } else { "f" };
    while pg.psql(&sql) != want {
        assert!(Instant::now() < deadline, "slot {slot} never became active={active}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until pgoutbox's walsender has sent the WAL written so far (it had to read past
/// the floor's rows, which are not in its publication). Sent, not confirmed: behind the
/// durability horizon (150 s by default) the slot is confirmed that long after.
async fn wait_caught_up(pg: &Postgres) {
    let target = wal_lsn(pg);
    let deadline = Instant::now() + Duration::from_secs(120);
    let sql = format!(
        "SELECT coalesce(bool_or(r.sent_lsn >= '{target}'), false) FROM pg_stat_replication r \
         JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = 'pgoutbox'"
    );
    while pg.psql(&sql) != "t" {
        assert!(Instant::now() < deadline, "pgoutbox did not catch up with the WAL");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// (sum, count) of each latency stage's histogram on pgoutbox's /metrics.
fn stage_sums(port: u16) -> [(f64, f64); 3] {
    let text = support::http_get(port, "/metrics").map(|r| r.1).unwrap_or_default();
    let value = |name: String| {
        text.lines()
            .find_map(|l| l.strip_prefix(name.as_str())?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    ["commit_to_receive", "receive_to_ack", "ack_to_confirm"].map(|stage| {
        let name = format!("pgoutbox_{stage}_seconds");
        (value(format!("{name}_sum")), value(format!("{name}_count")))
    })
}

/// Each stage's mean in ms between two readings of [`stage_sums`].
fn stage_means(before: [(f64, f64); 3], after: [(f64, f64); 3]) -> [f64; 3] {
    std::array::from_fn(|i| {
        let (sum, count) = (after[i].0 - before[i].0, after[i].1 - before[i].1);
        if count > 0.0 { sum / count * 1e3 } else { f64::NAN }
    })
}

/// For `count` messages after sequence `skip`: when JetStream stored each, and when its row
/// committed (the payload's `t`), in seconds since the Unix epoch, in stream order.
async fn stored_and_committed(
    js: &jetstream::Context,
    stream_name: &str,
    skip: u64,
    count: u64,
) -> Vec<(f64, f64)> {
    let stream = js.get_stream(stream_name).await.expect("stream");
    let config = OrderedConfig {
        deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
            start_sequence: skip + 1,
        },
        ..Default::default()
    };
    // On the three-server cluster with both cores busy, the request once went unanswered
    // for async-nats's 5 s (a CI run): ask again, under a deadline.
    let deadline = Instant::now() + Duration::from_secs(60);
    let consumer = loop {
        match stream.create_consumer(config.clone()).await {
            Ok(consumer) => break consumer,
            Err(err) if Instant::now() < deadline => {
                eprintln!("ordered consumer not created yet ({err}); asking again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => panic!("ordered consumer: {err:?}"),
        }
    };
    let mut messages = consumer.messages().await.expect("messages");
    let mut times = Vec::with_capacity(count as usize);
    while (times.len() as u64) < count {
        let message = messages.next().await.expect("message").expect("message");
        let info = message.info().expect("message info");
        let stored = info.published.unix_timestamp_nanos() as f64 / 1e9;
        let body: serde_json::Value = serde_json::from_slice(&message.payload).expect("JSON");
        times.push((stored, body["t"].as_f64().unwrap_or(stored)));
    }
    times
}

/// Inserts single-row transactions at `rate` per second for `seconds`, over a few
/// connections; returns how many rows and how long it really took.
async fn steady_writer_at(pg_url: &str, table: &str, rate: u64, seconds: u64) -> (u64, f64) {
    let connections = if rate > 2_000 { 8 } else { 2 };
    let per_connection = rate / connections;
    let mut tasks = Vec::new();
    let started = Instant::now();
    for c in 0..connections {
        let (client, connection) =
            tokio_postgres::connect(pg_url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        let sql = format!(
            "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', $1, 'created', jsonb_build_object('n', $1::text, \
             't', extract(epoch from clock_timestamp()), 'pad', repeat('x', {PAD})))"
        );
        tasks.push(tokio::spawn(async move {
            paced_inserts(&client, &sql, &format!("{c}-"), per_connection, seconds).await
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("writer");
    }
    (total, started.elapsed().as_secs_f64())
}

/// Runs `sql` (one parameter: an id, `<id_prefix><n>`) `rate` times a second for `seconds`
/// on `client`, each in a transaction of its own; how many ran.
async fn paced_inserts(
    client: &tokio_postgres::Client,
    sql: &str,
    id_prefix: &str,
    rate: u64,
    seconds: u64,
) -> u64 {
    let statement = client.prepare(sql).await.expect("prepare");
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let mut next = tokio::time::Instant::now();
    let deadline = next + Duration::from_secs(seconds);
    let mut sent = 0u64;
    while next < deadline {
        tokio::time::sleep_until(next).await;
        client.execute(&statement, &[&format!("{id_prefix}{sent}")]).await.expect("insert");
        sent += 1;
        next += interval;
    }
    sent
}

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

// ---------------------------------------------------------------------------------------
// The baseline: a polling relay as the literature describes it.

struct Relay {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(pg: &Postgres, nats: &Nats, interval: Duration) -> Relay {
        let (mut client, connection) =
            tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        let js = jetstream::new(async_nats::connect(nats.url()).await.expect("NATS"));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let tx = client.transaction().await.expect("begin");
                let rows = tx
                    .query(
                        "SELECT id::text, aggregate_type, aggregate_id, event_type, payload::text \
                         FROM outbox_polling WHERE NOT sent ORDER BY created_at LIMIT 1000 \
                         FOR UPDATE SKIP LOCKED",
                        &[],
                    )
                    .await
                    .expect("select");
                let mut acks = VecDeque::new();
                let mut ids = Vec::with_capacity(rows.len());
                for row in &rows {
                    let id: String = row.get(0);
                    let mut headers = HeaderMap::new();
                    headers.insert("Nats-Msg-Id", id.as_str());
                    headers.insert("Outbox-Aggregate-Type", row.get::<_, &str>(1));
                    headers.insert("Outbox-Aggregate-Id", row.get::<_, &str>(2));
                    headers.insert("Outbox-Event-Type", row.get::<_, &str>(3));
                    let body = bytes::Bytes::from(row.get::<_, String>(4));
                    let ack = js
                        .publish_with_headers("relay.order.created", headers, body)
                        .await
                        .expect("publish");
                    acks.push_back(ack.into_future());
                    ids.push(id);
                }
                for ack in acks {
                    ack.await.expect("ack");
                }
                tx.execute(
                    "UPDATE outbox_polling SET sent = true, sent_at = now() \
                     WHERE id = ANY($1::text[]::uuid[])",
                    &[&ids],
                )
                .await
                .expect("update");
                tx.commit().await.expect("commit");
                if rows.len() < 1000 {
                    tokio::select! {
                        () = tokio::time::sleep(interval) => {}
                        _ = stopped.changed() => return,
                    }
                }
            }
        });
        Relay { stop, task }
    }

    /// Waits until every row is marked sent (the UPDATE commits after the publish).
    async fn wait_idle(&self, pg: &Postgres) {
        while pg.psql("SELECT count(*) FROM outbox_polling WHERE NOT sent") != "0" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

// ---------------------------------------------------------------------------------------
// Report

fn stats(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn row(name: &str, values: &[f64], target: String) {
    let (median, min, max) = stats(values);
    println!("| {name:<46} | {median:>11.1} | {min:>11.1} | {max:>11.1} | {target} |");
}

/// The single-row steps: each figure beside the floor of the same run.
fn print_small(f: &Figures) {
    for (steps, label) in f.small.iter().zip(SMALL_LABELS) {
        let of = |pick: &dyn Fn(&small_transactions::Step) -> f64| -> Vec<f64> {
            steps.iter().map(pick).collect()
        };
        let floor_p99 = of(&|s| s.floor.arrival[1]);
        let floor_cpu = of(&|s| s.floor.reader_cpu_us_per_row);
        let p99 = of(&|s| s.latency[1]);
        let cpu = of(&|s| s.cpu_us_per_row);
        let over_floor: Vec<f64> = p99.iter().zip(&floor_p99).map(|(p, f)| p - f).collect();
        let cpu_ratio: Vec<f64> = cpu.iter().zip(&floor_cpu).map(|(c, f)| c / f).collect();
        println!("| single-row transactions {label} | | | | |");
        row("  floor: pg_recvlogical p50, ms", &of(&|s| s.floor.arrival[0]), "-".into());
        row("  floor: pg_recvlogical p99, ms", &floor_p99, "-".into());
        row("  floor + NATS hop p99, ms", &of(&|s| s.floor.stored[1]), "-".into());
        row("  pgoutbox p50, ms", &of(&|s| s.latency[0]), "-".into());
        let target = format!("≤ {:.1} (floor + 2)", stats(&floor_p99).0 + 2.0);
        row("  pgoutbox p99, ms", &p99, target);
        row("  pgoutbox p99 − floor p99, ms", &over_floor, "≤ 2".into());
        row("  pg_recvlogical CPU per transaction, µs", &floor_cpu, "-".into());
        let target = format!("≤ {:.1} (1.3 × pg_recvlogical)", 1.3 * stats(&floor_cpu).0);
        row("  pgoutbox CPU per transaction, µs", &cpu, target);
        row("  pgoutbox CPU / pg_recvlogical CPU", &cpu_ratio, "≤ 1.3".into());
        let hop_cpu = of(&|s| s.floor.relay_cpu_us_per_row);
        row("  relay (the floor's NATS hop) CPU per tx, µs", &hop_cpu, "-".into());
        let with_hop: Vec<f64> =
            cpu.iter().zip(floor_cpu.iter().zip(&hop_cpu)).map(|(c, (f, h))| c / (f + h)).collect();
        row("  pgoutbox CPU / (pg_recvlogical + relay) CPU", &with_hop, "-".into());
        row("  pgoutbox stage: commit → received, mean ms", &of(&|s| s.stages[0]), "-".into());
        row("  pgoutbox stage: received → acked, mean ms", &of(&|s| s.stages[1]), "-".into());
        row("  pgoutbox stage: acked → confirmed, mean ms", &of(&|s| s.stages[2]), "-".into());
        row(
            "  pg_recvlogical wake-ups per transaction",
            &of(&|s| s.floor.reader_wakeups_per_row),
            "-".into(),
        );
        row("  pgoutbox wake-ups per transaction", &of(&|s| s.wakeups_per_row), "-".into());
    }
}

fn print_report(s: &Settings, f: &Figures) {
    if s.only_small {
        println!("\n| figure | median | min | max | target |\n| --- | ---: | ---: | ---: | --- |");
        return print_small(f);
    }
    let column = |values: &[[f64; 4]], i: usize| values.iter().map(|v| v[i]).collect::<Vec<_>>();
    let both = stats(&f.both).0;
    let drain_ratio: Vec<f64> = f.drain.iter().zip(&f.both).map(|(d, b)| d / b).collect();
    let relay_ratio: Vec<f64> = f.drain.iter().zip(&f.relay_drain).map(|(d, r)| d / r).collect();
    println!(
        "\npgoutbox benchmark: {} rows of ~250-byte payloads, {} rows per transaction, \
         {} run(s), {} s per latency step\n",
        s.rows, ROWS_PER_TX, s.runs, s.latency_seconds
    );
    println!("| figure | median | min | max | target |");
    println!("| --- | ---: | ---: | ---: | --- |");
    row("limit (a): Postgres decode, pg_recvlogical rows/s", &f.decode, "-".into());
    row("limit (b): JetStream publish, 4096 in flight, msgs/s", &f.publish, "-".into());
    row("limit (c): both at once, rows/s", &f.both, "-".into());
    row("pgoutbox drain, rows/s", &f.drain, format!("≥ {:.0} (0.85 × c)", 0.85 * both));
    row("pgoutbox drain / limit (c)", &drain_ratio, "≥ 0.85".into());
    row("pgoutbox CPU per row at full drain, µs", &f.drain_cpu_us_per_row, "≤ 4".into());
    row("  traces sampled at 1 %: drain, rows/s", &f.traced_drain[0], "-".into());
    row("  traces sampled at 1 %: CPU per row, µs", &f.traced_cpu_us_per_row[0], "-".into());
    row("  traces sampled at 100 %: drain, rows/s", &f.traced_drain[1], "-".into());
    row("  traces sampled at 100 %: CPU per row, µs", &f.traced_cpu_us_per_row[1], "-".into());
    let replay_ratio: Vec<f64> = f.replay.iter().zip(&f.drain).map(|(r, d)| r / d).collect();
    row("pgoutbox replay (whole table, own stream), rows/s", &f.replay, "-".into());
    row("  replay / drain", &replay_ratio, "-".into());
    let live_ratio: Vec<f64> = f.replay_live.iter().zip(&f.drain).map(|(r, d)| r / d).collect();
    row("pgoutbox replay through the live pgoutbox, rows/s", &f.replay_live, "-".into());
    row("  replay through pgoutbox / drain", &live_ratio, ">= 0.9 x drain".into());
    let seed_ratio: Vec<f64> = f.seed.iter().zip(&f.drain).map(|(r, d)| r / d).collect();
    row("pgoutbox run --backfill (new stream), rows/s", &f.seed, "-".into());
    row("  backfill / drain", &seed_ratio, "-".into());
    row("pgoutbox colliding rows (dead letters in place), rows/s", &f.collisions, "-".into());
    row("pgoutbox peak RSS, MB", &f.rss_mb, "≤ 32".into());
    row("pgoutbox latency @1,000/s p50, ms", &column(&f.lat_1k, 0), "-".into());
    row("pgoutbox latency @1,000/s p99, ms", &column(&f.lat_1k, 1), "≤ 2".into());
    row("pgoutbox latency @1,000/s p99.9, ms", &column(&f.lat_1k, 2), "-".into());
    row("  achieved insert rate, rows/s", &column(&f.lat_1k, 3), "1,000".into());
    let floor = |values: &[[f64; 3]], i: usize| values.iter().map(|v| v[i]).collect::<Vec<_>>();
    let (floor_p50, floor_p99) = (stats(&floor(&f.floor_5k, 0)).0, stats(&floor(&f.floor_5k, 1)).0);
    row("floor @5,000/s: pg_recvlogical p50, ms", &floor(&f.floor_5k, 0), "-".into());
    row("floor @5,000/s: pg_recvlogical p99, ms", &floor(&f.floor_5k, 1), "-".into());
    row("floor @5,000/s + NATS hop p50, ms", &floor(&f.floor_5k_nats, 0), "-".into());
    row("floor @5,000/s + NATS hop p99, ms", &floor(&f.floor_5k_nats, 1), "-".into());
    let target_p50 = format!("≤ {:.1} (floor + 1)", floor_p50 + 1.0);
    let target_p99 = format!("≤ {:.1} (floor + 10)", floor_p99 + 10.0);
    row("pgoutbox latency @5,000/s p50, ms", &column(&f.lat_5k, 0), target_p50);
    row("pgoutbox latency @5,000/s p99, ms", &column(&f.lat_5k, 1), target_p99);
    row("pgoutbox latency @5,000/s p99.9, ms", &column(&f.lat_5k, 2), "-".into());
    row("  achieved insert rate, rows/s", &column(&f.lat_5k, 3), "5,000".into());
    row("  stage: commit → received, mean ms", &floor(&f.stages_5k, 0), "-".into());
    row("  stage: received → acked, mean ms", &floor(&f.stages_5k, 1), "-".into());
    row("  stage: acked → confirmed, mean ms", &floor(&f.stages_5k, 2), "-".into());
    row("pgoutbox latency @10,000/s p50, ms", &column(&f.lat_10k, 0), "-".into());
    row("pgoutbox latency @10,000/s p99, ms", &column(&f.lat_10k, 1), "-".into());
    row("pgoutbox latency @10,000/s p99.9, ms", &column(&f.lat_10k, 2), "-".into());
    row("  achieved insert rate, rows/s", &column(&f.lat_10k, 3), "10,000".into());
    print_small(f);
    row("polling relay drain (100 ms), rows/s", &f.relay_drain, "-".into());
    row("pgoutbox drain / relay drain", &relay_ratio, "≥ 5".into());
    row("relay latency @1,000/s, 100 ms poll, p50, ms", &column(&f.relay_lat_100ms, 0), "-".into());
    row("relay latency @1,000/s, 100 ms poll, p99, ms", &column(&f.relay_lat_100ms, 1), "-".into());
    row("relay latency @1,000/s, 1 s poll, p50, ms", &column(&f.relay_lat_1s, 0), "-".into());
    row("relay latency @1,000/s, 1 s poll, p99, ms", &column(&f.relay_lat_1s, 1), "-".into());
    row("WAL per row: the insert itself, bytes", &f.insert_wal_per_row, "-".into());
    row("extra WAL per row: pgoutbox, bytes", &f.drain_wal_per_row, "0".into());
    row("extra WAL per row: polling relay, bytes", &f.relay_wal_per_row, "-".into());
    row("R3 on 3 servers: JetStream publish, msgs/s", &f.r3_publish, "-".into());
    row("R3 on 3 servers: pgoutbox drain, rows/s", &f.r3_drain, "-".into());
    let r3_ratio: Vec<f64> = f.r3_drain.iter().zip(&f.drain).map(|(r, d)| r / d).collect();
    row("  R3 drain / single-server drain", &r3_ratio, "-".into());
    let r3_limit: Vec<f64> = f.r3_drain.iter().zip(&f.r3_publish).map(|(r, p)| r / p).collect();
    row("  R3 drain / R3 publish", &r3_limit, "-".into());
    row("leader killed: election (kill → new leader), ms", &f.election_ms, "-".into());
    row("leader killed @1,000/s: longest gap stored, ms", &f.election_gap_ms, "-".into());
    row("leader killed @1,000/s: worst latency, ms", &f.election_max_latency_ms, "-".into());
}
