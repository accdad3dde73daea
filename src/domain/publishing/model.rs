//! Model check of the publish protocol: [`Publishing`] drives connections to a model of
//! JetStream, and every order in which the server executes what was written to it is played,
//! with attempts given up (an ack that never came), processes killed, writes of abandoned
//! connections landing late or never, the server forgetting the last message id on a
//! restart, the duplicate window expiring, and a server that loses power and forgets what it
//! acknowledged since its last sync, behind the durability horizon's looks (`forgetting`).
//!
//! The JetStream model applies a publish's checks in the orders nats-server does
//! (`processJetStreamMsg`): 2.9 checks the duplicate window first, then
//! `Nats-Expected-Last-Sequence`, then `Nats-Expected-Last-Msg-Id`; 2.12+ on an R1 stream
//! checks the expected sequence before the duplicate window; 2.10 on an R3 stream stages a
//! message's id at proposal, so an id refused at apply answers "duplicate, sequence 0".
//!
//! Rows may reuse ids: each other's, or those of messages the stream held before the run
//! (a table truncated with its sequence restarted). Such a row is a collision, and its dead
//! letter, named by position, takes its place; unless the duplicate window forgot the
//! older id first, and the row is stored as itself.
//!
//! It asserts: no row is lost or stored twice (as itself or as its letter), rows are stored
//! in commit order, a row with an id of its own is never a letter, and no LSN is confirmed
//! past a row the stream does not hold. Exhaustive over small cases, random over larger
//! ones.

use std::collections::VecDeque;

use super::*;
use crate::domain::outbox::DEAD_LETTER_ID_PREFIX;
use legacy::Legacy;

mod cases;
mod faults;
mod forgetting;
mod jetstream;
mod legacy;
mod promises;
mod search;
mod steps;

use faults::Faults;
use jetstream::{Checks, JetStream, Message, Write, Written};
use promises::Broken;
use steps::Step;

#[derive(Debug, Clone, Default)]
struct Connection {
    to_server: VecDeque<Write>,
    /// Each answer, and whether the server found the id staged.
    to_client: VecDeque<(Answer, bool)>,
}

#[derive(Debug, Clone)]
struct Attempt {
    connection: usize,
    protocol: Publishing,
    /// The next decoding event of the slot, from the attempt's start.
    next_event: usize,
    events: Vec<Decoded>,
    in_flight: VecDeque<Message>,
}

#[derive(Debug, Clone, Copy)]
enum Decoded {
    Row(usize),
    Commit(u64),
}

#[derive(Debug, Clone)]
struct World {
    /// The transaction each row belongs to; rows are numbered in commit order.
    transaction_of: Vec<usize>,
    /// Each row's id, and those of the messages the stream held before (same numbering).
    ids: Vec<usize>,
    old_ids: Vec<usize>,
    window_size: usize,
    jetstream: JetStream,
    connections: Vec<Connection>,
    attempt: Attempt,
    slot_confirmed: u64,
    faults: Faults,
    /// What the process remembers across attempts (lost when it is killed): what the
    /// protocol carries, and the rows whose letter goes in their place.
    memory: Option<(Carried, Vec<usize>)>,
    /// Attempts ended while an id was staged: retrying outlasts the duplicate window, so
    /// after two the oldest staged id is gone (a fair scheduler: time passes; entries
    /// expire one at a time, so a protocol that stages ids again never ends).
    ended_while_staged: u8,
    /// Messages the foreign writer stored.
    foreign: usize,
    /// Check that no message sent after a "staged" answer stages its id anew (a run
    /// without faults, where every guard is right: see `search::explore_live`).
    strict_staging: bool,
    answered_staged: bool,
    /// Drive the protocol pgoutbox had before the id chain instead (see [`Legacy`]).
    legacy: Option<Legacy>,
    /// Leave the sequence out of every guard but the anchor's: the protocol before issue 28.
    ids_only: bool,
    /// How many of the stream's messages the server has synced to disk.
    synced: usize,
    /// With a durability horizon, what waits for a look (`forgetting`).
    horizon: Option<forgetting::Looked>,
    /// The server lost power and this attempt's connection died with it; pgoutbox has not
    /// noticed yet ([`Step::Notice`]).
    unnoticed: bool,
}

