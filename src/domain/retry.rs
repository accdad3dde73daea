//! Whether to try again after a failed attempt, and how soon: a pure decision, so every
//! rule is a unit test.

use std::time::{Duration, Instant};

/// What an attempt's failure means for the next one (`PipelineError::failure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Another process streams from the slot: wait as a hot standby.
    SlotBusy,
    /// NATS failed; Postgres costs nothing until JetStream answers again.
    Nats,
    /// Postgres failed or went silent.
    Postgres,
    /// The server is in recovery (a standby, or one being promoted): wait for it to
    /// accept writes, polling as a hot standby does.
    Recovery,
    /// Retrying cannot help (a lost slot, a stream of another source, ...): stop.
    Fatal,
}

/// How a failed attempt went.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    pub ran_for: Duration,
    /// JetStream acknowledged at least one message during it.
    pub acknowledged: bool,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    RetryAfter(Duration),
    Stop,
}

/// Backoff per failure kind: NATS retries are capped low, because a cluster that has just
/// elected a leader should not wait out a long backoff; an attempt that ran long enough to
/// be healthy, or got anything acknowledged, earns a fresh backoff.
#[derive(Default)]
pub struct RetryPolicy {
    backoff: Backoff,
    /// Attempts overtaken by a delivery before their first ack, since one got on.
    overtaken_early: u32,
}

impl RetryPolicy {
    /// A connection that streamed at least this long earns a fresh backoff.
    pub const HEALTHY_RUN: Duration = Duration::from_secs(10);
    /// The longest wait before retrying after a NATS failure.
    pub const NATS_CAP: Duration = Duration::from_millis(500);
    /// How often a standby checks whether the slot became free.
    pub const STANDBY_POLL: Duration = Duration::from_secs(1);
    /// Attempts overtaken before their first ack that pause only [`Self::OVERTAKEN_PAUSE`].
    const OVERTAKEN_EARLY_TRIES: u32 = 8;
    /// Long enough for a burst of a few thousand deliveries to be written (40 ms for 3,000
    /// on nats-server 2.15, measured by `scheduled_rows`).
    const OVERTAKEN_PAUSE: Duration = Duration::from_millis(25);

    /// The decision after `attempt` failed with `failure`.
    pub fn after(&mut self, failure: Failure, attempt: Attempt) -> Next {
        // Only attempts that failed without getting anywhere back off further: short
        // attempts that each publish (every delivered scheduled row ends one) are progress.
        if attempt.ran_for >= Self::HEALTHY_RUN || attempt.acknowledged {
            self.backoff.reset();
            self.overtaken_early = 0;
        }
        match failure {
            Failure::SlotBusy | Failure::Recovery => Next::RetryAfter(Self::STANDBY_POLL),
            Failure::Nats => Next::RetryAfter(self.backoff.next_delay().min(Self::NATS_CAP)),
            Failure::Postgres => Next::RetryAfter(self.backoff.next_delay()),
            Failure::Fatal => Next::Stop,
        }
    }

    /// How long to wait after an attempt a scheduled row's delivery overtook (`after` was
    /// asked first): nothing once it got on; a short pause before its first ack, a few times
    /// in a row, since nats-server writes a second's due deliveries as one burst and an
    /// attempt started within it is overtaken again at its first publish; then `None`, a
    /// refusal like any other (a writer that is not the server's scheduler, say).
    pub fn after_overtaken(&mut self, attempt: Attempt) -> Option<Duration> {
        if attempt.acknowledged {
            return Some(Duration::ZERO);
        }
        self.overtaken_early += 1;
        (self.overtaken_early <= Self::OVERTAKEN_EARLY_TRIES).then_some(Self::OVERTAKEN_PAUSE)
    }
}

/// Capped exponential backoff: 200 ms doubling up to 30 s, or up to the cap given.
pub struct Backoff {
    next: Duration,
    cap: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(200);
    const CAP: Duration = Duration::from_secs(30);

    pub fn new() -> Self {
        Self::capped(Self::CAP)
    }

