//! Model check of the publish protocol: [`Publishing`] drives connections to a model of
//! JetStream, and every order in which the server executes what was written to it is played,
//! with attempts given up (an ack that never came), processes killed, writes of abandoned
//! connections landing late or never, the server forgetting the last message id on a
//! restart, and the duplicate window expiring.
//!
//! The JetStream model applies a publish's checks in the orders nats-server does
//! (`processJetStreamMsg`): 2.9 checks the duplicate window first, then
//! `Nats-Expected-Last-Sequence`, then `Nats-Expected-Last-Msg-Id`; 2.12+ on an R1 stream
//! checks the expected sequence before the duplicate window; 2.10 on an R3 stream stages a
//! message's id at proposal, so an id refused at apply answers "duplicate, sequence 0".
//!
//! It asserts: no row is lost or stored twice, rows are stored in commit order, and no LSN
//! is confirmed past a row the stream does not hold. Exhaustive over small cases, random
//! over larger ones.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use proptest::prelude::*;

use super::*;

mod jetstream;
mod search;

use jetstream::{Checks, JetStream, Write, id_of};
use search::{explore, play};

#[derive(Debug, Clone, Default)]
struct Connection {
    to_server: VecDeque<Write>,
    to_client: VecDeque<Answer>,
}

#[derive(Debug, Clone)]
struct Attempt {
    connection: usize,
    protocol: Publishing,
    /// The next decoding event of the slot, from the attempt's start.
    next_event: usize,
    events: Vec<Decoded>,
    in_flight: VecDeque<usize>,
}

#[derive(Debug, Clone, Copy)]
enum Decoded {
    Row(usize),
    Commit(u64),
}

/// The budget of faults a run may inject.
#[derive(Debug, Clone, Copy, Hash)]
struct Faults {
    give_ups: u8,
    crashes: u8,
    server_restarts: u8,
    window_expiries: u8,
}

#[derive(Debug, Clone)]
struct World {
    /// The transaction each row belongs to; rows are numbered in commit order.
    transaction_of: Vec<usize>,
    window_size: usize,
    jetstream: JetStream,
    connections: Vec<Connection>,
    attempt: Attempt,
    slot_confirmed: u64,
    faults: Faults,
    /// What the process remembers across attempts (lost when it is killed).
    memory: Option<Duplicates>,
    /// Attempts ended while an id was staged: retrying outlasts the duplicate window, so
    /// after two the staged ids are gone (a fair scheduler: time passes).
    ended_while_staged: u8,
    /// Drive the protocol pgoutbox had before the id chain instead (see [`Legacy`]).
    legacy: Option<Legacy>,
}

/// The publish protocol up to 2026-11, transcribed to show that the model check catches
/// its loss: every message chained by `Nats-Expected-Last-Sequence`, a place counted by each
/// attempt; after any duplicate, the place moves back by one per message in flight, whose
/// answers are awaited and each sent again (`pipeline/resend.rs` then).
#[derive(Debug, Clone, Copy, Default)]
struct Legacy {
    expected: u64,
    resend_left: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Decode,
    Receive,
    /// The server executes the next write of this connection.
    Execute(usize),
    /// An abandoned connection's writes never land.
    Lose(usize),
    GiveUp,
    Crash,
    ServerRestart,
    WindowExpires,
}

