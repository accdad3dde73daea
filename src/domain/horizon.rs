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
//! A position becomes releasable once the newest acknowledgement it rests on is older than
//! the horizon. A keepalive's position, confirmable only when nothing is in flight, rests
//! on the last acknowledgement before it, so an idle outbox does not pin WAL for longer
//! than the horizon after its last message. The positions waiting are kept at most one per
//! [`GRAIN`], so memory stays bounded whatever the rate.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use crate::domain::progress::Position;

/// Positions acknowledged within this of each other wait as one.
pub const GRAIN: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub struct Horizon {
    span: Duration,
    /// Confirmable positions not yet released, oldest first, each with the time of the
    /// newest acknowledgement it rests on; both only grow along the queue.
    held: VecDeque<(u64, Instant)>,
    released: u64,
}

impl Horizon {
    /// A horizon of `span` (zero: every confirmable position is released at once) over a
    /// slot confirmed up to `start`.
    pub fn new(span: Duration, start: u64) -> Horizon {
        Horizon { span, held: VecDeque::new(), released: start }
    }

    /// `confirmable` may be confirmed once the stream no longer may lose the acknowledgement
    /// of `acked_at` (the newest it rests on).
    pub fn offer(&mut self, confirmable: u64, acked_at: Instant) {
        let newest = self.held.back().map_or(self.released, |&(lsn, _)| lsn);
        if confirmable <= newest {
            return;
        }
        match self.held.back_mut() {
            Some((lsn, at)) if acked_at.saturating_duration_since(*at) < GRAIN => {
                *lsn = confirmable;
                *at = (*at).max(acked_at);
            }
            _ => {
                let at = self.held.back().map_or(acked_at, |&(_, at)| at.max(acked_at));
                self.held.push_back((confirmable, at));
            }
        }
    }

    /// The furthest position that may be confirmed at `now`.
    pub fn release(&mut self, now: Instant) -> u64 {
        while let Some(&(lsn, at)) = self.held.front() {
            if now.saturating_duration_since(at) < self.span {
                break;
            }
            self.released = lsn;
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
    /// message's commit, so every message after that one is read again.
    pub fn refilled(&self) -> bool {
        self.tail_position.is_some_and(|tail| self.slot <= tail.commit_lsn)
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
        let empty = Forgotten::judge(stored, 0, None, 0x5000).unwrap();
        assert!(!empty.refilled() && empty.lost() == 1_000);
    }

    #[test]
    fn no_horizon_releases_at_once() {
        let now = Instant::now();
        let mut horizon = Horizon::new(Duration::ZERO, 10);
        horizon.offer(20, now);
        assert_eq!(horizon.release(now), 20);
    }

    #[test]
    fn a_position_waits_until_its_ack_is_older_than_the_horizon() {
        let t0 = Instant::now();
        let span = Duration::from_secs(120);
        let mut horizon = Horizon::new(span, 10);
        horizon.offer(20, t0);
        horizon.offer(30, t0 + Duration::from_secs(60));
        assert_eq!(horizon.release(t0 + Duration::from_secs(119)), 10);
        assert_eq!(horizon.release(t0 + span), 20);
        assert_eq!(horizon.release(t0 + Duration::from_secs(179)), 20);
        assert_eq!(horizon.release(t0 + Duration::from_secs(180)), 30);
    }

    #[test]
    fn an_idle_keepalive_after_an_old_ack_is_released_at_once() {
        let t0 = Instant::now();
        let mut horizon = Horizon::new(Duration::from_secs(120), 10);
        horizon.offer(20, t0);
        let later = t0 + Duration::from_secs(600);
        horizon.offer(900, t0); // a keepalive, nothing acknowledged since t0
        assert_eq!(horizon.release(later), 900);
    }

    #[test]
    fn positions_within_a_grain_wait_as_one() {
        let t0 = Instant::now();
        let mut horizon = Horizon::new(Duration::from_secs(120), 0);
        for i in 1..=1_000u64 {
            horizon.offer(i, t0 + Duration::from_millis(i));
        }
        assert!(horizon.waiting() <= 11, "{}", horizon.waiting());
    }

    proptest! {
        /// Whatever the offers, what is released never goes back, is never a position not
        /// offered, and never one whose acknowledgement is younger than the horizon.
        #[test]
        fn nothing_younger_than_the_horizon_is_released(
            steps in proptest::collection::vec((1u64..50, 0u64..300, 0u64..300), 1..60),
            span_ms in 0u64..2_000,
        ) {
            let t0 = Instant::now();
            let span = Duration::from_millis(span_ms);
            let mut horizon = Horizon::new(span, 0);
            let (mut lsn, mut acked_ms, mut now_ms) = (0u64, 0u64, 0u64);
            let mut offered: Vec<(u64, u64)> = vec![(0, 0)];
            let mut released = 0;
            for (step, ack_step, wait) in steps {
                lsn += step;
                acked_ms += ack_step;
                now_ms = now_ms.max(acked_ms) + wait;
                horizon.offer(lsn, t0 + Duration::from_millis(acked_ms));
                offered.push((lsn, acked_ms));
                let now = horizon.release(t0 + Duration::from_millis(now_ms));
                prop_assert!(now >= released);
                released = now;
                if now == 0 {
                    continue; // where the slot stood
                }
                let (_, acked) = offered.iter().find(|(l, _)| *l == now).copied()
                    .ok_or_else(|| TestCaseError::fail("released a position never offered"))?;
                // Coalesced positions take the newest ack of their grain: never younger.
                prop_assert!(now_ms >= acked + span_ms, "released {} acked {} at {}", now, acked, now_ms);
            }
        }
    }
}
