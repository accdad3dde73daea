//! The stall detector: connected, healthy-looking, and nothing moves.
//!
//! Stalled means something is waiting (publishes sent and not acknowledged, or a row that
//! could not be sent and is tried again at each attempt) while neither an ack arrived nor the confirmed position
//! advanced for `--stall-timeout`. Acks count: inside one long transaction the confirmed
//! position cannot move before its commit, while its rows are acknowledged all along. An
//! idle outbox is never stalled: with nothing waiting, the clock restarts. The pipeline records its state in [`Progress`]; `telemetry::watch_stalls` judges it on its own
//! clock, so a pipeline blocked on NATS or between reconnections is still watched.
//! [`StallDetector`] is pure apart from the log lines: tests feed it the time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::warn;

/// What the pipeline last reported: its confirmed position, how many acks it has had,
/// and whether anything waits. It outlives each connection attempt, so rows left
/// unacknowledged by a failed attempt keep counting as waiting until a later attempt
/// confirms past them.
#[derive(Default)]
pub struct Progress {
    confirmed: AtomicU64,
    acks: AtomicU64,
    waiting: AtomicBool,
}

/// One reading of [`Progress`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Observed {
    pub confirmed: u64,
    /// Acks so far, over all attempts.
    pub acks: u64,
    pub waiting: bool,
}

impl Progress {
    /// Records the confirmed position, `new_acks` more acks, and whether anything waits.
    pub fn record(&self, confirmed: u64, new_acks: u64, waiting: bool) {
        self.confirmed.store(confirmed, Ordering::Relaxed);
        self.acks.fetch_add(new_acks, Ordering::Relaxed);
        self.waiting.store(waiting, Ordering::Relaxed);
    }

    pub fn read(&self) -> Observed {
        Observed {
            confirmed: self.confirmed.load(Ordering::Relaxed),
            acks: self.acks.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
        }
    }
}

pub struct StallDetector {
    timeout: Duration,
    last: Observed,
    /// When the confirmed position last moved, or nothing waited.
    last_confirmation: Instant,
    /// When an ack last came or the confirmed position moved, or nothing waited.
    last_progress: Instant,
    stalled: bool,
}

impl StallDetector {
    pub fn new(timeout: Duration, now: Instant) -> Self {
        StallDetector {
            timeout,
            last: Observed::default(),
            last_confirmation: now,
            last_progress: now,
            stalled: false,
        }
    }

    /// Takes one observation; returns the reason while stalled.
    pub fn observe(&mut self, observed: Observed, now: Instant) -> Option<String> {
        let confirmed = observed.confirmed != self.last.confirmed || !observed.waiting;
        if confirmed {
            self.last_confirmation = now;
        }
        if confirmed || observed.acks != self.last.acks {
            self.last_progress = now;
        }
        self.last = observed;
        let idle_for = now.saturating_duration_since(self.last_progress);
        let stalled = observed.waiting && idle_for >= self.timeout;
        if stalled != self.stalled {
            self.stalled = stalled;
            if stalled {
                warn!(
                    for_seconds = idle_for.as_secs(),
                    "stalled: messages wait for acks (or a row to be sent again), and no ack \
                    came and the confirmed position has not moved"
                );
            } else {
                warn!("stall ended: acks or the confirmed position move again");
            }
        }
        stalled.then(|| {
            format!(
                "stalled: no ack and nothing confirmed for {} s while messages wait for \
                 JetStream acks (or a row to be sent again)",
                idle_for.as_secs()
            )
        })
    }

    /// Time since the confirmed position last moved (or nothing was waiting): how long the
    /// slot has kept WAL it could otherwise release, stalled or not.
    pub fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_confirmation)
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
        let waiting = |confirmed| Observed { confirmed, acks: 5, waiting: true };
        assert_eq!(d.observe(waiting(10), t0), None);
        assert_eq!(d.observe(waiting(10), t0 + 59 * s), None);
        assert!(d.observe(waiting(10), t0 + 60 * s).is_some());
        assert!(d.observe(waiting(10), t0 + 90 * s).is_some_and(|r| r.contains("90 s")));
        assert_eq!(d.observe(waiting(11), t0 + 91 * s), None, "progress ends the stall");
        assert_eq!(d.age(t0 + 95 * s), 4 * s);
    }

    #[test]
    fn an_idle_outbox_is_never_stalled() {
        let t0 = Instant::now();
        let mut d = StallDetector::new(Duration::from_secs(5), t0);
        for minute in 0..10 {
            let idle = Observed { confirmed: 10, acks: 5, waiting: false };
            assert_eq!(d.observe(idle, t0 + Duration::from_secs(60 * minute)), None);
        }
    }

    #[test]
    fn acks_without_a_confirmation_are_progress() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut d = StallDetector::new(Duration::from_secs(60), t0);
        // One long transaction: its rows are acknowledged, its commit not yet.
        for minute in 0..5 {
            let acks = 1_000 * (minute + 1);
            let observed = Observed { confirmed: 10, acks, waiting: true };
            assert_eq!(d.observe(observed, t0 + 60 * s * minute as u32), None, "minute {minute}");
        }
        assert_eq!(d.age(t0 + 240 * s), 240 * s, "the confirmation's age still grows");
        let frozen = Observed { confirmed: 10, acks: 5_000, waiting: true };
        assert!(d.observe(frozen, t0 + 300 * s).is_some(), "no ack for 60 s is a stall");
    }
}