impl Step {
    fn is_fault(self) -> bool {
        !matches!(self, Step::Decode | Step::Receive | Step::Execute(_))
    }
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
        let jetstream =
            JetStream { checks, stored: Vec::new(), last_id: None, window: HashMap::new() };
        let mut world = World {
            transaction_of,
            window_size,
            jetstream,
            connections: Vec::new(),
            attempt: Attempt {
                connection: 0,
                protocol: Publishing::new(
                    Start { lsn: 0, stream_sequence: 0, skip_through: None },
                    Duplicates::default(),
                ),
                next_event: 0,
                events: Vec::new(),
                in_flight: VecDeque::new(),
            },
            slot_confirmed: 0,
            faults,
            memory: Some(Duplicates::default()),
            ended_while_staged: 0,
            legacy: None,
        };
        world.start_attempt();
        world
    }

    fn position(&self, row: usize) -> Position {
        let transaction = self.transaction_of[row];
        let first = self.transaction_of.iter().position(|&t| t == transaction).unwrap_or(row);
        Position { commit_lsn: commit_lsn(transaction), index: (row - first) as u32 }
    }

    /// A new attempt: a new connection, the stream's tail read, the slot read from its
    /// confirmed position.
    fn start_attempt(&mut self) {
        let skip_through = self
            .jetstream
            .stored
            .last()
            .map(|&row| TailRow { position: self.position(row), msg_id: id_of(row) });
        let start = Start {
            lsn: self.slot_confirmed,
            stream_sequence: self.jetstream.stored.len() as u64,
            skip_through,
        };
        let duplicates = self.memory.take().unwrap_or_default();
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
        self.connections.push(Connection::default());
        self.attempt = Attempt {
            connection: self.connections.len() - 1,
            protocol: Publishing::new(start, duplicates),
            next_event: 0,
            events,
            in_flight: VecDeque::new(),
        };
    }

    /// The attempt ends; what it learned is kept unless the process dies.
    fn end_attempt(&mut self, crashed: bool) {
        self.confirm();
        let duplicates = self.attempt.protocol.take_duplicates();
        self.memory = (!crashed).then_some(duplicates);
        if self.jetstream.window.values().any(|&sequence| sequence == 0) {
            self.ended_while_staged += 1;
            if self.ended_while_staged == 2 {
                self.jetstream.window.retain(|_, sequence| *sequence != 0);
                self.ended_while_staged = 0;
            }
        }
        self.start_attempt();
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
        if attempt.next_event < attempt.events.len() && attempt.in_flight.len() < self.window_size {
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
        if self.faults.window_expiries > 0 && !self.jetstream.window.is_empty() {
            steps.push(Step::WindowExpires);
        }
        steps
    }

    fn apply(&mut self, step: Step) -> Result<(), Broken> {
        match step {
            Step::Decode => {
                let event = self.attempt.events[self.attempt.next_event];
                self.attempt.next_event += 1;
                match event {
                    Decoded::Row(row) => {
                        let position = self.position(row);
                        // One history: the tail's row is always where the tail says.
                        let step = self.attempt.protocol.on_row(position, Some(&id_of(row)));
                        if step.map_err(|err| err.to_string())? == RowStep::Publish {
                            let mut guard = self.attempt.protocol.guard().clone();
                            if let Some(legacy) = self.legacy.as_mut() {
                                guard = Guard::LastSequence(legacy.expected);
                                legacy.expected += 1;
                            }
                            self.current().to_server.push_back(Write { row, guard });
                            self.attempt.protocol.on_sent(id_of(row));
                            self.attempt.in_flight.push_back(row);
                        }
                    }
                    Decoded::Commit(end) => {
                        let timing = Timing { committed: 0, received: 0 };
                        self.attempt.protocol.on_commit(end, timing).map_err(|e| e.to_string())?;
                    }
                }
            }
            Step::Receive => {
                let answer = self.current().to_client.pop_front().ok_or("no answer")?;
                let row =
                    self.attempt.in_flight.pop_front().ok_or("an answer with nothing sent")?;
                let position = self.position(row);
                if let Some(legacy) = self.legacy.as_mut() {
                    if legacy.resend_left > 0 {
                        // A message chained behind a duplicate: sent again in place.
                        legacy.resend_left -= 1;
                        if matches!(answer, Answer::Stored { .. }) {
                            self.end_attempt(false);
                            return self.check_stream();
                        }
                        let guard = Guard::LastSequence(legacy.expected);
                        legacy.expected += 1;
                        self.attempt.in_flight.push_back(row);
                        self.current().to_server.push_back(Write { row, guard });
                        return self.check_stream();
                    }
                    if let Answer::Duplicate { .. } = answer {
                        let stale = self.attempt.in_flight.len();
                        legacy.expected -= 1 + stale as u64;
                        legacy.resend_left = stale;
                    }
                }
                let answer = match (self.legacy, answer) {
                    (Some(_), Answer::Duplicate { sequence }) => Answer::Stored { sequence },
                    _ => answer,
                };
                let mut outcome = self.attempt.protocol.on_answer(answer);
                if let Outcome::CheckDuplicate { sequence } = outcome {
                    // Ids are unique here: the older message is this row, stored before.
                    let index = usize::try_from(sequence).ok().and_then(|s| s.checked_sub(1));
                    let same_row = index.and_then(|i| self.jetstream.stored.get(i)) == Some(&row);
                    outcome = self.attempt.protocol.on_duplicate_origin(position, same_row);
                }
                match outcome {
                    Outcome::EndAttempt => self.end_attempt(false),
                    _ => self.confirm(),
                }
            }
            Step::Execute(i) => {
                let write = self.connections[i].to_server.pop_front().ok_or("nothing written")?;
                let answer = self.jetstream.process(&write);
                if i == self.attempt.connection {
                    self.connections[i].to_client.push_back(answer);
                }
            }
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
        }
        self.check_stream()
    }

    /// What the pipeline reports to Postgres, checked against the stream.
    fn confirm(&mut self) {
        self.slot_confirmed = self.slot_confirmed.max(self.attempt.protocol.confirmed());
    }

    /// Always: each row at most once, in commit order, and every confirmed row stored.
    fn check_stream(&self) -> Result<(), Broken> {
        let stored = &self.jetstream.stored;
        if stored.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(Broken::from(format!("stored twice or out of order: {stored:?}")));
        }
        for (row, &transaction) in self.transaction_of.iter().enumerate() {
            if end_lsn(transaction) <= self.slot_confirmed && !stored.contains(&row) {
                return Err(Broken::from(format!(
                    "confirmed {} past row {row}, which is not stored: {stored:?}",
                    self.slot_confirmed
                )));
            }
        }
        Ok(())
    }

    /// At the end: every row stored, none twice, in order.
    fn check_done(&self) -> Result<(), Broken> {
        let all: Vec<usize> = (0..self.transaction_of.len()).collect();
        match self.jetstream.stored == all {
            true => Ok(()),
            false => Err(Broken::from(format!("the stream holds {:?}", self.jetstream.stored))),
        }
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        format!("{self:?}").hash(&mut hasher);
        hasher.finish()
    }
}

