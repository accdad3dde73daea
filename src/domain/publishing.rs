//! The publish protocol: what each message is chained to, what JetStream's answer to it
//! means, when an attempt must end, and which WAL position may be confirmed.
//!
//! Pure: the pipeline feeds it events (a row decoded, a message sent, JetStream's answer, a
//! commit, a keepalive) and does what it answers (skip the row, publish with this guard,
//! end the attempt, confirm this LSN). Model-checked against a model of JetStream in
//! `publishing/model.rs`.
//!
//! # The chain
//! A message may be stored only directly behind its predecessor in commit order, whichever
//! connection, attempt or process wrote either of them. A paused server executes what was
//! already in its sockets, so a connection pgoutbox gave up on can still write after the
//! next attempt read the stream's tail, after it published the same rows again, or never.
//! Each message therefore names its predecessor, and the place it expects it at:
//! - the first message of an attempt carries `Nats-Expected-Last-Sequence` = the sequence of
//!   the stream's tail that the attempt read and skipped through (the *anchor*), and
//!   `Pgoutbox-Chain: anchor`;
//! - every later one carries `Nats-Expected-Last-Msg-Id` = the `Nats-Msg-Id` of the message
//!   sent before it, and `Nats-Expected-Last-Sequence` = the sequence that message takes
//!   when everything sent before it is stored.
//!
//! Either guard alone loses rows. A sequence alone names a place computed by each writer on
//! its own: two attempts that learned of a duplicate at different moments compute different
//! places for the same row, and a late write lands in a hole (issue 21's lost rows). An id
//! alone is ambiguous once ids repeat: behind a row whose id an older message has (a table
//! truncated with its sequence restarted), the next row's guard also matches that older
//! message, and it was stored behind the refused duplicates (issue 28, F1). Both together
//! hold a message to one place behind one predecessor. The anchor is a sequence only
//! because the server forgets the last message id when it restarts.
//!
//! # The send window
//! A message answered as a duplicate takes no place, so everything in flight behind it is
//! refused and the attempt ends. After such an answer the protocol sends one message at a
//! time ([`Publishing::send_limit`]) until [`CALM`] messages in a row were stored, then
//! grows the window by one per message stored (doubling each round trip, as TCP's slow
//! start): alone in flight, a collision's dead letter goes in its place at once and the
//! attempt goes on, so a run of reused ids costs round trips, not reconnections.
//!
//! # Answers
//! - stored: in place behind its predecessor;
//! - duplicate at the sequence just behind the last message known in place: the message is
//!   already in place (an abandoned connection's copy landed first);
//! - duplicate at sequence 0: the id is staged by a replicated stream's leader but the
//!   message is not known to be stored (nats-server 2.10 with R3): end the attempt;
//! - duplicate elsewhere: an older message has this id. The caller reads that message and
//!   says whether it is this very row ([`Publishing::on_duplicate_origin`]):
//!   - a replay (a tail that could not be skipped by): the row is in the stream and takes no
//!     place; the rows behind it, chained to its id, are stored only if that older message
//!     is the stream's last, else refused, which ends the attempt; the next attempt skips the
//!     duplicate (see [`Duplicates`]) and anchors behind the tail;
//!   - another row with the same id (a table truncated with its sequence restarted, a
//!     restored backup): a collision, not a publish. Alone in flight, the caller publishes
//!     the row's dead letter in its place at once ([`Outcome::Collision`]); else the attempt
//!     ends, nothing past the row is confirmed, and the dead letter goes first next time;
//! - refused or unanswered: end the attempt; nothing past it was confirmed, so the slot
//!   sends it again.
//!
//! # The tail skip
//! Rows at or before the stream's tail are skipped, but when the slot sends the tail's own
//! row again, the skip holds only once that row arrives where the tail says, with its id.
//! Until then nothing is confirmed; a later row, a later commit or a keepalive past the
//! tail's commit first means the server's WAL is another history with the same system id
//! and timeline (a restored volume snapshot): [`TailNotInWal`] ends the attempt, and the
//! next one skips nothing.

use std::collections::{HashSet, VecDeque};

use crate::domain::progress::{LsnTracker, Position, Timing};
use crate::domain::source::TailRow;
use crate::domain::transaction::END_ID_PREFIX;

