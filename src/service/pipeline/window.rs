//! The messages sent and not yet acknowledged, oldest first, and their acks as they arrive.
//! Acks are consumed in this order, which is what lets `LsnTracker` only count.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::context::PublishError;

use crate::domain::progress::Position;
use crate::nats::outbound::{Ack, Acks};
use crate::service::telemetry::TableCounters;
use crate::service::traces::RowSpan;

/// How many messages may await their ack at once.
pub const MAX_IN_FLIGHT: usize = 4096;

pub(super) struct InFlight {
    /// What the message's ack carries to name it (see `crate::nats::outbound`).
    token: u64,
    sent_at: Instant,
    /// The ack, once it arrived; it waits here until every older message had its own.
    ack: Option<Ack>,
    pub(super) position: Position,
    /// The message's payload bytes, counted against `--max-in-flight-bytes` until its ack.
    pub(super) bytes: usize,
    /// Its producer span, when traces are on and it was sampled: it ends at the ack.
    pub(super) span: Option<RowSpan>,
    /// Its table's counters on `/metrics`, counted at its ack.
    pub(super) counters: Arc<TableCounters>,
}

/// The in-flight window: bounded by count and by bytes held, fed by one attempt's acks.
pub(super) struct Window {
    entries: VecDeque<InFlight>,
    bytes: usize,
    acks: Acks,
}

impl Window {
    pub(super) fn new(acks: Acks) -> Window {
        Window { entries: VecDeque::new(), bytes: 0, acks }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether another message may be sent: one always may, whatever its size; then the
    /// count and the bytes bound.
    pub(super) fn has_room(&self, max_count: usize, max_bytes: usize) -> bool {
        self.entries.is_empty() || (self.entries.len() < max_count && self.bytes < max_bytes)
    }

    /// Adds a message just sent with `token`, `bytes` long; tokens grow with every send, so
    /// the window stays sorted.
    pub(super) fn push(
        &mut self,
        token: u64,
        position: Position,
        bytes: usize,
        span: Option<RowSpan>,
        counters: Arc<TableCounters>,
    ) {
        let sent_at = Instant::now();
        self.bytes += bytes;
        let ack = None;
        self.entries.push_back(InFlight { token, sent_at, ack, position, bytes, span, counters });
    }

    /// Reads the acks that wait now (see [`Acks::pull`]).
    pub(super) fn pull_acks(&mut self) {
        self.acks.pull();
    }

    /// Whether every ack is read as it arrives (see [`Acks::wake_on_each`]).
    pub(super) fn wake_on_each_ack(&mut self, each: bool) {
        self.acks.wake_on_each(each);
    }

    pub(super) fn pop_oldest(&mut self) -> Option<InFlight> {
        let oldest = self.entries.pop_front()?;
        self.bytes -= oldest.bytes;
        Some(oldest)
    }

    /// Acks are consumed oldest first, but when the oldest waits for its timeout (it went to
    /// a stream leader that died), the ones after it are refused at once (no leader yet).
    /// Looking at the newest ack every tick ends such an attempt within 100 ms instead of
    /// after the ack timeout; any refused ack means the attempt must restart anyway.
    pub(super) fn refused_newest(&mut self) -> Option<(Position, PublishError)> {
        if self.entries.len() < 2 {
            return None;
        }
        let newest = self.entries.back_mut()?;
        match newest.ack.take() {
            Some(Err(err)) => Some((newest.position, err)),
            ready => {
                newest.ack = ready;
                None
            }
        }
    }

    /// The oldest message, when it has waited longer than `timeout` for its ack.
    pub(super) fn overdue(&self, timeout: Duration) -> Option<Position> {
        let oldest = self.entries.front()?;
        (oldest.ack.is_none() && oldest.sent_at.elapsed() > timeout).then_some(oldest.position)
    }

    /// Waits for the oldest message's ack, keeping every ack that arrives meanwhile with its
    /// message. With nothing in flight it resolves only with the error that the publishing
    /// connection ended. Cancel-safe: an ack received is stored before the next await.
    pub(super) async fn oldest(&mut self) -> Ack {
        loop {
            // With nothing in flight, read all the same: the server's pings are answered
            // there, and a connection that ended is found while idle.
            if let Some(oldest) = self.entries.front_mut()
                && let Some(ack) = oldest.ack.take()
            {
                return ack;
            }
            let (token, ack) = self.acks.next().await?;
            // An ack of a message no longer in flight (a token unknown, or answered twice) is
            // ignored: only its first answer counts.
            if let Some(entry) = self.find(token)
                && entry.ack.is_none()
            {
                entry.ack = Some(ack);
            }
        }
    }

    /// The message with `token`. Tokens are consecutive unless a send failed between two
    /// messages, so the offset from the oldest finds it at once; a search is the fallback.
    fn find(&mut self, token: u64) -> Option<&mut InFlight> {
        let oldest = self.entries.front()?.token;
        let offset = usize::try_from(token.checked_sub(oldest)?).ok()?;
        let i = match self.entries.get(offset) {
            Some(entry) if entry.token == token => offset,
            _ => self.entries.binary_search_by_key(&token, |entry| entry.token).ok()?,
        };
        self.entries.get_mut(i)
    }
}
