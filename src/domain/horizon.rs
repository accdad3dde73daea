//! The durability horizon (`--durability-horizon`): the slot's confirmed position trails
//! what JetStream acknowledged by as long as the stream may still lose an acknowledged
//! write.
//!
//! An acknowledgement is not durability: nats-server syncs its file store every 2 minutes
//! by default, so a power loss (a host crash, a disk that drops unsynced writes) loses what
//! it acknowledged since. Once the slot confirmed past a message, the WAL that holds it may
//! be recycled, and a message the server then forgets is gone from both places. Held back
//! by the horizon, the slot still has it: the next attempt re-reads it, skips what the
//! stream's tail shows stored (`domain::source`), and publishes what the server forgot, in
//! commit order. Emitted events have no table row, so only this brings them back.
//!
//! Time alone does not make an acknowledgement durable: a server that restarted (a power
//! loss) while pgoutbox was paused, or while an attempt was busy elsewhere, lost what it had
//! not synced, however old pgoutbox's clock says the acknowledgement is. So a position is
//! released only once the stream was seen, by a request sent at least the horizon after the
//! acknowledgement the position rests on, still holding that acknowledged message
//! ([`Horizon::due`] says which message to look for, [`Horizon::vouched`] records the
//! answer): a server that holds a message it stored a horizon earlier has synced it.
//!
//! A keepalive's position, confirmable only when nothing is in flight, rests on the last
//! acknowledgement before it, so an idle outbox does not pin WAL for longer than the
//! horizon (and one look at the stream) after its last message. The positions waiting are
//! kept at most one per [`GRAIN`], so memory stays bounded whatever the rate.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use crate::domain::progress::Position;

/// Positions acknowledged within this of each other wait as one.
pub const GRAIN: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub struct Horizon {
    span: Duration,
    /// Confirmable positions not yet released, oldest first; all fields only grow along
    /// the queue.
    held: VecDeque<Held>,
    released: u64,
    /// The newest message the stream was seen holding, and when that look was asked for.
    vouched: Option<(Stored, Instant)>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    lsn: u64,
    /// The newest acknowledgement the position rests on, and when it came.
    acked_at: Instant,
    /// `None` before this attempt's first acknowledgement: the position rests on what the
    /// attempt's start found in the stream, and waits by time alone.
    stored: Option<Stored>,
}

impl Horizon {
    /// A horizon of `span` (zero: every confirmable position is released at once) over a
    /// slot confirmed up to `start`.
    pub fn new(span: Duration, start: u64) -> Horizon {
        Horizon { span, held: VecDeque::new(), released: start, vouched: None }
    }

    /// The same horizon for an attempt that starts from the slot at `start`: positions up to
    /// it are confirmed; those beyond still wait on the acknowledgements they rest on.
    pub fn resumed_at(mut self, start: u64) -> Horizon {
        self.held.retain(|held| held.lsn > start);
        self.released = self.released.max(start);
        self
    }

    /// `confirmable` may be confirmed once the stream no longer may lose the acknowledgement
    /// of `acked_at` (the newest it rests on, of the message `stored`).
    pub fn offer(&mut self, confirmable: u64, acked_at: Instant, stored: Option<Stored>) {
        let newest = self.held.back().map_or(self.released, |held| held.lsn);
        if confirmable <= newest {
            return;
        }
        match self.held.back_mut() {
            Some(held) if acked_at.saturating_duration_since(held.acked_at) < GRAIN => {
                held.lsn = confirmable;
                held.acked_at = held.acked_at.max(acked_at);
                held.stored = newer(held.stored, stored);
            }
            _ => {
                let last = self.held.back().copied();
                let acked_at = last.map_or(acked_at, |held| held.acked_at.max(acked_at));
                let stored = newer(last.and_then(|held| held.stored), stored);
                self.held.push_back(Held { lsn: confirmable, acked_at, stored });
            }
        }
    }

    /// The message to look for in the stream, with a request sent from now on, before
    /// more can be released: the newest one a waiting position rests on that is older than
    /// the horizon at `now`. `None` when there is nothing to look for.
    pub fn due(&self, now: Instant) -> Option<Stored> {
        if self.span.is_zero() {
            return None;
        }
        let ripe = self.held.iter().take_while(|held| now >= held.acked_at + self.span);
        let newest = ripe.filter(|held| held.stored.is_some()).last()?;
        let stored = newest.stored?;
        (!self.covers(stored, newest.acked_at)).then_some(stored)
    }