/// Header carrying the anchor's guard: the stream's last sequence.
pub const EXPECTED_LAST_SEQUENCE_HEADER: &str = "Nats-Expected-Last-Sequence";
/// Header carrying every later message's guard: its predecessor's `Nats-Msg-Id`.
pub const EXPECTED_LAST_MSG_ID_HEADER: &str = "Nats-Expected-Last-Msg-Id";
/// Marks the first message of an attempt: with the id guard of every other message, it
/// shows that a tail was written under this protocol, so no gap can lie before it.
pub const CHAIN_HEADER: &str = "Pgoutbox-Chain";
pub const CHAIN_ANCHOR: &str = "anchor";

/// What a message is chained to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guard<'a> {
    /// Stored only if the stream's last sequence is this one.
    pub last_sequence: u64,
    /// Stored only if the stream's last message has this `Nats-Msg-Id`; `None` for the
    /// anchor.
    pub last_msg_id: Option<&'a str>,
}

impl Guard<'_> {
    /// How many bytes its header lines take, at most.
    pub fn header_bytes(&self) -> usize {
        let id = self.last_msg_id.map_or(CHAIN_HEADER.len() + CHAIN_ANCHOR.len(), str::len);
        EXPECTED_LAST_SEQUENCE_HEADER.len() + 20 + EXPECTED_LAST_MSG_ID_HEADER.len() + id + 8
    }
}

/// JetStream's answer to one publish, or the lack of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Stored {
        sequence: u64,
    },
    Duplicate {
        sequence: u64,
    },
    /// Refused, timed out, or lost with its connection.
    NotStored,
    /// Refused because JetStream holds the id for a publish that is in process or was
    /// refused on a replicated stream: "duplicate, sequence 0" (nats-server 2.10) or
    /// [`DUPLICATE_IN_PROCESS`] (2.11, 2.12+). The id is let go when the duplicate window
    /// ends; until then a message behind it that reuses it would stage it again.
    Staged,
}

/// `JSStreamDuplicateMessageConflict`: a message with this id is still being processed,
/// or was refused after its id was staged (nats-server 2.11, 2.12+ replicated streams).
pub const DUPLICATE_IN_PROCESS: u64 = 10158;

impl Answer {
    /// An ack `{"seq":…,"duplicate":…}`.
    pub fn acked(sequence: u64, duplicate: bool) -> Answer {
        match (sequence, duplicate) {
            // nats-server 2.10 on a replicated stream: the id is staged.
            (0, true) => Answer::Staged,
            (0, false) => Answer::NotStored,
            (sequence, false) => Answer::Stored { sequence },
            (sequence, true) => Answer::Duplicate { sequence },
        }
    }

    /// A publish refused with the API error `code`, or not answered (`None`).
    pub fn refused(code: Option<u64>) -> Answer {
        match code {
            Some(DUPLICATE_IN_PROCESS) => Answer::Staged,
            _ => Answer::NotStored,
        }
    }
}

/// What an answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Stored,
    /// An abandoned connection's copy of this message was stored in its place first.
    AlreadyInPlace,
    /// An older message with this id is in the stream at `sequence`: read it, and tell
    /// [`Publishing::on_duplicate_origin`] whether it is this row. Nothing counted yet.
    CheckDuplicate {
        sequence: u64,
    },
    /// The older message with this id is this very row, stored before: it took no place.
    Replayed,
    /// The older message with this id is another row's, and nothing else is in flight: the
    /// caller sends the row's dead letter next, in its place ([`Publishing::on_sent`] takes
    /// it as the row's message, answered by the letter's answer).
    Collision,
    /// The message is not known to be stored: the attempt must end.
    EndAttempt,
}

impl Outcome {
    /// Whether the message counts as published: everything before it may be confirmed.
    pub fn is_done(self) -> bool {
        matches!(self, Outcome::Stored | Outcome::AlreadyInPlace | Outcome::Replayed)
    }
}

/// Rows JetStream answered as duplicates elsewhere: the next attempt skips them, so that the
/// rows behind one are anchored behind the stream's tail instead of chained to its id. Kept
/// across attempts; capped, since forgetting one costs one attempt, never a row.
#[derive(Debug, Default, Clone)]
pub struct Duplicates(HashSet<Position>);

impl Duplicates {
    const MAX: usize = 65_536;

    fn insert(&mut self, position: Position) {
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        self.0.insert(position);
    }

    /// Positions below the slot's start are never decoded again. A seed's rows (commit LSN
    /// 0, read from the table's snapshot, `service::seed`) are read again by every attempt
    /// of the seed.
    fn forget_below(&mut self, lsn: u64) {
        self.0.retain(|position| position.commit_lsn == 0 || position.commit_lsn >= lsn);
    }

