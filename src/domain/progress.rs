//! Which WAL position may be confirmed to Postgres: the heart of "nothing is ever lost".
//!
//! Messages are published in commit order and their acks are consumed in the same order, so
//! counting is enough: a transaction may be confirmed once every message sent up to its
//! Commit has been acknowledged by JetStream. The tracker never moves backwards and never
//! passes a commit whose messages are still in flight.
//!
//! A keepalive's WAL end may be confirmed only when nothing at all is waiting: any
//! transaction that commits later has a commit LSN beyond it and is still decoded after a
//! restart. This is what stops an idle outbox from pinning WAL on a busy primary.

use std::collections::VecDeque;

/// When a transaction committed and when its Commit reached pgoutbox, in µs since
/// 2000-01-01 (Postgres's epoch): with the time of the ack they give the latency stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub committed: i64,
    pub received: i64,
}

#[derive(Debug, Default, Clone)]
pub struct LsnTracker {
    sent: u64,
    acked: u64,
    /// Commits not yet confirmable: (messages sent when the commit arrived, end LSN,
    /// timing).
    commits: VecDeque<(u64, u64, Timing)>,
    /// Timings of transactions confirmed since the last `take_confirmed_timings`.
    newly_confirmed: Vec<Timing>,
    confirmed: u64,
}

impl LsnTracker {
    /// Starts from the slot's `confirmed_flush_lsn`.
    pub fn new(confirmed: u64) -> Self {
        LsnTracker { confirmed, ..Default::default() }
    }

    /// One message was handed to JetStream.
    pub fn on_sent(&mut self) {
        self.sent += 1;
    }

    /// The oldest message in flight was acknowledged (acks are consumed in send order).
    pub fn on_acked(&mut self) {
        debug_assert!(self.acked < self.sent, "ack without a send");
        self.acked = (self.acked + 1).min(self.sent);
        self.advance();
    }

    /// A transaction ended at `end_lsn`; it is confirmable once everything sent so far is acked.
    /// `timing` only feeds the latency histograms.
    ///
    /// A commit that sent nothing since the previous waiting one is folded into it, so the
    /// list holds at most one entry per message in flight, however many transactions of
    /// other tables commit while an ack is awaited.
    pub fn on_commit(&mut self, end_lsn: u64, timing: Timing) {
        match self.commits.back_mut() {
            Some(waiting) if waiting.0 == self.sent => {
                // The waiting commit's time is kept: it is the one whose rows are in flight.
                waiting.1 = waiting.1.max(end_lsn);
            }
            _ => self.commits.push_back((self.sent, end_lsn, timing)),
        }
        self.advance();
    }