    /// Whether what the stream was seen holding vouches for `stored`, acknowledged at
    /// `acked_at`.
    fn covers(&self, stored: Stored, acked_at: Instant) -> bool {
        self.vouched.is_some_and(|(vouched, asked_at)| {
            vouched.sequence >= stored.sequence && asked_at >= acked_at + self.span
        })
    }

    /// A request sent at `asked_at` found `stored` still in the stream.
    pub fn vouched(&mut self, stored: Stored, asked_at: Instant) {
        if self.vouched.is_none_or(|(vouched, _)| stored.sequence >= vouched.sequence) {
            self.vouched = Some((stored, asked_at));
        }
    }

    /// The furthest position that may be confirmed at `now`.
    pub fn release(&mut self, now: Instant) -> u64 {
        while let Some(&held) = self.held.front() {
            let durable = self.span.is_zero()
                || match held.stored {
                    None => now >= held.acked_at + self.span,
                    Some(stored) => self.covers(stored, held.acked_at),
                };
            if !durable {
                break;
            }
            self.released = held.lsn;
            self.held.pop_front();
        }
        self.released
    }

    /// How many positions wait (for tests of the bound).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.held.len()
    }
}

/// The later of two acknowledged messages.
fn newer(a: Option<Stored>, b: Option<Stored>) -> Option<Stored> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.sequence >= a.sequence { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// The last message JetStream acknowledged as stored, as this process saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub sequence: u64,
    pub position: Position,
}

/// A stream found shorter than what it acknowledged: the server forgot a suffix (a power
/// loss, a restore).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forgotten {
    pub stored: Stored,
    pub tail_sequence: u64,
    /// The position of the stream's last message now, if it has one of ours.
    pub tail_position: Option<Position>,
    /// Where the slot resumes.
    pub slot: u64,
}

impl Forgotten {
    /// Whether the stream that ends at `tail_sequence` (its last message at
    /// `tail_position`) forgot what was `stored`, as the slot confirmed up to `slot` finds it.
    pub fn judge(
        stored: Stored,
        tail_sequence: u64,
        tail_position: Option<Position>,
        slot: u64,
    ) -> Option<Forgotten> {
        (tail_sequence < stored.sequence).then_some(Forgotten {
            stored,
            tail_sequence,
            tail_position,
            slot,
        })
    }

    /// How many messages the stream forgot.
    pub fn lost(&self) -> u64 {
        self.stored.sequence - self.tail_sequence
    }

    /// Whether the slot sends them again: it resumes at or before the stream's last
    /// message's commit, so every message after that one is read again. A stream that lost
    /// every message of ours is refilled when the slot resumes at or before the last one
    /// acknowledged: behind the horizon, the slot never passed a message not yet synced.
    pub fn refilled(&self) -> bool {
        let kept = self.tail_position.unwrap_or(self.stored.position);
        self.slot <= kept.commit_lsn
    }
}

