//! The stall detector: connected, healthy-looking, and nothing moves.
//!
//! Stalled means something is waiting (publishes sent and not acknowledged, or a row that
//! could not be published) while the confirmed position has not advanced for
//! `--stall-timeout`. An idle outbox is never stalled: with nothing waiting, the clock
//! restarts. The pipeline records its state in [`Progress`]; `telemetry::watch_stalls` judges it on its own
//! clock, so a pipeline blocked on NATS or between reconnections is still watched.
//! [`StallDetector`] is pure apart from the log lines: tests feed it the time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::warn;

/// What the pipeline last reported: its confirmed position and whether anything waits.
/// It outlives each connection attempt, so rows left unacknowledged by a failed attempt
/// keep counting as waiting until a later attempt confirms past them.
#[derive(Default)]
pub struct Progress {
    confirmed: AtomicU64,
    waiting: AtomicBool,
}

impl Progress {
    pub fn record(&self, confirmed: u64, waiting: bool) {
        self.confirmed.store(confirmed, Ordering::Relaxed);
        self.waiting.store(waiting, Ordering::Relaxed);
    }

    /// The last record: the confirmed position and whether anything waits.
    pub fn read(&self) -> (u64, bool) {
        (self.confirmed.load(Ordering::Relaxed), self.waiting.load(Ordering::Relaxed))
    }
}

pub struct StallDetector {
    timeout: Duration,
    last_confirmed: u64,
    last_progress: Instant,
    stalled: bool,
}

impl StallDetector {
    pub fn new(timeout: Duration, now: Instant) -> Self {
        StallDetector { timeout, last_confirmed: 0, last_progress: now, stalled: false }
    }

    /// Takes one observation; returns the reason while stalled.
    pub fn observe(&mut self, confirmed: u64, waiting: bool, now: Instant) -> Option<String> {
        if confirmed != self.last_confirmed || !waiting {
            self.last_confirmed = confirmed;
            self.last_progress = now;
        }
        let idle_for = now.saturating_duration_since(self.last_progress);
        let stalled = waiting && idle_for >= self.timeout;
        if stalled != self.stalled {
            self.stalled = stalled;
            if stalled {
                warn!(
                    for_seconds = idle_for.as_secs(),
                    "stalled: messages wait for acks and \
                    the confirmed position has not moved"
                );
            } else {
                warn!("stall ended: the confirmed position moves again");
            }
        }
        stalled.then(|| {
            format!(
                "stalled: nothing confirmed for {} s while messages wait for JetStream acks",
                idle_for.as_secs()
            )
        })
    }

    /// Seconds since the confirmed position last moved (or nothing was waiting).
    pub fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_without_progress_for_the_timeout_is_a_stall_until_progress() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut d = StallDetector::new(Duration::from_secs(60), t0);
        assert_eq!(d.observe(10, true, t0), None);
        assert_eq!(d.observe(10, true, t0 + 59 * s), None);
        assert!(d.observe(10, true, t0 + 60 * s).is_some());
        assert!(d.observe(10, true, t0 + 90 * s).is_some_and(|r| r.contains("90 s")));
        assert_eq!(d.observe(11, true, t0 + 91 * s), None, "progress ends the stall");
        assert_eq!(d.age(t0 + 95 * s), 4 * s);
    }

    #[test]
    fn an_idle_outbox_is_never_stalled() {
        let t0 = Instant::now();
        let mut d = StallDetector::new(Duration::from_secs(5), t0);
        for minute in 0..10 {
            assert_eq!(d.observe(10, false, t0 + Duration::from_secs(60 * minute)), None);
        }
    }
}