/// A run that broke a promise, and how.
#[derive(Debug, PartialEq, Eq)]
struct Broken(String);

impl From<String> for Broken {
    fn from(why: String) -> Broken {
        Broken(why)
    }
}

impl From<&str> for Broken {
    fn from(why: &str) -> Broken {
        Broken(why.to_owned())
    }
}

const ALL_CHECKS: [Checks; 3] = [Checks::DedupeFirst, Checks::SequenceFirst, Checks::StagedIds];

#[test]
fn every_interleaving_of_late_writes_keeps_the_chain_whole() {
    let faults = Faults { give_ups: 2, crashes: 0, server_restarts: 0, window_expiries: 0 };
    for checks in ALL_CHECKS {
        // Three rows: one alone, then two in one transaction; two in flight at once.
        let world = World::new(vec![0, 1, 1], 2, checks, faults);
        let states = explore(world, 2_000_000).unwrap_or_else(|err| panic!("{checks:?}: {err:?}"));
        assert!(states > 1_000, "{checks:?}: only {states} states were explored");
    }
}

#[test]
fn kills_restarts_and_an_expired_window_keep_the_chain_whole() {
    let faults = Faults { give_ups: 1, crashes: 1, server_restarts: 1, window_expiries: 1 };
    for checks in ALL_CHECKS {
        let world = World::new(vec![0, 1], 2, checks, faults);
        explore(world, 2_000_000).unwrap_or_else(|err| panic!("{checks:?}: {err:?}"));
    }
}

#[test]
fn the_model_check_finds_the_loss_of_the_sequence_chain() {
    let faults = Faults { give_ups: 2, crashes: 0, server_restarts: 0, window_expiries: 0 };
    let mut world = World::new(vec![0, 1, 1], 2, Checks::DedupeFirst, faults);
    world.legacy = Some(Legacy::default());
    world.start_attempt();
    let Err(Broken(why)) = explore(world, 2_000_000) else {
        panic!("the sequence chain passed the model check");
    };
    eprintln!("{why}");
    assert!(why.contains("which is not stored") || why.contains("the stream holds"), "{why}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Longer runs, more faults, larger transactions and windows, steps picked at random.
    #[test]
    fn random_runs_keep_the_chain_whole(
        sizes in proptest::collection::vec(1usize..6, 1..8),
        window_size in 1usize..6,
        checks in prop::sample::select(ALL_CHECKS.to_vec()),
        give_ups in 0u8..6,
        crashes in 0u8..3,
        server_restarts in 0u8..3,
        window_expiries in 0u8..2,
        choices in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let transaction_of =
            sizes.iter().enumerate().flat_map(|(t, &n)| std::iter::repeat_n(t, n)).collect();
        let faults = Faults { give_ups, crashes, server_restarts, window_expiries };
        let world = World::new(transaction_of, window_size, checks, faults);
        prop_assert_eq!(play(world, &choices), Ok(()));
    }
}
