//! A model of a JetStream stream as `processJetStreamMsg` handles a publish: the duplicate
//! window, `Nats-Expected-Last-Sequence` and `Nats-Expected-Last-Msg-Id`, in the order of
//! each server version, answered as the server answers and read as the pipeline reads it
//! ([`Answer::acked`], [`Answer::refused`]).

use super::{Answer, DUPLICATE_IN_PROCESS, Guard};

/// API error: wrong last sequence (10071) or wrong last message id (10070); both read the
/// same way.
const WRONG_LAST: u64 = 10071;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Checks {
    /// nats-server 2.9: duplicate window, expected sequence, expected id.
    DedupeFirst,
    /// nats-server 2.12+, R1: expected sequence, duplicate window, expected id.
    SequenceFirst,
    /// nats-server 2.10, R3: as 2.9, but the id is staged before the proposal, and one
    /// refused at apply stays staged: a resend answers "duplicate, sequence 0".
    StagedIds,
    /// nats-server 2.11, R3: as 2.10, but a staged id is refused with 10158.
    StagedInProcess,
    /// nats-server 2.12+, R3: the duplicate window and staged ids before the proposal
    /// (10158), the expected sequence at proposal (the id not staged yet), the expected id
    /// at apply (the id stays staged). The leader proposes and applies in one order, so
    /// proposal and apply are one step here.
    ProposalTime,
}

impl Checks {
    pub(super) const ALL: [Checks; 5] = [
        Checks::DedupeFirst,
        Checks::SequenceFirst,
        Checks::StagedIds,
        Checks::StagedInProcess,
        Checks::ProposalTime,
    ];

    fn stages_ids(self) -> bool {
        matches!(self, Checks::StagedIds | Checks::StagedInProcess | Checks::ProposalTime)
    }
}

/// A message of the stream: a row's, a row's dead letter, one written before the run (by
/// an earlier life of the table, whose ids the rows may reuse), or one another writer put
/// in the stream during the run, unguarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Message {
    Row(usize),
    Letter(usize),
    Old(usize),
    Foreign(usize),
}

impl Message {
    /// The row it carries, if any.
    pub(super) fn row(self) -> Option<usize> {
        match self {
            Message::Row(row) | Message::Letter(row) => Some(row),
            Message::Old(_) | Message::Foreign(_) => None,
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
    /// Sent after the protocol was answered "staged" in a run without faults.
    pub(super) after_staged: bool,
}

#[derive(Debug, Clone)]
pub(super) struct JetStream {
    pub(super) checks: Checks,
    /// The messages stored, in sequence order (sequence = index + 1), and their ids.
    pub(super) stored: Vec<Message>,
    ids: Vec<String>,
    pub(super) last_id: Option<String>,
    /// The duplicate window, oldest entry first: message id and sequence, 0 when only
    /// staged. Entries expire oldest first.
    pub(super) window: Vec<(String, u64)>,
}

impl JetStream {
    pub(super) fn new(checks: Checks) -> JetStream {
        JetStream { checks, stored: Vec::new(), ids: Vec::new(), last_id: None, window: Vec::new() }
    }

    /// Executes one publish; `true` with the answer when it staged its id anew.
    pub(super) fn process(&mut self, write: &Write) -> (Answer, bool) {
        let staged_before = self.holds_staged_id(&write.id);
        let answer = self.checks_in_order(write);
        (answer, !staged_before && self.holds_staged_id(&write.id))
    }

    pub(super) fn holds_staged_id(&self, id: &str) -> bool {
        self.in_window(id) == Some(0)
    }

    fn checks_in_order(&mut self, write: &Write) -> Answer {
        let last_sequence = self.stored.len() as u64;
        let sequence_ok = write.guard.last_sequence.is_none_or(|s| s == last_sequence);
        if self.checks == Checks::SequenceFirst && !sequence_ok {
            return Answer::refused(Some(WRONG_LAST));
        }
        if let Some(sequence) = self.in_window(&write.id) {
            return match self.checks {
                Checks::StagedInProcess | Checks::ProposalTime if sequence == 0 => {
                    Answer::refused(Some(DUPLICATE_IN_PROCESS))
                }
                _ => Answer::acked(sequence, true),
            };
        }
        if self.checks == Checks::ProposalTime && !sequence_ok {
            return Answer::refused(Some(WRONG_LAST));
        }
        let id_ok = match &write.guard.last_msg_id {
            Some(id) => self.last_id.as_ref() == Some(id),
            None => true,
        };
        if !(sequence_ok && id_ok) {
            if self.checks.stages_ids() {
                self.window.push((write.id.clone(), 0));
            }
            return Answer::refused(Some(WRONG_LAST));
        }
        self.store(write.message, write.id.clone())
    }

    fn in_window(&self, id: &str) -> Option<u64> {
        self.window.iter().find(|(held, _)| held == id).map(|&(_, sequence)| sequence)
    }

    pub(super) fn store(&mut self, message: Message, id: String) -> Answer {
        self.stored.push(message);
        self.ids.push(id.clone());
        let sequence = self.stored.len() as u64;
        self.window.retain(|(held, _)| *held != id);
        self.window.push((id.clone(), sequence));
        self.last_id = Some(id);
        Answer::acked(sequence, false)
    }

    /// The oldest entry of the duplicate window ends; `staged_only`: the oldest staged one.
    pub(super) fn expire_oldest(&mut self, staged_only: bool) {
        if let Some(i) = self.window.iter().position(|&(_, s)| !staged_only || s == 0) {
            self.window.remove(i);
        }
    }

    /// A power loss: the server restarts with its first `synced` messages, and rebuilds its
    /// duplicate window and last id from them (nothing staged survives).
    pub(super) fn forget_after(&mut self, synced: usize) {
        self.stored.truncate(synced);
        self.ids.truncate(synced);
        self.window.retain(|&(_, sequence)| sequence != 0 && sequence <= synced as u64);
        self.last_id = self.ids.last().cloned();
    }

    pub(super) fn holds_staged(&self) -> bool {
        self.window.iter().any(|&(_, sequence)| sequence == 0)
    }
}