impl fmt::Display for Forgotten {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lsn = |l: u64| tokio_postgres::types::PgLsn::from(l);
        let tail = self.tail_position.map_or("none of ours".to_owned(), |p| p.to_string());
        write!(
            f,
            "the stream lost acknowledged events: it ends at sequence {} (position {tail}), and \
             had stored up to sequence {} (position {}): {} lost; ",
            self.tail_sequence,
            self.stored.sequence,
            self.stored.position,
            self.lost()
        )?;
        match self.refilled() {
            true => write!(
                f,
                "the slot still holds them (it resumes at {}): they are published again, in \
                 order",
                lsn(self.slot)
            ),
            false => write!(
                f,
                "the slot confirmed {} past them, so the WAL cannot bring them back: rows of \
                 the outbox table come back with `pgoutbox run --recover` (stopped first), \
                 which seeds them from the table, or `pgoutbox verify --replay-missing`; set \
                 --durability-horizon to the server's sync interval so that the slot keeps \
                 them",
                lsn(self.slot)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn at(commit_lsn: u64, index: u32) -> Position {
        Position { commit_lsn, index }
    }

    #[test]
    fn a_shorter_stream_is_judged_refilled_when_the_slot_is_behind_its_tail() {
        let stored = Stored { sequence: 1_000, position: at(0x9000, 0) };
        assert_eq!(Forgotten::judge(stored, 1_000, Some(at(0x9000, 0)), 0x9100), None);
        let held = Forgotten::judge(stored, 600, Some(at(0x6000, 0)), 0x5000).unwrap();
        assert!(held.refilled() && held.lost() == 400);
        assert!(held.to_string().contains("published again"), "{held}");
        let gone = Forgotten::judge(stored, 600, Some(at(0x6000, 0)), 0x9100).unwrap();
        assert!(!gone.refilled());
        assert!(gone.to_string().contains("--durability-horizon"), "{gone}");
        let emptied = Forgotten::judge(stored, 0, None, 0x5000).unwrap();
        assert!(emptied.refilled() && emptied.lost() == 1_000);
        let emptied_past = Forgotten::judge(stored, 0, None, 0x9100).unwrap();
        assert!(!emptied_past.refilled());
    }

    /// The message of sequence `n`.
    fn message(n: u64) -> Option<Stored> {
        Some(Stored { sequence: n, position: at(n, 0) })
    }

    #[test]
    fn no_horizon_releases_at_once() {
        let now = Instant::now();
        let mut horizon = Horizon::new(Duration::ZERO, 10);
        horizon.offer(20, now, message(1));
        assert_eq!(horizon.due(now), None);
        assert_eq!(horizon.release(now), 20);
    }

    #[test]
    fn a_position_waits_until_the_stream_is_seen_holding_its_ack_a_horizon_later() {
        let t0 = Instant::now();
        let secs = |s| t0 + Duration::from_secs(s);
        let span = Duration::from_secs(120);
        let mut horizon = Horizon::new(span, 10);
        horizon.offer(20, t0, message(1));
        horizon.offer(30, secs(60), message(2));
        assert_eq!(horizon.due(secs(119)), None);
        assert_eq!(horizon.release(secs(119)), 10);
        // Old enough, but nobody looked: time alone releases nothing.
        assert_eq!(horizon.release(secs(500)), 10);
        assert_eq!(horizon.due(secs(120)), message(1));
        // A look asked for before the horizon passed vouches for nothing.
        horizon.vouched(message(1).unwrap(), secs(119));
        assert_eq!(horizon.release(secs(500)), 10);
        horizon.vouched(message(1).unwrap(), secs(120));
        assert_eq!(horizon.release(secs(120)), 20);
        assert_eq!(horizon.due(secs(179)), None);
        assert_eq!(horizon.due(secs(180)), message(2));
        horizon.vouched(message(2).unwrap(), secs(181));
        assert_eq!(horizon.release(secs(181)), 30);
    }

    #[test]
    fn an_idle_keepalive_after_an_old_ack_is_released_with_the_next_look() {
        let t0 = Instant::now();
        let mut horizon = Horizon::new(Duration::from_secs(120), 10);
        horizon.offer(20, t0, message(1));
        let later = t0 + Duration::from_secs(600);
        horizon.offer(900, t0, message(1)); // a keepalive, nothing acknowledged since t0
        assert_eq!(horizon.due(later), message(1));
        horizon.vouched(message(1).unwrap(), later);
        assert_eq!(horizon.release(later), 900);
        horizon.offer(950, t0, message(1)); // the next keepalive needs no other look
        assert_eq!(horizon.due(later), None);
        assert_eq!(horizon.release(later), 950);
    }

    #[test]
    fn a_horizon_resumed_by_the_next_attempt_keeps_what_waits_beyond_its_start() {
        let t0 = Instant::now();
        let span = Duration::from_secs(10);
        let mut horizon = Horizon::new(span, 10);
        horizon.offer(20, t0, message(1));
        horizon.offer(30, t0 + Duration::from_secs(5), message(2));
        let mut horizon = horizon.resumed_at(20);
        assert_eq!(horizon.release(t0), 20);
        let later = t0 + Duration::from_secs(15);
        assert_eq!(horizon.due(later), message(2));
        horizon.vouched(message(2).unwrap(), later);
        assert_eq!(horizon.release(later), 30);
    }

    #[test]
    fn before_the_first_ack_a_position_waits_by_time_alone() {
        let t0 = Instant::now();
        let mut horizon = Horizon::new(Duration::from_secs(120), 10);
        horizon.offer(20, t0, None);
        assert_eq!(horizon.due(t0 + Duration::from_secs(120)), None);
        assert_eq!(horizon.release(t0 + Duration::from_secs(119)), 10);
        assert_eq!(horizon.release(t0 + Duration::from_secs(120)), 20);
    }

    #[test]
    fn positions_within_a_grain_wait_as_one() {
        let t0 = Instant::now();
        let mut horizon = Horizon::new(Duration::from_secs(120), 0);
        for i in 1..=1_000u64 {
            horizon.offer(i, t0 + Duration::from_millis(i), message(i));
        }
        assert!(horizon.waiting() <= 11, "{}", horizon.waiting());
    }

    /// What the property test below does at each step.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// A message published and acknowledged.
        Publish,
        /// A keepalive: confirmable without a new acknowledgement.
        Keepalive,
        /// The message [`Horizon::due`] names looked for in the stream.
        Look,
        /// The server loses power and restarts with what it synced.
        PowerLoss,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => Just(Step::Publish),
            1 => Just(Step::Keepalive),
            3 => Just(Step::Look),
            1 => Just(Step::PowerLoss),
        ]
    }

