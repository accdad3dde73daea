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

/// The default horizon: nats-server's default `sync_interval` (2 minutes) and 30 s for the
/// pass that syncs. Its timer is re-armed only once a pass ends (`server/filestore.go`,
/// `syncBlocks` → `setSyncTimer`), and a block's write that lands after the pass cleared
/// its flag waits for the next pass: up to the interval plus the length of two passes.
pub const DEFAULT: &str = "150s";

/// Positions acknowledged within this of the first of them wait as one.
pub const GRAIN: Duration = Duration::from_millis(100);

/// The least time between two looks at the stream: a position waits at most this, and a
/// grain, longer than the horizon.
pub const LOOK_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct Horizon {
    span: Duration,
    /// Confirmable positions not yet released, oldest first; all fields only grow along
    /// the queue.
    held: VecDeque<Held>,
    released: u64,
    /// The newest message the stream was seen holding, and when that look was asked for.
    vouched: Option<(Stored, Instant)>,
    /// Whether a position that rests on no acknowledgement waits by time alone: unless the
    /// stream was seen to hold nothing of ours past the slot's start.
    unknown_before_first_ack: bool,
    /// A message that must be vouched for before anything past `.2` is released (a seed's
    /// last row, which the WAL cannot give back), and when it was acknowledged.
    pinned: Option<(Stored, Instant, u64)>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    lsn: u64,
    /// When the first acknowledgement of this grain came: later ones join it only within a
    /// [`GRAIN`] of this, so a writer that never pauses fills a grain and opens the next
    /// instead of keeping one grain's time forever recent (the slot never moved).
    opened_at: Instant,
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
        Horizon {
            span,
            held: VecDeque::new(),
            released: start,
            vouched: None,
            unknown_before_first_ack: true,
            pinned: None,
        }
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
            Some(held) if acked_at.saturating_duration_since(held.opened_at) < GRAIN => {
                held.lsn = confirmable;
                held.acked_at = held.acked_at.max(acked_at);
                held.stored = newer(held.stored, stored);
            }
            _ => {
                let last = self.held.back().copied();
                let acked_at = last.map_or(acked_at, |held| held.acked_at.max(acked_at));
                let stored = newer(last.and_then(|held| held.stored), stored);
                let held = Held { lsn: confirmable, opened_at: acked_at, acked_at, stored };
                self.held.push_back(held);
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
        let held = ripe.filter_map(|held| Some((held.stored?, held.acked_at))).last();
        let pinned = self.pinned.map(|(stored, acked_at, _)| (stored, acked_at));
        let pinned = pinned.filter(|(stored, acked_at)| {
            now >= *acked_at + self.span && !self.covers(*stored, *acked_at)
        });
        let held = held.filter(|(stored, acked_at)| !self.covers(*stored, *acked_at));
        match (held, pinned) {
            (Some(held), Some(pinned)) if pinned.0.sequence > held.0.sequence => Some(pinned.0),
            (held, pinned) => held.or(pinned).map(|(stored, _)| stored),
        }
    }

    /// Holds every position past `at` until `stored`, acknowledged at `acked_at`, is seen in
    /// the stream a horizon later: a seed's last row, whose slot took over at `at` and which
    /// only the table can give back. [`Horizon::pinned`] says what still waits.
    pub fn pin(&mut self, stored: Stored, acked_at: Instant, at: u64) {
        if !self.span.is_zero() {
            self.pinned = Some((stored, acked_at, at));
        }
    }

    /// The pinned message still waiting to be vouched for, when it was acknowledged, and
    /// the position held for it: a loss found now may have taken it.
    pub fn pinned(&self) -> Option<(Stored, Instant, u64)> {
        self.pinned
    }

    /// Whether what the stream was seen holding vouches for `stored`, acknowledged at
    /// `acked_at`.
    fn covers(&self, stored: Stored, acked_at: Instant) -> bool {
        self.vouched.is_some_and(|(vouched, asked_at)| {
            vouched.sequence >= stored.sequence && asked_at >= acked_at + self.span
        })
    }

    /// The stream holds nothing of ours past the slot's start (it is empty, or its last
    /// message of ours is at or before it): a position that rests on no acknowledgement
    /// has nothing the stream could lose, and is released at once.
    pub fn nothing_past_the_start(&mut self) {
        self.unknown_before_first_ack = false;
    }

    /// A request sent at `asked_at` found `stored` still in the stream.
    pub fn vouched(&mut self, stored: Stored, asked_at: Instant) {
        if self.vouched.is_none_or(|(vouched, _)| stored.sequence >= vouched.sequence) {
            self.vouched = Some((stored, asked_at));
        }
    }

    /// The furthest position that may be confirmed at `now`.
    pub fn release(&mut self, now: Instant) -> u64 {
        if let Some((stored, acked_at, at)) = self.pinned {
            if !self.covers(stored, acked_at) {
                return self.release_held(now).min(at);
            }
            self.pinned = None;
        }
        self.release_held(now)
    }

    fn release_held(&mut self, now: Instant) -> u64 {
        while let Some(&held) = self.held.front() {
            let durable = self.span.is_zero()
                || match held.stored {
                    None => !self.unknown_before_first_ack || now >= held.acked_at + self.span,
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

    /// What an operator sees of the wait at `now`: how long the oldest waiting position has
    /// waited, and how long until it is due for the look that releases it (zero once due).
    pub fn oldest_wait(&self, now: Instant) -> Option<(Duration, Duration)> {
        let oldest = self.held.front()?;
        let waited = now.saturating_duration_since(oldest.opened_at);
        Some((waited, (oldest.acked_at + self.span).saturating_duration_since(now)))
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

impl Forgotten {
    /// What was lost, without what comes of it: "the stream lost acknowledged events: …".
    pub fn loss(&self) -> String {
        let tail = self.tail_position.map_or("none of ours".to_owned(), |p| p.to_string());
        format!(
            "the stream lost acknowledged events: it ends at sequence {} (position {tail}), and \
             had stored up to sequence {} (position {}): {} lost",
            self.tail_sequence,
            self.stored.sequence,
            self.stored.position,
            self.lost()
        )
    }
}

impl fmt::Display for Forgotten {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lsn = |l: u64| tokio_postgres::types::PgLsn::from(l);
        write!(f, "{}; ", self.loss())?;
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
mod tests;