    /// Forgets the seed's rows: a new snapshot numbers its rows anew.
    pub fn forget_seed(&mut self) {
        self.0.retain(|position| position.commit_lsn != 0);
    }
}

/// What one attempt hands the next.
#[derive(Debug, Clone)]
pub struct Carried {
    pub duplicates: Duplicates,
    /// The send window: an attempt ended by a duplicate starts the next one at one.
    pub send_limit: usize,
}

impl Default for Carried {
    fn default() -> Carried {
        Carried { duplicates: Duplicates::default(), send_limit: usize::MAX }
    }
}

/// Where an attempt starts: the slot's confirmed position and the stream's tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// The slot's `confirmed_flush_lsn`.
    pub lsn: u64,
    /// The stream's last sequence when the attempt began: the anchor's guard.
    pub stream_sequence: u64,
    /// Rows at or before this row's position are in the stream already
    /// (`source::judge_tail`).
    pub skip_through: Option<TailRow>,
}

/// What to do with a decoded row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowStep {
    Publish,
    /// The stream holds it already.
    Skip,
}

/// The slot went past the stream's tail without sending the tail's row: this server's WAL
/// is another history than the one the stream was written from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the stream's last message ({tail}) is not in this server's WAL: the database was \
     restored from an older copy (a volume snapshot, a cold backup); nothing is skipped on \
     the next try"
)]
pub struct TailNotInWal {
    pub tail: TailRow,
}

/// One attempt's publish protocol.
#[derive(Debug, Clone)]
pub struct Publishing {
    tracker: LsnTracker,
    skip_through: Option<Position>,
    /// The tail is a transaction's end message, not a row.
    tail_is_end: bool,
    /// The tail's row, while the slot has yet to send it again: nothing is confirmed.
    unverified: Option<TailRow>,
    duplicates: Duplicates,
    /// The sequence of the last message known to be in place: the anchor's at first.
    stream_end: u64,
    /// Its `Nats-Msg-Id`; `None` while that is the anchor.
    in_place_id: Option<String>,
    /// The ids of the messages in flight, oldest first.
    in_flight_ids: VecDeque<String>,
    /// A collision's dead letter is sent next, in the row's place.
    replacing: bool,
    /// How many messages may be in flight (see "The send window").
    send_limit: usize,
    /// Messages stored since the last duplicate answer: the window grows after [`CALM`].
    calm: usize,
}

/// Messages stored in a row after a duplicate before the window grows again: collisions
/// come in runs (a truncated table's ids, reused one after another), and a dead letter
/// stored between two of them must not open the window to the next.
const CALM: usize = 16;

impl Publishing {
    pub fn new(start: Start, carried: Carried) -> Publishing {
        let Carried { mut duplicates, send_limit } = carried;
        duplicates.forget_below(start.lsn);
        // A tail committed before the slot's position is never sent again, and every row
        // that is lies past it: nothing is skipped, nothing to check.
        let unverified = start.skip_through.filter(|tail| tail.position.commit_lsn >= start.lsn);
        Publishing {
            tracker: LsnTracker::new(start.lsn),
            skip_through: unverified.as_ref().map(|tail| tail.position),
            tail_is_end: unverified
                .as_ref()
                .is_some_and(|tail| tail.msg_id.starts_with(END_ID_PREFIX)),
            unverified,
            duplicates,
            stream_end: start.stream_sequence,
            in_place_id: None,
            in_flight_ids: VecDeque::new(),
            replacing: false,
            send_limit,
            calm: 0,
        }
    }

    /// The row at `position`, whose id column reads `row_id`, was decoded.
    pub fn on_row(
        &mut self,
        position: Position,
        row_id: Option<&str>,
    ) -> Result<RowStep, TailNotInWal> {
        if let Some(tail) = &self.unverified {
            if position > tail.position || (position == tail.position && !tail.is_row(row_id)) {
                return Err(TailNotInWal { tail: tail.clone() });
            }
            if position == tail.position {
                self.unverified = None;
            }
        }
        let skipped = self.skip_through.is_some_and(|last| position <= last)
            || self.duplicates.0.contains(&position);
        Ok(if skipped { RowStep::Skip } else { RowStep::Publish })
    }

    /// Whether this attempt skips some of the rows of the transaction committed at
    /// `commit_lsn` and publishes the rest: the stream's tail is a row of it, not its end
    /// (`--transaction-subject`), after which the whole transaction is skipped.
    pub fn skips_part_of(&self, commit_lsn: u64) -> bool {
        self.skip_through.is_some_and(|last| last.commit_lsn == commit_lsn) && !self.tail_is_end
    }

