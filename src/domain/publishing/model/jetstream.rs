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

#[derive(Debug, Clone)]
pub(super) struct Write {
    pub(super) row: usize,
    pub(super) guard: Guard,
}

#[derive(Debug, Clone)]
pub(super) struct JetStream {
    pub(super) checks: Checks,
    /// The rows stored, in sequence order (sequence = index + 1).
    pub(super) stored: Vec<usize>,
    pub(super) last_id: Option<usize>,
    /// Message id (the row) → sequence; 0 when only staged.
    pub(super) window: HashMap<usize, u64>,
}

impl JetStream {
    pub(super) fn process(&mut self, write: &Write) -> Answer {
        let last_sequence = self.stored.len() as u64;
        let sequence_ok = match &write.guard {
            Guard::LastSequence(expected) => *expected == last_sequence,
            Guard::LastMsgId(_) => true,
        };
        if self.checks == Checks::SequenceFirst && !sequence_ok {
            return Answer::NotStored;
        }
        if let Some(&sequence) = self.window.get(&write.row) {
            return Answer::Duplicate { sequence };
        }
        let id_ok = match &write.guard {
            Guard::LastMsgId(id) => self.last_id.map(id_of).as_ref() == Some(id),
            Guard::LastSequence(_) => true,
        };
        if !(sequence_ok && id_ok) {
            if self.checks == Checks::StagedIds {
                self.window.insert(write.row, 0);
            }
            return Answer::NotStored;
        }
        self.stored.push(write.row);
        self.last_id = Some(write.row);
        let sequence = self.stored.len() as u64;
        self.window.insert(write.row, sequence);
        Answer::Stored { sequence }
    }
}

/// A row's message id.
pub(super) fn id_of(row: usize) -> String {
    format!("row-{row}")
}
