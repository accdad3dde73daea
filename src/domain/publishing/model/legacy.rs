//! The publish protocol pgoutbox had before the id chain, kept in the model to show that the
//! model check catches its loss.

use super::{Answer, Message, World, Write, Written};

/// The publish protocol up to 2026-11, transcribed to show that the model check catches
/// its loss: every message chained by `Nats-Expected-Last-Sequence`, a place counted by each
/// attempt; after any duplicate, the place moves back by one per message in flight, whose
/// answers are awaited and each sent again (`pipeline/resend.rs` then).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Legacy {
    pub(super) expected: u64,
    pub(super) resend_left: usize,
}

impl World {
    /// The answer as the legacy protocol sees it: after a duplicate, the messages chained
    /// behind it are sent again in place; `None` when the answer was to one of those, handled
    /// here.
    pub(super) fn legacy_answer(&mut self, sent: Message, answer: Answer) -> Option<Answer> {
        let Some(legacy) = self.legacy.as_mut() else {
            return Some(answer);
        };
        if legacy.resend_left > 0 {
            // A message chained behind a duplicate: sent again in place.
            legacy.resend_left -= 1;
            if matches!(answer, Answer::Stored { .. }) {
                self.end_attempt(false);
                return None;
            }
            let guard = Written { last_sequence: Some(legacy.expected), last_msg_id: None };
            legacy.expected += 1;
            self.attempt.in_flight.push_back(sent);
            let id = self.id_of_message(sent);
            let write = Write { message: sent, id, guard, after_staged: false };
            self.current().to_server.push_back(write);
            return None;
        }
        match answer {
            Answer::Duplicate { sequence } => {
                let stale = self.attempt.in_flight.len();
                legacy.expected -= 1 + stale as u64;
                legacy.resend_left = stale;
                Some(Answer::Stored { sequence })
            }
            _ => Some(answer),
        }
    }
}