    /// The guard to publish the next message with.
    pub fn guard(&self) -> Guard<'_> {
        let previous = self.in_flight_ids.back().or(self.in_place_id.as_ref());
        Guard {
            last_sequence: self.stream_end + self.in_flight_ids.len() as u64,
            last_msg_id: previous.map(String::as_str),
        }
    }

    /// How many messages may be in flight now.
    pub fn send_limit(&self) -> usize {
        self.send_limit
    }

    /// The message with `Nats-Msg-Id` `id` was handed to JetStream with [`Self::guard`];
    /// the next one is chained to it.
    pub fn on_sent(&mut self, id: String) {
        if !std::mem::take(&mut self.replacing) {
            self.tracker.on_sent();
        }
        self.in_flight_ids.push_back(id);
    }

    /// JetStream's answer to the oldest message in flight.
    pub fn on_answer(&mut self, answer: Answer) -> Outcome {
        let outcome = match answer {
            Answer::Stored { sequence } => {
                self.stream_end = sequence;
                self.calm += 1;
                if self.calm > CALM {
                    self.send_limit = self.send_limit.saturating_add(1);
                }
                Outcome::Stored
            }
            Answer::Duplicate { sequence } if sequence == self.stream_end + 1 => {
                self.stream_end = sequence;
                Outcome::AlreadyInPlace
            }
            Answer::Staged => {
                // A replicated stream holds the id staged for a refused publish until the
                // duplicate window ends; a message behind it that is refused too stages its
                // own id again, each attempt: one at a time.
                self.send_limit = 1;
                self.calm = 0;
                Outcome::EndAttempt
            }
            Answer::NotStored => Outcome::EndAttempt,
            Answer::Duplicate { sequence } => Outcome::CheckDuplicate { sequence },
        };
        if outcome.is_done() {
            self.in_place_id = self.in_flight_ids.pop_front();
            self.tracker.on_acked();
        }
        outcome
    }

    /// After [`Outcome::CheckDuplicate`] for the oldest message, the row at `position`:
    /// whether the older message with its id was written from this very position of this
    /// source (a replay, which takes no place) or by another row (a collision).
    pub fn on_duplicate_origin(&mut self, position: Position, same_row: bool) -> Outcome {
        // Whatever is in flight behind it expects it in place, and is refused.
        self.send_limit = 1;
        self.calm = 0;
        let alone = self.in_flight_ids.len() == 1;
        if same_row {
            self.duplicates.insert(position);
            self.in_flight_ids.pop_front();
            self.tracker.on_acked();
            return Outcome::Replayed;
        }
        if !alone {
            return Outcome::EndAttempt;
        }
        self.in_flight_ids.pop_front();
        self.replacing = true;
        Outcome::Collision
    }

    /// A transaction ended at `end_lsn`.
    pub fn on_commit(&mut self, end_lsn: u64, timing: Timing) -> Result<(), TailNotInWal> {
        self.past_unverified_tail(end_lsn)?;
        if self.unverified.is_none() {
            self.tracker.on_commit(end_lsn, timing);
        }
        Ok(())
    }

    /// The server's WAL end, outside a transaction.
    pub fn on_keepalive(&mut self, wal_end: u64) -> Result<(), TailNotInWal> {
        self.past_unverified_tail(wal_end)?;
        if self.unverified.is_none() {
            self.tracker.on_keepalive(wal_end);
        }
        Ok(())
    }

    /// Decoding reached `lsn`: past the tail's commit, its row should have come.
    fn past_unverified_tail(&self, lsn: u64) -> Result<(), TailNotInWal> {
        match &self.unverified {
            Some(tail) if lsn > tail.position.commit_lsn => {
                Err(TailNotInWal { tail: tail.clone() })
            }
            _ => Ok(()),
        }
    }

    /// The position that is safe to confirm to Postgres.
    pub fn confirmed(&self) -> u64 {
        self.tracker.confirmed()
    }

    pub fn in_flight(&self) -> u64 {
        self.tracker.in_flight()
    }

    /// The timings of the transactions that became confirmable since the last call.
    pub fn take_confirmed_timings(&mut self) -> std::vec::Drain<'_, Timing> {
        self.tracker.take_confirmed_timings()
    }

    /// What the next attempt must know, taken when this one ends.
    pub fn take_carried(&mut self) -> Carried {
        let duplicates = std::mem::take(&mut self.duplicates);
        Carried { duplicates, send_limit: self.send_limit }
    }
}

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests;
