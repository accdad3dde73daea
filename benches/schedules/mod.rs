//! What scheduled deliveries cost the rows around them (`--schedules`, nats-server 2.12+):
//! each delivery nats-server writes into the stream between two of pgoutbox's publishes
//! ends an attempt (docs/operations.md#delayed-delivery---schedule-column). Immediate rows at a steady
//! rate beside scheduled rows due a second after their commit, at several rates: the
//! immediate rows' latency from commit to stored, each delivery's lateness past its time,
//! and the attempts ended, beside the same rows with no schedule (the first step, the limit).

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures_util::StreamExt;

use super::support::pgoutbox::Pgoutbox;
use super::support::{Nats, Postgres, http_get, wait_until_streaming};
use super::{PAD, paced_inserts, percentiles, steady_writer_at, wait_for_count};

/// Immediate rows per second, single-row transactions.
const IMMEDIATE_RATE: u64 = 500;
/// Scheduled rows per second at each step; each is delivered a second after its commit, so
/// from the second second on, deliveries come at this rate between the immediate rows.
const DELIVERY_RATES: [u64; 4] = [0, 10, 100, 400];
const WRITE_SECONDS: u64 = 20;
const DUE_AFTER_SECONDS: f64 = 1.0;

/// One run's figures, a value per step in [`DELIVERY_RATES`].
#[derive(Default)]
pub struct Figures {
    /// Immediate rows, commit → stored, ms: p50, p99, p99.9.
    immediate_ms: [Vec<[f64; 3]>; 4],
    /// Deliveries, their time → stored, ms: p50, p99, p99.9.
    late_ms: [Vec<[f64; 3]>; 4],
    /// Attempts a delivery ended (the log's "streaming on behind it").
    overtaken: [Vec<f64>; 4],
    /// Publish errors counted on `/metrics`: attempts that ended otherwise, or were overtaken
    /// before their first ack and waited the backoff.
    publish_errors: [Vec<f64>; 4],
}

pub async fn run(figures: &mut Figures) {
    for (step, rate) in DELIVERY_RATES.into_iter().enumerate() {
        let pg = Postgres::start();
        let nats = Nats::start();
        if nats.release() < (2, 12) {
            eprintln!("--schedules needs nats-server 2.12 or later: set PGOUTBOX_TEST_NATS=2.15");
            return;
        }
        pg.psql(include_str!("../../sql/outbox.sql"));
        pg.psql("ALTER TABLE outbox ADD COLUMN deliver_at timestamptz;");
        let app = Pgoutbox::run(&pg, &nats, &["--schedule-column=deliver_at"]);
        wait_until_streaming(&pg, &app).await;
        let js = jetstream::new(async_nats::connect(nats.url()).await.expect("NATS"));
        eprintln!(
            "  {IMMEDIATE_RATE} immediate rows/s and {rate} scheduled rows/s for {WRITE_SECONDS} s"
        );
        let url = pg.url();
        let scheduled = tokio::spawn(async move { scheduled_writer(&url, rate).await });
        let (immediate, _) =
            steady_writer_at(&pg.url(), "outbox", IMMEDIATE_RATE, WRITE_SECONDS).await;
        let scheduled = scheduled.await.expect("scheduled writer");
        // Each schedule is deleted when delivered: the stream ends with every row once.
        let rows = immediate + scheduled;
        wait_for_count(&js, "OUTBOX", rows, Duration::from_secs(120)).await;
        let (mut on_time, mut late) = latencies(&js, rows).await;
        figures.immediate_ms[step].push(percentiles(&mut on_time));
        if !late.is_empty() {
            figures.late_ms[step].push(percentiles(&mut late));
        }
        let log = app.log();
        figures.overtaken[step].push(log.matches("streaming on behind it").count() as f64);
        figures.publish_errors[step].push(publish_errors(app.http_port()));
    }
}

/// Rows due a second after their commit, at `rate` per second for [`WRITE_SECONDS`]; how
/// many were written.
async fn scheduled_writer(pg_url: &str, rate: u64) -> u64 {
    if rate == 0 {
        return 0;
    }
    let (client, connection) =
        tokio_postgres::connect(pg_url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let sql = format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, deliver_at) \
         VALUES ('order', $1, 'reminded', jsonb_build_object('n', $1::text, \
         't', extract(epoch from clock_timestamp()), 'pad', repeat('x', {PAD})), \
         clock_timestamp() + interval '{DUE_AFTER_SECONDS} seconds')"
    );
    paced_inserts(&client, &sql, "s-", rate, WRITE_SECONDS).await
}

/// The stream's `count` messages: the immediate rows' commit → stored, and the deliveries'
/// time → stored (a delivery carries `Nats-Scheduler`), in ms.
async fn latencies(js: &jetstream::Context, count: u64) -> (Vec<f64>, Vec<f64>) {
    let stream = js.get_stream("OUTBOX").await.expect("stream");
    let consumer = stream.create_consumer(OrderedConfig::default()).await.expect("consumer");
    let mut messages = consumer.messages().await.expect("messages");
    let (mut on_time, mut late) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while ((on_time.len() + late.len()) as u64) < count {
        assert!(Instant::now() < deadline, "the stream's {count} messages not read in 60 s");
        let message = messages.next().await.expect("message").expect("message");
        let info = message.info().expect("message info");
        let stored = info.published.unix_timestamp_nanos() as f64 / 1e9;
        let body: serde_json::Value = serde_json::from_slice(&message.payload).expect("JSON");
        let committed = body["t"].as_f64().unwrap_or(stored);
        let delivered = message.headers.as_ref().and_then(|h| h.get("Nats-Scheduler")).is_some();
        match delivered {
            true => late.push(((stored - committed - DUE_AFTER_SECONDS) * 1e3).max(0.0)),
            false => on_time.push(((stored - committed) * 1e3).max(0.0)),
        }
    }
    (on_time, late)
}

/// The sum of `pgoutbox_publish_errors_total` over its kinds.
fn publish_errors(port: u16) -> f64 {
    let Some((_, text)) = http_get(port, "/metrics") else { return f64::NAN };
    text.lines()
        .filter(|line| line.starts_with("pgoutbox_publish_errors_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn print(f: &Figures) {
    println!(
        "\n{IMMEDIATE_RATE} immediate rows/s beside scheduled rows due 1 s after commit, \
         {WRITE_SECONDS} s (median of runs; the first line, no schedules, is the limit)"
    );
    println!(
        "| scheduled rows/s | immediate p50 / p99 / p99.9 ms | delivery late p50 / p99 / p99.9 ms \
         | attempts overtaken | publish errors |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for (step, rate) in DELIVERY_RATES.into_iter().enumerate() {
        let three = |values: &[[f64; 3]]| match median_of(values) {
            Some([a, b, c]) => format!("{a:.1} / {b:.1} / {c:.1}"),
            None => "-".into(),
        };
        let one = |values: &[f64]| {
            let mut v = values.to_vec();
            v.sort_by(|a, b| a.total_cmp(b));
            v.get(v.len() / 2).map_or("-".into(), |m| format!("{m:.0}"))
        };
        println!(
            "| {rate} | {} | {} | {} | {} |",
            three(&f.immediate_ms[step]),
            three(&f.late_ms[step]),
            one(&f.overtaken[step]),
            one(&f.publish_errors[step]),
        );
    }
}

/// The run whose p99 is the median of the runs'.
fn median_of(values: &[[f64; 3]]) -> Option<[f64; 3]> {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a[1].total_cmp(&b[1]));
    v.get(v.len() / 2).copied()
}