/// The message id of a row, or of an old message, with the id number `id`.
fn id_of(id: usize) -> String {
    format!("id-{id}")
}

fn commit_lsn(transaction: usize) -> u64 {
    10 * (transaction as u64 + 1)
}

fn end_lsn(transaction: usize) -> u64 {
    commit_lsn(transaction) + 1
}

impl World {
    fn new(
        transaction_of: Vec<usize>,
        window_size: usize,
        checks: Checks,
        faults: Faults,
    ) -> World {
        let ids = (0..transaction_of.len()).collect();
        World::with_ids(transaction_of, ids, &[], window_size, checks, faults)
    }

    /// Rows with the ids `ids`, behind messages the stream holds already with the ids `old`.
    fn with_ids(
        transaction_of: Vec<usize>,
        ids: Vec<usize>,
        old: &[usize],
        window_size: usize,
        checks: Checks,
        faults: Faults,
    ) -> World {
        let mut jetstream = JetStream::new(checks);
        for (i, &id) in old.iter().enumerate() {
            jetstream.store(Message::Old(i), id_of(id));
        }
        let mut world = World {
            transaction_of,
            ids,
            old_ids: old.to_vec(),
            window_size,
            jetstream,
            connections: Vec::new(),
            attempt: Attempt {
                connection: 0,
                protocol: Publishing::new(
                    Start { lsn: 0, stream_sequence: 0, skip_through: None },
                    Carried::default(),
                ),
                next_event: 0,
                events: Vec::new(),
                in_flight: VecDeque::new(),
            },
            slot_confirmed: 0,
            faults,
            memory: Some((Carried::default(), Vec::new())),
            ended_while_staged: 0,
            foreign: 0,
            strict_staging: false,
            answered_staged: false,
            legacy: None,
            ids_only: false,
            synced: 0,
            horizon: None,
            unnoticed: false,
        };
        world.start_attempt(false);
        world
    }

    fn position(&self, row: usize) -> Position {
        let transaction = self.transaction_of[row];
        let first = self.transaction_of.iter().position(|&t| t == transaction).unwrap_or(row);
        Position { commit_lsn: commit_lsn(transaction), index: (row - first) as u32 }
    }

    /// The message a row is sent as: its letter once a collision was found.
    fn message_of(&self, row: usize) -> Message {
        match &self.memory {
            Some((_, letters)) if letters.contains(&row) => Message::Letter(row),
            _ => Message::Row(row),
        }
    }

    fn id_of_message(&self, message: Message) -> String {
        match message {
            Message::Row(row) => id_of(self.ids[row]),
            // Named by position, as `DeadLetter::named_by_position` names it.
            Message::Letter(row) => format!("{DEAD_LETTER_ID_PREFIX}{}", self.position(row)),
            Message::Old(_) | Message::Foreign(_) => unreachable!("never sent"),
        }
    }

    /// Sends `message` with the protocol's guard.
    fn send(&mut self, message: Message) {
        let id = self.id_of_message(message);
        let mut guard = Written::from(self.attempt.protocol.guard());
        if self.ids_only && guard.last_msg_id.is_some() {
            guard.last_sequence = None;
        }
        if let Some(legacy) = self.legacy.as_mut() {
            guard = Written { last_sequence: Some(legacy.expected), last_msg_id: None };
            legacy.expected += 1;
        }
        let after_staged = self.strict_staging && self.answered_staged;
        if !self.unnoticed {
            let write = Write { message, id: id.clone(), guard, after_staged };
            self.current().to_server.push_back(write);
        }
        self.attempt.protocol.on_sent(id);
        self.attempt.in_flight.push_back(message);
    }

