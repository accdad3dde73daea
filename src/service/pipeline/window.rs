//! The messages sent and not yet acknowledged, oldest first, with their payload bytes.
//! Acks are consumed in this order, which is what lets `LsnTracker` only count.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::publish::PublishAck;
use bytes::Bytes;

use crate::domain::progress::Position;

pub(super) type AckFuture = Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>;

pub(super) struct InFlight {
    pub(super) ack: AckFuture,
    /// The ack, when it was found ready before its turn (see `check_newest_ack`).
    pub(super) early: Option<Result<PublishAck, PublishError>>,
    pub(super) position: Position,
    /// Kept until acknowledged, to be sent again after a duplicate (see
    /// `resend_after_duplicate`); it shares the payload's buffer, so in-flight memory stays
    /// within `--max-in-flight-bytes`.
    pub(super) message: Outgoing,
}

/// A message as sent, less its `Nats-Expected-Last-Sequence`.
pub(super) struct Outgoing {
    pub(super) subject: String,
    pub(super) headers: HeaderMap,
    pub(super) payload: Bytes,
}

/// The in-flight window: bounded by count and by payload bytes.
#[derive(Default)]
pub(super) struct Window {
    entries: VecDeque<InFlight>,
    bytes: usize,
}

impl Window {
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

    pub(super) fn push(&mut self, entry: InFlight) {
        self.bytes += entry.message.payload.len();
        self.entries.push_back(entry);
    }

    pub(super) fn pop_oldest(&mut self) -> Option<InFlight> {
        let oldest = self.entries.pop_front()?;
        self.bytes -= oldest.message.payload.len();
        Some(oldest)
    }

    /// Empties the window, oldest first.
    pub(super) fn take_all(&mut self) -> VecDeque<InFlight> {
        self.bytes = 0;
        std::mem::take(&mut self.entries)
    }

    /// Acks are consumed oldest first, but when the oldest waits for its timeout (it went to
    /// a stream leader that died), the ones after it are refused at once (no leader yet).
    /// Looking at the newest ack every tick ends such an attempt within 100 ms instead of
    /// after the ack timeout; any refused ack means the attempt must restart anyway. A ready
    /// ack that is not a refusal is kept for its turn.
    pub(super) fn refused_newest(&mut self) -> Option<(Position, PublishError)> {
        use futures_util::FutureExt;
        if self.entries.len() < 2 {
            return None;
        }
        let newest = self.entries.back_mut().filter(|newest| newest.early.is_none())?;
        match (&mut newest.ack).now_or_never() {
            Some(Err(err)) => Some((newest.position, err)),
            ready => {
                newest.early = ready;
                None
            }
        }
    }

    /// Waits for the oldest ack; never resolves when nothing is in flight. Cancel-safe: the
    /// boxed future keeps its state across polls.
    pub(super) async fn oldest(&mut self) -> Result<PublishAck, PublishError> {
        match self.entries.front_mut() {
            Some(oldest) => match oldest.early.take() {
                Some(ack) => ack,
                None => (&mut oldest.ack).await,
            },
            None => std::future::pending().await,
        }
    }
}
