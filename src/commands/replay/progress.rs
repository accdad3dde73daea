//! What a replay shows while it runs: a line on stderr each second, and the record
//! `pgoutbox status` reads (`nats::publisher::replay_board`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::nats::publisher::{Publisher, ReplayRecord};

/// How often progress is printed and recorded.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

pub(super) struct Progress<'a> {
    publisher: &'a Publisher,
    id: &'a str,
    total: u64,
    started: Instant,
    shown: Instant,
}

impl<'a> Progress<'a> {
    /// Records the replay as running, none of its rows done yet.
    pub(super) async fn start(publisher: &'a Publisher, id: &'a str, total: u64) -> Progress<'a> {
        let progress =
            Progress { publisher, id, total, started: Instant::now(), shown: Instant::now() };
        progress.record(0, 0.0, false).await;
        progress
    }

    /// `done` rows of the selection are published or passed over; `line` says more on
    /// stderr, given the pace.
    pub(super) async fn tick(&mut self, done: u64, line: impl FnOnce(f64) -> String) {
        if self.shown.elapsed() < PROGRESS_EVERY {
            return;
        }
        let pace = done as f64 / self.started.elapsed().as_secs_f64();
        eprintln!("replay {}: {}", self.id, line(pace));
        self.record(done, pace, false).await;
        self.shown = Instant::now();
    }

    pub(super) async fn finish(&self, done: u64) {
        let pace = done as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
        self.record(done, pace, true).await;
    }

    /// Best effort: a replay does not stop because `status` cannot see it.
    async fn record(&self, rows_done: u64, rows_per_second: f64, finished: bool) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let record = ReplayRecord {
            replay_id: self.id.to_owned(),
            rows: self.total,
            rows_done,
            rows_per_second,
            updated_at: now,
            finished,
        };
        if let Err(err) = self.publisher.record_replay(&record).await {
            tracing::warn!(error = %err, "the replay's progress could not be recorded for status");
        }
    }
}