    /// A new attempt: a new connection, the stream's tail read, the slot read from its
    /// confirmed position.
    fn start_attempt(&mut self, crashed: bool) {
        let skip_through = self.jetstream.stored.last().and_then(|&message| {
            let row = message.row()?;
            Some(TailRow { position: self.position(row), msg_id: self.id_of_message(message) })
        });
        let start = Start {
            lsn: self.slot_confirmed,
            stream_sequence: self.jetstream.stored.len() as u64,
            skip_through,
        };
        let (carried, letters) = self.memory.take().unwrap_or_default();
        self.memory = Some((Carried::default(), letters));
        if let Some(legacy) = self.legacy.as_mut() {
            *legacy = Legacy { expected: start.stream_sequence, resend_left: 0 };
        }
        let mut events = Vec::new();
        for (row, &transaction) in self.transaction_of.iter().enumerate() {
            if end_lsn(transaction) <= self.slot_confirmed {
                continue;
            }
            events.push(Decoded::Row(row));
            if self.transaction_of.get(row + 1) != Some(&transaction) {
                events.push(Decoded::Commit(end_lsn(transaction)));
            }
        }
        self.horizon_at_start(crashed);
        self.connections.push(Connection::default());
        self.attempt = Attempt {
            connection: self.connections.len() - 1,
            protocol: Publishing::new(start, carried),
            next_event: 0,
            events,
            in_flight: VecDeque::new(),
        };
    }

    /// The attempt ends; what it learned is kept unless the process dies.
    fn end_attempt(&mut self, crashed: bool) {
        self.confirm();
        let carried = self.attempt.protocol.take_carried();
        let letters = self.memory.take().map(|(_, letters)| letters).unwrap_or_default();
        self.memory = (!crashed).then_some((carried, letters));
        if self.jetstream.holds_staged() {
            self.ended_while_staged += 1;
            if self.ended_while_staged == 2 {
                self.jetstream.expire_oldest(true);
                self.ended_while_staged = 0;
            }
        }
        self.start_attempt(crashed);
    }

    fn current(&mut self) -> &mut Connection {
        &mut self.connections[self.attempt.connection]
    }

    fn steps(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        let attempt = &self.attempt;
        let current = &self.connections[attempt.connection];
        if !current.to_client.is_empty() {
            steps.push(Step::Receive);
        }
        let window = self.window_size.min(attempt.protocol.send_limit());
        if attempt.next_event < attempt.events.len() && attempt.in_flight.len() < window {
            steps.push(Step::Decode);
        }
        for (i, connection) in self.connections.iter().enumerate() {
            if !connection.to_server.is_empty() {
                steps.push(Step::Execute(i));
                if i != attempt.connection {
                    steps.push(Step::Lose(i));
                }
            }
        }
        if !attempt.in_flight.is_empty() {
            if self.faults.give_ups > 0 {
                steps.push(Step::GiveUp);
            }
            if self.faults.crashes > 0 {
                steps.push(Step::Crash);
            }
        }
        if self.faults.server_restarts > 0 && self.jetstream.last_id.is_some() {
            steps.push(Step::ServerRestart);
        }
        if !self.jetstream.window.is_empty() {
            if self.faults.window_expiries > 0 {
                steps.push(Step::WindowExpires);
            }
            if self.faults.oldest_expiries > 0 {
                steps.push(Step::ExpireOldest);
            }
        }
        if self.faults.foreign_writes > 0 {
            steps.push(Step::ForeignWrite);
        }
        self.horizon_steps(&mut steps);
        steps
    }

    fn apply(&mut self, step: Step) -> Result<(), Broken> {
        match step {
            Step::Decode => self.decode()?,
            Step::Receive => self.receive()?,
            Step::Execute(i) => self.execute(i)?,
            Step::Lose(i) => self.connections[i].to_server.clear(),
            Step::GiveUp => {
                self.faults.give_ups -= 1;
                self.end_attempt(false);
            }
            Step::Crash => {
                self.faults.crashes -= 1;
                self.end_attempt(true);
            }
            Step::ServerRestart => {
                self.faults.server_restarts -= 1;
                self.jetstream.last_id = None;
            }
            Step::WindowExpires => {
                self.faults.window_expiries -= 1;
                self.jetstream.window.clear();
            }
            Step::ExpireOldest => {
                self.faults.oldest_expiries -= 1;
                self.jetstream.expire_oldest(false);
            }
            Step::ForeignWrite => {
                self.faults.foreign_writes -= 1;
                let message = Message::Foreign(self.foreign);
                self.foreign += 1;
                self.jetstream.store(message, format!("foreign-{}", self.foreign));
            }
            Step::Sync
            | Step::Forget
            | Step::Notice
            | Step::HorizonPasses
            | Step::Look
            | Step::LookAnswered => self.apply_horizon(step),
        }
        self.check_stream()
    }

