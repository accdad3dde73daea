//! What the default durability horizon costs (issue 56), `--durability`: the WAL it holds
//! at 1,000 and 10,000 rows/s, how long a restart takes to read that WAL again, and how
//! long the slot trails an outbox that fell idle. Measured with a short horizon and scaled
//! to the default: the horizon holds the WAL written within it, and a restart reads it
//! again, so both grow with its length.

use std::time::{Duration, Instant};

use async_nats::jetstream;

use super::support::pgoutbox::{Pgoutbox, command};
use super::support::{Nats, Postgres, metric, wait_until_streaming};
use super::{steady_writer_at, wait_for_count, wal_bytes, wal_lsn};

/// The rates measured, single-row transactions per second: the two.
const RATES: [u64; 2] = [1_000, 10_000];
/// The horizon measured with, and the default it is scaled to.
const MEASURED: Duration = Duration::from_secs(20);
const DEFAULT_S: f64 = 150.0;
const WRITE: u64 = 40;

/// One run's figures, a value per rate in [`RATES`].
#[derive(Default)]
pub struct Figures {
    rate: [Vec<f64>; 2],
    wal_per_row: [Vec<f64>; 2],
    /// WAL the measured horizon held at steady state, MB.
    held_mb: [Vec<f64>; 2],
    /// From a kill -9 and start to a new row stored, with the measured horizon's WAL to
    /// read again, s.
    restart_s: [Vec<f64>; 2],
    /// From the last write to the slot's lag under 1 MB, s.
    idle_s: [Vec<f64>; 2],
}

pub async fn run(figures: &mut Figures) {
    for (i, rate) in RATES.into_iter().enumerate() {
        let pg = Postgres::start();
        let nats = Nats::start();
        let js = jetstream::new(async_nats::connect(nats.url()).await.expect("NATS"));
        pg.psql(include_str!("../../sql/outbox.sql"));
        let horizon = format!("{}s", MEASURED.as_secs());
        let spawn = || {
            let mut cmd = command(&pg, &nats);
            cmd.args(["run", "--durability-horizon", &horizon]);
            Pgoutbox::spawn(cmd)
        };
        let mut app = spawn();
        wait_until_streaming(&pg, &app).await;
        eprintln!("  {rate} rows/s for {WRITE} s behind a {} s horizon", MEASURED.as_secs());
        let from = wal_lsn(&pg);
        let url = pg.url();
        let writer =
            tokio::spawn(async move { steady_writer_at(&url, "outbox", rate, WRITE).await });
        tokio::time::sleep(MEASURED + Duration::from_secs(8)).await;
        let mut held = Vec::new();
        while !writer.is_finished() {
            held.extend(metric(app.http_port(), "pgoutbox_durability_held_bytes "));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let (rows, seconds) = writer.await.expect("writer");
        let wrote_until = Instant::now();
        figures.rate[i].push(rows as f64 / seconds);
        figures.wal_per_row[i].push(wal_bytes(&pg, &from, &wal_lsn(&pg)) / rows as f64);
        held.sort_by(f64::total_cmp);
        figures.held_mb[i].push(held.get(held.len() / 2).copied().unwrap_or(0.0) / 1e6);
        app.kill9();
        let restarted = Instant::now();
        let app = spawn();
        pg.psql(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('order', 'after', 'created', '{}')",
        );
        wait_for_count(&js, "OUTBOX", rows + 1, Duration::from_secs(300)).await;
        figures.restart_s[i].push(restarted.elapsed().as_secs_f64());
        idle_until_small(&pg, wrote_until).await;
        figures.idle_s[i].push(wrote_until.elapsed().as_secs_f64());
        drop(app);
    }
}

/// Waits until the slot's lag is under 1 MB.
async fn idle_until_small(pg: &Postgres, since: Instant) {
    let lag = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint \
               FROM pg_replication_slots WHERE slot_name = 'pgoutbox'";
    while pg.psql(lag).parse::<i64>().unwrap_or(i64::MAX) >= 1_000_000 {
        assert!(since.elapsed() < Duration::from_secs(600), "the slot never caught up");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub fn print(f: &Figures) {
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let scale = DEFAULT_S / MEASURED.as_secs_f64();
    println!(
        "\n## The durability horizon's cost (measured with {} s, scaled to the default {DEFAULT_S} s)\n",
        MEASURED.as_secs()
    );
    println!(
        "| rows/s asked (reached) | WAL per row | WAL held, measured | WAL held by the default | restart to a new row stored, measured | the same, default (scaled) | slot lag under 1 MB after the last write |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (i, rate) in RATES.iter().enumerate() {
        let held = median(&f.held_mb[i]);
        let restart = median(&f.restart_s[i]);
        println!(
            "| {rate} ({:.0}) | {:.0} B | {held:.1} MB | {:.0} MB | {restart:.1} s | {:.1} s | {:.1} s (horizon {} s) |",
            median(&f.rate[i]),
            median(&f.wal_per_row[i]),
            held * scale,
            restart * scale,
            median(&f.idle_s[i]),
            MEASURED.as_secs(),
        );
    }
}
