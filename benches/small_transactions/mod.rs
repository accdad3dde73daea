//! Single-row transactions at 1,000 and 3,000/s (issue 31): pgoutbox's latency and CPU per
//! transaction beside the floor measured in the same run, on a quiet host and on a
//! contended one.
//!
//! Each step runs the floor first (`floor::measure`, pgoutbox stopped, rows to a table
//! outside its publication), then pgoutbox on the same load, logging at `info` as in
//! production. CPU is read from the
//! scheduler's per-thread counters (`/proc/<pid>/task/*/schedstat`, nanoseconds), since
//! the 10 ms ticks of `/proc/<pid>/stat` are too coarse for a few seconds of small work.
//!
//! Contended: a process hashing `/dev/zero` (`sha256sum`, pure CPU, same nice level) runs
//! throughout the floor and pgoutbox steps and keeps one of the two cores busy, so every
//! process on the path competes with it, as on a host at half load. Two of them (until
//! 2026-11-27) left no core free: the floor's own p99 then ranged from 12 to 80 ms between
//! runs, a figure of the scheduler rather than of either program.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use async_nats::jetstream;

use super::support::pgoutbox::{Pgoutbox, command};
use super::support::{Nats, Postgres};
use super::{floor, percentiles, steady_writer_at, stored_and_committed, wait_for_count};

/// One rate, quiet or contended: the floor and pgoutbox, side by side.
pub struct Step {
    pub floor: floor::Floor,
    /// pgoutbox's p50, p99 and p99.9 in ms.
    pub latency: [f64; 3],
    /// pgoutbox's CPU per transaction (one row each), µs.
    pub cpu_us_per_row: f64,
    /// pgoutbox's wake-ups (voluntary context switches, all threads) per transaction.
    pub wakeups_per_row: f64,
    /// pgoutbox's own stages, mean ms: commit → received, received → acked, acked →
    /// confirmed.
    pub stages: [f64; 3],
}

/// What a step writes, and the pgoutbox it runs.
pub struct Load {
    pub rate: u64,
    pub seconds: u64,
    pub contended: bool,
    /// `--durability-horizon`; `None` leaves the default.
    pub horizon: Option<&'static str>,
}

pub async fn step(pg: &Postgres, nats: &Nats, js: &jetstream::Context, load: Load) -> Step {
    let Load { rate, seconds, contended, horizon } = load;
    let started = std::time::SystemTime::now();
    let hog = contended.then(Hog::start);
    let floor = floor::measure(pg, &nats.url(), js, rate, seconds).await;
    // Logging as in production: the tests' `pgoutbox=debug` writes a line per status update.
    let mut run = command(pg, nats);
    run.env("RUST_LOG", "info").arg("run");
    if let Some(horizon) = horizon {
        run.args(["--durability-horizon", horizon]);
    }
    let app = Pgoutbox::spawn(run);
    super::wait_caught_up(pg).await;
    let skip = super::stream_count(js, "OUTBOX").await;
    let (cpu_before, wakeups_before) = (thread_cpu_seconds(app.pid()), wakeups(app.pid()));
    let stages_before = super::stage_sums(app.http_port());
    let (inserted, _) = steady_writer_at(&pg.url(), "outbox", rate, seconds).await;
    wait_for_count(js, "OUTBOX", skip + inserted, Duration::from_secs(120)).await;
    let cpu = thread_cpu_seconds(app.pid()) - cpu_before;
    let woken = wakeups(app.pid()) - wakeups_before;
    let stages = super::stage_means(stages_before, super::stage_sums(app.http_port()));
    drop(hog);
    drop(app);
    let times = stored_and_committed(js, "OUTBOX", skip, inserted).await;
    let mut latencies: Vec<f64> =
        times.iter().map(|(stored, committed)| ((stored - committed) * 1e3).max(0.0)).collect();
    if let Ok(dir) = std::env::var("PGOUTBOX_BENCH_DUMP") {
        let lines: Vec<String> =
            times.iter().map(|(s, c)| format!("{c:.6},{:.3}", (s - c) * 1e3)).collect();
        // One file a step and run: the step's start time tells the runs apart.
        let at = started.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let file = format!("{dir}/lat-{rate}-{contended}-{at}.csv");
        let _ = std::fs::write(file, lines.join("\n"));
    }
    Step {
        floor,
        latency: percentiles(&mut latencies),
        cpu_us_per_row: cpu * 1e6 / inserted.max(1) as f64,
        wakeups_per_row: woken / inserted.max(1) as f64,
        stages,
    }
}

/// Voluntary context switches of every live thread of `pid`: each is a sleep that a wake-up
/// ended.
pub fn wakeups(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return f64::NAN };
    let mut switches = 0u64;
    for task in tasks.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let field = status.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"));
        switches += field.and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    }
    switches as f64
}

/// The CPU time of every live thread of `pid`, in seconds.
pub fn thread_cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return f64::NAN };
    let mut nanos = 0u64;
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        nanos += stat.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
    }
    nanos as f64 / 1e9
}

/// A CPU-bound process, killed when dropped.
struct Hog(Child);

impl Hog {
    fn start() -> Hog {
        let child = Command::new("sha256sum")
            .arg("/dev/zero")
            .stdout(Stdio::null())
            .spawn()
            .expect("sha256sum, to contend the cores");
        Hog(child)
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
