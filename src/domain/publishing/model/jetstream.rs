//! A model of a JetStream stream as `processJetStreamMsg` handles a publish: the duplicate
//! window, `Nats-Expected-Last-Sequence` and `Nats-Expected-Last-Msg-Id`, in the order of
//! each server version.

use std::collections::HashMap;

use super::{Answer, Guard};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Checks {
    /// nats-server 2.9: duplicate window, expected sequence, expected id.
    DedupeFirst,
    /// nats-server 2.12+, R1: expected sequence, duplicate window, expected id.
    SequenceFirst,
    /// nats-server 2.10, R3: as 2.9, but an id refused at apply stays staged (sequence 0).
    StagedIds,
}

/// A message of the stream: a row's, a row's dead letter, or one written before the run
/// (by an earlier life of the table, whose ids the rows may reuse).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Message {
    Row(usize),
    Letter(usize),
    Old(usize),
}

impl Message {
    /// The row it carries, if any.
    pub(super) fn row(self) -> Option<usize> {
        match self {
            Message::Row(row) | Message::Letter(row) => Some(row),
            Message::Old(_) => None,
        }
    }
}

/// A guard as it was written into a connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Written {
    /// `None`: no sequence expected.
    pub(super) last_sequence: Option<u64>,
    pub(super) last_msg_id: Option<String>,
}

impl From<Guard<'_>> for Written {
    fn from(guard: Guard<'_>) -> Written {
        Written {
            last_sequence: Some(guard.last_sequence),
            last_msg_id: guard.last_msg_id.map(str::to_owned),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Write {
    pub(super) message: Message,
    pub(super) id: String,
    pub(super) guard: Written,
}

#[derive(Debug, Clone)]
pub(super) struct JetStream {
    pub(super) checks: Checks,
    /// The messages stored, in sequence order (sequence = index + 1).
    pub(super) stored: Vec<Message>,
    pub(super) last_id: Option<String>,
    /// Message id → sequence; 0 when only staged.
    pub(super) window: HashMap<String, u64>,
}

impl JetStream {
    pub(super) fn process(&mut self, write: &Write) -> Answer {
        let last_sequence = self.stored.len() as u64;
        let sequence_ok = write.guard.last_sequence.is_none_or(|s| s == last_sequence);
        if self.checks == Checks::SequenceFirst && !sequence_ok {
            return Answer::NotStored;
        }
        if let Some(&sequence) = self.window.get(&write.id) {
            return Answer::Duplicate { sequence };
        }
        let id_ok = match &write.guard.last_msg_id {
            Some(id) => self.last_id.as_ref() == Some(id),
            None => true,
        };
        if !(sequence_ok && id_ok) {
            if self.checks == Checks::StagedIds {
                self.window.insert(write.id.clone(), 0);
            }
            return Answer::NotStored;
        }
        self.store(write.message, write.id.clone())
    }

    pub(super) fn store(&mut self, message: Message, id: String) -> Answer {
        self.stored.push(message);
        let sequence = self.stored.len() as u64;
        self.window.insert(id.clone(), sequence);
        self.last_id = Some(id);
        Answer::Stored { sequence }
    }
}
