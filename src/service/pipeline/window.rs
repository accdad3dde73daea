//! The messages sent and not yet acknowledged, oldest first, and their acks as they arrive.
//! Acks are consumed in this order, which is what lets `LsnTracker` only count.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::context::PublishError;
use bytes::{Bytes, BytesMut};

use crate::domain::outbox::{OutboxEvent, Rejection, RowMapping};
use crate::domain::progress::Position;
use crate::domain::row::ColumnValue;
use crate::nats::outbound::{Ack, Acks};

/// How many messages may await their ack at once.
pub const MAX_IN_FLIGHT: usize = 4096;

pub(super) struct InFlight {
    /// What the message's ack carries to name it (see `crate::nats::outbound`).
    token: u64,
    sent_at: Instant,
    /// The ack, once it arrived; it waits here until every older message had its own.
    ack: Option<Ack>,
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
    Row(KeptRow),
    Letter(OutboxEvent),
}

/// A row's values copied into one buffer of their own, with each value's kind and length.
/// Decoded values are slices of the WAL frame they came in; holding those until the ack
/// kept whole read buffers alive, which cost 3 µs and 9 MB of RSS per row at full drain
/// (the benchmark). A handle per value cost another 0.3 µs: the tuple is rebuilt only
/// when it is needed, after a duplicate.
pub(super) struct KeptRow {
    mapping: Arc<RowMapping>,
    values: Bytes,
    shape: Vec<Kept>,
}

#[derive(Clone, Copy)]
enum Kept {
    Text(usize),
    Binary(usize),
    Null,
    UnchangedToast,
}

impl Resend {
    pub(super) fn row(mapping: Arc<RowMapping>, tuple: &[ColumnValue]) -> Resend {
        let mut values = BytesMut::with_capacity(tuple.iter().map(value_bytes).sum());
        let shape = tuple
            .iter()
            .map(|value| match value {
                ColumnValue::Text(b) => {
                    values.extend_from_slice(b);
                    Kept::Text(b.len())
                }
                ColumnValue::Binary(b) => {
                    values.extend_from_slice(b);
                    Kept::Binary(b.len())
                }
                ColumnValue::Null => Kept::Null,
                ColumnValue::UnchangedToast => Kept::UnchangedToast,
            })
            .collect();
        Resend::Row(KeptRow { mapping, values: values.freeze(), shape })
    }

    /// The bytes this keeps until the message is acknowledged.
    pub(super) fn held_bytes(&self) -> usize {
        match self {
            Resend::Row(row) => row.values.len(),
            Resend::Letter(letter) => letter.payload.len(),
        }
    }

    /// The message again, as it was first sent.
    pub(super) fn rebuild(&self) -> Result<OutboxEvent, Rejection> {
        match self {
            Resend::Row(row) => row.mapping.map(&row.tuple()),
            Resend::Letter(letter) => Ok(letter.clone()),
        }
    }
}

impl KeptRow {
    fn tuple(&self) -> Vec<ColumnValue> {
        let mut at = 0;
        let mut next = |len: usize| {
            at += len;
            self.values.slice(at - len..at)
        };
        self.shape
            .iter()
            .map(|kept| match *kept {
                Kept::Text(len) => ColumnValue::Text(next(len)),
                Kept::Binary(len) => ColumnValue::Binary(next(len)),
                Kept::Null => ColumnValue::Null,
                Kept::UnchangedToast => ColumnValue::UnchangedToast,
            })
            .collect()
    }
}

fn value_bytes(value: &ColumnValue) -> usize {
    match value {
        ColumnValue::Text(b) | ColumnValue::Binary(b) => b.len(),
        ColumnValue::Null | ColumnValue::UnchangedToast => 0,
    }
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

    /// Adds a message just sent with `token`, `payload` bytes long; tokens grow with every
    /// send, so the window stays sorted.
    pub(super) fn push(&mut self, token: u64, position: Position, payload: usize, resend: Resend) {
        let bytes = payload + resend.held_bytes();
        let sent_at = Instant::now();
        self.bytes += bytes;
        self.entries.push_back(InFlight { token, sent_at, ack: None, position, bytes, resend });
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
            // An ack of a message no longer in flight (sent again after a duplicate) is late.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::outbox::{ColumnRoles, SubjectTemplate};

    #[test]
    fn a_kept_row_gives_back_the_tuple_it_was_made_from() {
        let template: SubjectTemplate = "outbox.{aggregate_type}".parse().unwrap();
        let mapping = Arc::new(RowMapping::for_emitted_messages(
            "outbox",
            &ColumnRoles::default(),
            &template,
        ));
        let tuple = vec![
            ColumnValue::Text(Bytes::from_static(b"id-1")),
            ColumnValue::Null,
            ColumnValue::Binary(Bytes::from_static(b"\x00\x01\x02")),
            ColumnValue::UnchangedToast,
            ColumnValue::Text(Bytes::new()),
            ColumnValue::Text(Bytes::from_static("ünïcode".as_bytes())),
        ];
        let resend = Resend::row(mapping, &tuple);
        assert_eq!(resend.held_bytes(), 4 + 3 + "ünïcode".len());
        let Resend::Row(kept) = resend else { panic!("a row is kept as a row") };
        assert_eq!(kept.tuple(), tuple);
    }
}
