//! What the pipeline tells `/metrics` and the stall detector: the latency stages of each
//! confirmable transaction, and every tick the gauges and the pace of a seed or a replay.

use std::time::Instant;

use super::Pipeline;
use crate::domain::progress::Timing;
use crate::postgres::wire::pg_now_micros;

impl Pipeline<'_> {
    /// Records the latency stages of the transactions that just became confirmable.
    pub(super) fn observe_confirmed(&mut self) {
        let now = pg_now_micros();
        let seconds = |from: i64, to: i64| (to - from).max(0) as f64 / 1e6;
        let mut newest = None;
        for Timing { committed, received } in self.protocol.take_confirmed_timings() {
            self.confirmable_since.get_or_insert_with(Instant::now);
            if committed == 0 {
                continue; // a seed's rows: read from the table, not timed from a commit
            }
            self.metrics.commit_to_ack.record(seconds(committed, now));
            self.metrics.commit_to_receive.record(seconds(committed, received));
            self.metrics.receive_to_ack.record(seconds(received, now));
            self.memory.published_up_to.advance(committed);
            newest = newest.max(Some(committed));
        }
        if let Some(committed) = newest {
            self.commits_unconfirmed.push((self.protocol.confirmed(), committed));
        }
        if let Some(traces) = &mut self.traces {
            traces.stored(self.protocol.confirmed());
        }
    }

    /// Tells the stall detector where things stand (`waiting`: something awaits an ack),
    /// and the task that records it in Postgres what JetStream acknowledged last.
    pub(super) fn record_progress(&mut self, waiting: bool) {
        let acks = std::mem::take(&mut self.acks_unrecorded);
        self.memory.progress.record(self.protocol.confirmed(), acks, waiting);
        if let Some(stored) = self.memory.stored {
            self.memory.acknowledged.set(stored, self.protocol.confirmed());
        }
    }

    /// What the durability horizon holds, since when, until when, and what it will hold at
    /// this write rate once full.
    fn horizon_gauges(&self, confirmed: u64, now: Instant) {
        let held = self.protocol.confirmed().saturating_sub(confirmed) as f64;
        let (waited, due) = self.horizon.oldest_wait(now).unwrap_or_default();
        let span = self.config.durability_horizon.as_secs_f64();
        let needed = match waited.as_secs_f64() {
            w if w > 1.0 && w < span => held * span / w,
            _ => held,
        };
        self.metrics.durability_held_bytes.set(held);
        self.metrics.durability_held_seconds.set(waited.as_secs_f64());
        self.metrics.durability_next_release_seconds.set(due.as_secs_f64());
        self.metrics.durability_needed_bytes.set(needed);
    }

    pub(super) fn update_gauges(&mut self) {
        self.record_progress(self.memory.row_waiting.is_some() || self.protocol.in_flight() > 0);
        let confirmed = self.reported;
        self.metrics.messages_in_flight.set(self.protocol.in_flight() as f64);
        self.metrics.confirmed_lsn.set(confirmed as f64);
        let lag = self.server_wal_end.saturating_sub(confirmed);
        self.metrics.replication_lag_bytes.set(lag as f64);
        let now = Instant::now();
        self.horizon_gauges(confirmed, now);
        if let Some(seed) = &self.memory.seed {
            let pace = self.memory.paces.seed.record(now, seed.done);
            self.metrics.seed_rows_per_second.set(pace);
        }
        self.replay_ended();
        let pace = self.memory.paces.replay.record(now, self.memory.paces.replay_done);
        self.metrics.replay_rows_per_second.set(pace);
    }
}