    proptest! {
        /// A server that syncs at least once a horizon and loses power at any moment, and a
        /// pgoutbox that may be paused for any time between any two steps (the gaps): no
        /// position is ever released past a message the server lost, before or after the
        /// loss; what is released never goes back, and once the stream is looked at a
        /// horizon after the last acknowledgement, everything offered is released.
        #[test]
        fn nothing_the_server_forgets_is_released(
            steps in proptest::collection::vec((step(), 0u64..3_000), 1..80),
            span_ms in 1u64..2_000,
            sync_fraction in 1u64..=100,
        ) {
            let t0 = Instant::now();
            let ms = |n: u64| t0 + Duration::from_millis(n);
            let sync_every = (span_ms * sync_fraction / 100).max(1);
            let mut horizon = Horizon::new(Duration::from_millis(span_ms), 0);
            // The server: each message's sequence (= position) and when it was stored.
            let mut server: Vec<(u64, u64)> = Vec::new();
            let (mut now, mut sequence, mut released) = (0u64, 0u64, 0u64);
            let mut lost_from: Option<u64> = None;
            let mut last_ack: Option<(u64, u64)> = None;
            for (step, gap) in steps {
                now += gap;
                match step {
                    // After a loss the chain guard refuses every publish of this attempt.
                    Step::Publish if lost_from.is_none() => {
                        sequence += 1;
                        server.push((sequence, now));
                        last_ack = Some((sequence, now));
                        horizon.offer(10 * sequence, ms(now), message(sequence));
                    }
                    Step::Publish => {}
                    Step::Keepalive => {
                        if let Some((acked, at)) = last_ack {
                            horizon.offer(10 * sequence + 5, ms(at), message(acked));
                        }
                    }
                    Step::Look => {
                        if let Some(stored) = horizon.due(ms(now))
                            && server.iter().any(|&(n, _)| n == stored.sequence)
                        {
                            horizon.vouched(stored, ms(now));
                        }
                    }
                    Step::PowerLoss => {
                        let synced = now / sync_every * sync_every;
                        if let Some(&(first, _)) = server.iter().find(|&&(_, at)| at > synced) {
                            let first = 10 * first;
                            prop_assert!(first > released, "released {released}, lost from {first}");
                            lost_from = Some(lost_from.map_or(first, |f| f.min(first)));
                        }
                        server.retain(|&(_, at)| at <= synced);
                    }
                }
                let now_released = horizon.release(ms(now));
                prop_assert!(now_released >= released);
                released = now_released;
                if let Some(first) = lost_from {
                    prop_assert!(released < first, "released {released} past lost {first}");
                }
            }
            if lost_from.is_none() && let Some((_, at)) = last_ack {
                let later = at + span_ms;
                if let Some(stored) = horizon.due(ms(later)) {
                    horizon.vouched(stored, ms(later));
                }
                prop_assert!(horizon.release(ms(later)) >= 10 * sequence);
            }
        }
    }
}