    /// The timings of the transactions confirmed since the last call.
    pub fn take_confirmed_timings(&mut self) -> std::vec::Drain<'_, Timing> {
        self.newly_confirmed.drain(..)
    }

    /// The server reported its WAL end; usable only when nothing waits for an ack.
    /// The caller must not call this inside a transaction.
    pub fn on_keepalive(&mut self, wal_end: u64) {
        if self.is_idle() {
            self.confirmed = self.confirmed.max(wal_end);
        }
    }

    /// Nothing in flight and no commit waiting.
    pub fn is_idle(&self) -> bool {
        self.sent == self.acked && self.commits.is_empty()
    }

    pub fn in_flight(&self) -> u64 {
        self.sent - self.acked
    }

    /// The position that is safe to report as flushed.
    pub fn confirmed(&self) -> u64 {
        self.confirmed
    }

    fn advance(&mut self) {
        while let Some(&(sent_before, end_lsn, timing)) = self.commits.front() {
            if sent_before > self.acked {
                break;
            }
            self.confirmed = self.confirmed.max(end_lsn);
            self.newly_confirmed.push(timing);
            self.commits.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(committed: i64) -> Timing {
        Timing { committed, received: committed }
    }

    #[test]
    fn a_transaction_is_confirmed_only_after_its_last_ack() {
        let mut t = LsnTracker::new(100);
        t.on_sent();
        t.on_sent();
        t.on_commit(200, at(0));
        assert_eq!(t.confirmed(), 100);
        t.on_acked();
        assert_eq!(t.confirmed(), 100, "one of two messages is still in flight");
        t.on_acked();
        assert_eq!(t.confirmed(), 200);
        assert!(t.is_idle());
    }

    #[test]
    fn commits_are_confirmed_in_order_as_acks_arrive() {
        let mut t = LsnTracker::new(0);
        t.on_sent();
        t.on_commit(10, at(0));
        t.on_sent();
        t.on_sent();
        t.on_commit(20, at(0));
        t.on_sent();
        t.on_commit(30, at(0));
        t.on_acked();
        assert_eq!(t.confirmed(), 10);
        t.on_acked();
        assert_eq!(t.confirmed(), 10);
        t.on_acked();
        assert_eq!(t.confirmed(), 20);
        t.on_acked();
        assert_eq!(t.confirmed(), 30);
    }

    #[test]
    fn a_commit_with_no_messages_waits_for_earlier_acks() {
        let mut t = LsnTracker::new(0);
        t.on_sent();
        t.on_commit(10, at(0));
        t.on_commit(20, at(0));
        assert_eq!(t.confirmed(), 0);
        t.on_acked();
        assert_eq!(t.confirmed(), 20);
    }

    #[test]
    fn an_empty_commit_with_nothing_in_flight_is_confirmed_at_once() {
        let mut t = LsnTracker::new(5);
        t.on_commit(10, at(0));
        assert_eq!(t.confirmed(), 10);
    }

    #[test]
    fn keepalive_is_ignored_while_acks_are_pending() {
        let mut t = LsnTracker::new(0);
        t.on_sent();
        t.on_commit(10, at(0));
        t.on_keepalive(500);
        assert_eq!(t.confirmed(), 0);
        t.on_acked();
        assert_eq!(t.confirmed(), 10);
        t.on_keepalive(500);
        assert_eq!(t.confirmed(), 500);
    }

    #[test]
    fn keepalive_is_ignored_while_a_transaction_has_unacked_messages_and_no_commit() {
        let mut t = LsnTracker::new(0);
        t.on_sent();
        t.on_keepalive(500);
        assert_eq!(t.confirmed(), 0);
    }

    #[test]
    fn reports_the_commit_times_of_confirmed_transactions_once() {
        let mut t = LsnTracker::new(0);
        t.on_sent();
        t.on_commit(10, at(111));
        t.on_sent();
        t.on_commit(20, at(222));
        assert_eq!(t.take_confirmed_timings().count(), 0);
        t.on_acked();
        t.on_acked();
        assert_eq!(t.take_confirmed_timings().map(|t| t.committed).collect::<Vec<_>>(), [111, 222]);
        assert_eq!(t.take_confirmed_timings().count(), 0);
    }

    #[test]
    fn commits_without_messages_while_an_ack_waits_do_not_pile_up() {
        let mut t = LsnTracker::new(0);
        t.on_sent();
        t.on_commit(10, at(1));
        for lsn in 11..100_000 {
            t.on_commit(lsn, at(lsn as i64));
        }
        assert_eq!(t.commits.len(), 1);
        assert_eq!(t.confirmed(), 0);
        t.on_acked();
        assert_eq!(t.confirmed(), 99_999);
        assert_eq!(t.take_confirmed_timings().map(|t| t.committed).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn never_moves_backwards() {
        let mut t = LsnTracker::new(1000);
        t.on_commit(10, at(0));
        t.on_keepalive(20);
        assert_eq!(t.confirmed(), 1000);
    }
}

/// Where a row sits in the commit order: its transaction's commit LSN and its index within
/// that transaction. Carried in the `Pgoutbox-Position` header so that, on start, the last
/// stored message tells which rows JetStream already has, however old they are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub commit_lsn: u64,
    pub index: u32,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lsn = tokio_postgres::types::PgLsn::from(self.commit_lsn);
        write!(f, "{lsn}:{}", self.index)
    }
}

impl std::str::FromStr for Position {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        let (lsn, index) = s.rsplit_once(':').ok_or(())?;
        let lsn: tokio_postgres::types::PgLsn = lsn.parse().map_err(|_| ())?;
        Ok(Position { commit_lsn: lsn.into(), index: index.parse().map_err(|_| ())? })
    }
}

#[cfg(test)]
mod position_tests {
    use super::Position;

    #[test]
    fn position_round_trips_and_orders_by_commit_then_index() {
        let p = Position { commit_lsn: 0x1_0000_00A0, index: 7 };
        assert_eq!(p.to_string(), "1/A0:7");
        assert_eq!("1/A0:7".parse::<Position>(), Ok(p));
        assert!(p < Position { commit_lsn: 0x1_0000_00A0, index: 8 });
        assert!(p < Position { commit_lsn: 0x1_0000_00A1, index: 0 });
        assert!("1/A0".parse::<Position>().is_err());
        assert!("zz:1".parse::<Position>().is_err());
    }
}