    /// The attempt's next decoded event through the protocol: a row it says to publish is sent.
    fn decode(&mut self) -> Result<(), Broken> {
        let event = self.attempt.events[self.attempt.next_event];
        self.attempt.next_event += 1;
        match event {
            Decoded::Row(row) => {
                let position = self.position(row);
                // One history: the tail's row is always where the tail says.
                let id = id_of(self.ids[row]);
                let step = self.attempt.protocol.on_row(position, Some(&id));
                if step.map_err(|err| err.to_string())? == RowStep::Publish {
                    self.send(self.message_of(row));
                }
            }
            Decoded::Commit(end) => {
                let timing = Timing { committed: 0, received: 0 };
                self.attempt.protocol.on_commit(end, timing).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// The attempt's connection's next answer, to the oldest message in flight, through the
    /// protocol; then what it says: confirm, send the row's dead letter, or end the attempt.
    fn receive(&mut self) -> Result<(), Broken> {
        let (answer, found_staged) = self.current().to_client.pop_front().ok_or("no answer")?;
        self.answered_staged |= found_staged;
        let sent = self.attempt.in_flight.pop_front().ok_or("an answer with nothing sent")?;
        let row = sent.row().ok_or("a message of no row in flight")?;
        let position = self.position(row);
        let Some(answer) = self.legacy_answer(sent, answer) else {
            return Ok(());
        };
        if let Answer::Stored { sequence } = answer {
            self.stored_ack(sequence, position);
        }
        let mut outcome = self.attempt.protocol.on_answer(answer);
        if let Outcome::CheckDuplicate { sequence } = outcome {
            // The older message's headers say whether it is this row, stored before.
            let index = usize::try_from(sequence).ok().and_then(|s| s.checked_sub(1));
            let origin = index.and_then(|i| self.jetstream.stored.get(i));
            let same_row = origin == Some(&sent);
            if !same_row && let Some((_, letters)) = self.memory.as_mut() {
                letters.push(row);
            }

            outcome = self.attempt.protocol.on_duplicate_origin(position, same_row);
        }
        // What the position rests on: the message acknowledged, its place in the
        // stream given by the answer (`service::pipeline::acks`).
        if let (
            Outcome::Stored | Outcome::AlreadyInPlace,
            Answer::Stored { sequence } | Answer::Duplicate { sequence },
        ) = (outcome, answer)
        {
            self.stored_ack(sequence, position);
        }
        match outcome {
            Outcome::EndAttempt => self.end_attempt(false),
            Outcome::Collision => self.send(Message::Letter(row)),
            _ => self.confirm(),
        }
        Ok(())
    }

    /// nats-server executes connection `i`'s oldest write; the attempt's connection hears the
    /// answer.
    fn execute(&mut self, i: usize) -> Result<(), Broken> {
        let write = self.connections[i].to_server.pop_front().ok_or("nothing written")?;
        let found_staged = self.jetstream.holds_staged_id(&write.id);
        let (answer, staged_anew) = self.jetstream.process(&write);
        if staged_anew && write.after_staged {
            return Err(Broken::from(format!(
                "{:?}, sent after a 'staged' answer, staged its id anew: each row \
                 would wait for a duplicate window of its own",
                write.message
            )));
        }
        if i == self.attempt.connection {
            self.connections[i].to_client.push_back((answer, found_staged));
        }
        Ok(())
    }

    /// What the pipeline reports to Postgres, checked against the stream: with a horizon,
    /// only what a look vouched for (`forgetting`).
    fn confirm(&mut self) {
        let confirmable = self.attempt.protocol.confirmed();
        self.offer(confirmable);
    }
}