    /// For waits whose every try is cheap, where waking late costs more than trying.
    pub fn capped(cap: Duration) -> Self {
        Backoff { next: Self::FIRST.min(cap), cap }
    }

    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.cap);
        delay
    }

    pub fn reset(&mut self) {
        self.next = Self::FIRST.min(self.cap);
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// Keeps a failure that repeats every half second (quorum lost for minutes) from flooding
/// the log: a new error is a warning at once, the same one again every 30 s, with a count.
#[derive(Default)]
pub struct RepeatedError {
    last: String,
    warned_at: Option<Instant>,
    since_warned: u32,
}

impl RepeatedError {
    /// `Some(times seen since the last warning)` when this one should be a warning.
    pub fn note(&mut self, error: &str) -> Option<u32> {
        const EVERY: Duration = Duration::from_secs(30);
        self.since_warned += 1;
        let same = self.last == error;
        if same && self.warned_at.is_some_and(|at| at.elapsed() < EVERY) {
            return None;
        }
        if !same {
            self.last = error.to_owned();
            self.since_warned = 1;
        }
        self.warned_at = Some(Instant::now());
        Some(std::mem::take(&mut self.since_warned))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_backs_off_per_failure_and_forgives_a_healthy_run() {
        let short = Attempt { ran_for: Duration::from_secs(1), acknowledged: false };
        let healthy = Attempt { ran_for: RetryPolicy::HEALTHY_RUN, acknowledged: false };
        let mut policy = RetryPolicy::default();
        assert_eq!(policy.after(Failure::Fatal, short), Next::Stop);
        assert_eq!(
            policy.after(Failure::SlotBusy, short),
            Next::RetryAfter(RetryPolicy::STANDBY_POLL)
        );
        assert_eq!(
            policy.after(Failure::Recovery, short),
            Next::RetryAfter(RetryPolicy::STANDBY_POLL),
            "a server in recovery is waited for, never a reason to stop"
        );
        let postgres: Vec<_> = (0..4).map(|_| policy.after(Failure::Postgres, short)).collect();
        let ms = |ms| Next::RetryAfter(Duration::from_millis(ms));
        assert_eq!(postgres, [ms(200), ms(400), ms(800), ms(1600)]);
        assert_eq!(policy.after(Failure::Nats, short), ms(500), "NATS retries are capped");
        assert_eq!(policy.after(Failure::Postgres, healthy), ms(200));
    }

    #[test]
    fn a_short_attempt_that_published_earns_a_fresh_backoff() {
        // Measured in the soak on nats-server 2.15: each delivered scheduled row ends an
        // attempt after a second or so; counted as failures they grew the wait to 30 s.
        let failed = Attempt { ran_for: Duration::from_secs(1), acknowledged: false };
        let published = Attempt { ran_for: Duration::from_secs(1), acknowledged: true };
        let mut policy = RetryPolicy::default();
        for _ in 0..8 {
            policy.after(Failure::Postgres, failed);
        }
        assert_eq!(
            policy.after(Failure::Postgres, published),
            Next::RetryAfter(Duration::from_millis(200))
        );
        assert_eq!(
            policy.after(Failure::Postgres, failed),
            Next::RetryAfter(Duration::from_millis(400)),
            "a failure without progress backs off again from the start"
        );
    }

    #[test]
    fn an_attempt_overtaken_by_a_delivery_goes_on_at_once_or_after_a_short_pause_a_few_times() {
        let got_on = Attempt { ran_for: Duration::from_millis(900), acknowledged: true };
        let early = Attempt { ran_for: Duration::from_millis(20), acknowledged: false };
        let mut policy = RetryPolicy::default();
        let overtaken = |policy: &mut RetryPolicy, attempt| {
            policy.after(Failure::Nats, attempt);
            policy.after_overtaken(attempt)
        };
        assert_eq!(overtaken(&mut policy, got_on), Some(Duration::ZERO));
        let pause = Some(RetryPolicy::OVERTAKEN_PAUSE);
        for _ in 0..RetryPolicy::OVERTAKEN_EARLY_TRIES {
            assert_eq!(overtaken(&mut policy, early), pause);
        }
        assert_eq!(overtaken(&mut policy, early), None, "then a refusal like any other");
        assert_eq!(overtaken(&mut policy, got_on), Some(Duration::ZERO));
        assert_eq!(overtaken(&mut policy, early), pause, "counted afresh once one got on");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_resets() {
        let mut b = Backoff::new();
        let delays: Vec<_> = (0..10).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(200));
    }

    #[test]
    fn a_repeated_error_is_warned_once_then_counted() {
        let mut repeats = RepeatedError::default();
        assert_eq!(repeats.note("no leader"), Some(1));
        assert_eq!(repeats.note("no leader"), None);
        assert_eq!(repeats.note("no leader"), None);
        assert_eq!(repeats.note("timed out"), Some(1), "a different error is warned at once");
        assert_eq!(repeats.note("timed out"), None);
    }

    #[test]
    fn a_capped_backoff_stops_at_its_cap() {
        let mut b = Backoff::capped(Duration::from_secs(2));
        let delays: Vec<_> = (0..6).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, [200, 400, 800, 1600, 2000, 2000]);
    }
}
