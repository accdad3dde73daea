//! The messages sent and not yet acknowledged, oldest first, with their payload bytes.
//! Acks are consumed in this order, which is what lets `LsnTracker` only count.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use std::sync::Arc;

use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::publish::PublishAck;
use bytes::BytesMut;

use crate::domain::outbox::{OutboxEvent, RowMapping};
use crate::domain::progress::Position;
use crate::domain::row::ColumnValue;

pub(super) type AckFuture = Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>;

pub(super) struct InFlight {
    pub(super) ack: AckFuture,
    /// The ack, when it was found ready before its turn (see `check_newest_ack`).
    pub(super) early: Option<Result<PublishAck, PublishError>>,
    pub(super) position: Position,
    /// Bytes held for this message, counted against `--max-in-flight-bytes`: its payload
    /// (until the client writes it) and what [`Resend`] keeps (until the ack).
    pub(super) bytes: usize,
    /// How to send the message again after a duplicate (see `resend_after_duplicate`).
    pub(super) resend: Resend,
}

/// What a message in flight is rebuilt from, should it have to be sent again: its row, from
/// which the mapping, being deterministic, rebuilds the same message; or, for a rare dead
/// letter, the message itself.
pub(super) enum Resend {
    Row { mapping: Arc<RowMapping>, tuple: Vec<ColumnValue> },
    Letter(OutboxEvent),
}

impl Resend {
    /// The bytes this keeps until the message is acknowledged.
    pub(super) fn held_bytes(&self) -> usize {
        match self {
            Resend::Row { tuple, .. } => tuple.iter().map(value_bytes).sum(),
            Resend::Letter(letter) => letter.payload.len(),
        }
    }

    /// Keeps a row's values in one buffer of their own. Decoded values are slices of the WAL
    /// frame they came in; holding those until the ack kept whole read buffers alive, which
    /// cost 3 µs and 9 MB of RSS per row at full drain (the benchmark). One copy of the
    /// values is cheaper.
    pub(super) fn row(mapping: Arc<RowMapping>, tuple: Vec<ColumnValue>) -> Resend {
        let mut buffer = BytesMut::with_capacity(tuple.iter().map(value_bytes).sum());
        for value in &tuple {
            if let ColumnValue::Text(b) | ColumnValue::Binary(b) = value {
                buffer.extend_from_slice(b);
            }
        }
        let mut buffer = buffer.freeze();
        let tuple = tuple
            .into_iter()
            .map(|value| match value {
                ColumnValue::Text(b) => ColumnValue::Text(buffer.split_to(b.len())),
                ColumnValue::Binary(b) => ColumnValue::Binary(buffer.split_to(b.len())),
                other => other,
            })
            .collect();
        Resend::Row { mapping, tuple }
    }
}

fn value_bytes(value: &ColumnValue) -> usize {
    match value {
        ColumnValue::Text(b) | ColumnValue::Binary(b) => b.len(),
        ColumnValue::Null | ColumnValue::UnchangedToast => 0,
    }
}

/// The in-flight window: bounded by count and by bytes held.
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
        self.bytes += entry.bytes;
        self.entries.push_back(entry);
    }

    pub(super) fn pop_oldest(&mut self) -> Option<InFlight> {
        let oldest = self.entries.pop_front()?;
        self.bytes -= oldest.bytes;
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
