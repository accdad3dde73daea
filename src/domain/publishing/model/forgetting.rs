//! A server that forgets what it acknowledged (issue 46): nats-server syncs its file store
//! every 2 minutes by default, and a power loss loses what it stored since. The model's
//! server syncs at any step ([`Step::Sync`]) and may lose power ([`Step::Forget`]),
//! keeping only what it synced; every connection dies with it, and pgoutbox notices at a
//! later step ([`Step::Notice`]: a process paused across the restart, or busy elsewhere,
//! goes on deciding in between).
//!
//! The durability horizon is modelled as pgoutbox performs it (`domain::horizon`,
//! `service::pipeline::durability`), not as an oracle of the server's syncs: each
//! confirmable position waits on the newest message the stream acknowledged (its sequence
//! and position); once a horizon has passed since that acknowledgement
//! ([`Step::HorizonPasses`], which is also when the server, syncing at least once a
//! horizon, has synced what it stored before), a look asks the stream for that message
//! ([`Step::Look`]) and its answer, at a later step ([`Step::LookAnswered`]), either
//! releases every position up to it or ends the attempt. What waits is carried from one
//! attempt to the next, dropped at kill -9 and when the next start finds the stream
//! shorter than what was acknowledged. Then nothing confirmed is ever forgotten; the rule
//! by time alone ([`World::with_time_only_horizon`]) loses a row, and so does no horizon.

use std::collections::VecDeque;

use super::jetstream::Message;
use super::{Position, Step, World};

/// pgoutbox's side of the horizon: what waits, and the look in flight.
#[derive(Debug, Clone, Default)]
pub(super) struct Looked {
    /// Confirmable positions not yet released, oldest first.
    held: VecDeque<Held>,
    /// The look in flight: the message asked for, and the newest position it may release.
    look: Option<(Target, u64)>,
    /// The newest message this process saw acknowledged (`Memory::stored`).
    last_stored: Option<Target>,
    /// Released once a horizon has passed, without a look (the rule the look replaced).
    time_only: bool,
}

/// A message of the stream: its sequence and the position it was written from.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Target {
    sequence: usize,
    position: Position,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    lsn: u64,
    /// What it rests on; `None`: nothing of ours, so it waits by time alone.
    target: Option<Target>,
    /// A horizon has passed since the acknowledgement it rests on.
    ripe: bool,
}

impl World {
    /// Turns the durability horizon on: confirmed positions wait for a look.
    pub(super) fn with_horizon(mut self) -> World {
        self.horizon = Some(Looked::default());
        self
    }

    /// The horizon by pgoutbox's clock alone: released once a horizon passed.
    pub(super) fn with_time_only_horizon(mut self) -> World {
        self.horizon = Some(Looked { time_only: true, ..Looked::default() });
        self
    }

    /// `confirmable` may be confirmed: at once without a horizon, else once a look vouched
    /// for what it rests on.
    pub(super) fn offer(&mut self, confirmable: u64) {
        let Some(looked) = self.horizon.as_mut() else {
            self.slot_confirmed = self.slot_confirmed.max(confirmable);
            return;
        };
        let newest = looked.held.back().map_or(self.slot_confirmed, |held| held.lsn);
        if confirmable > newest {
            let target = looked.last_stored;
            looked.held.push_back(Held { lsn: confirmable, target, ripe: false });
        }
    }

    /// JetStream stored the message of the row at `position` at `sequence`.
    pub(super) fn stored_ack(&mut self, sequence: u64, position: Position) {
        if let Some(looked) = self.horizon.as_mut() {
            let sequence = usize::try_from(sequence).unwrap_or(usize::MAX);
            looked.last_stored = Some(Target { sequence, position });
        }
    }

    /// At an attempt's start: kill -9 forgets what waited; a stream shorter than what was
    /// acknowledged lost it (`Forgotten`), and what waited rested on it. A tail of ours is
    /// what the attempt's positions rest on until its first acknowledgement.
    pub(super) fn horizon_at_start(&mut self, crashed: bool) {
        self.unnoticed = false;
        let tail = self.jetstream.stored.len();
        let ours = self.jetstream.stored.last().and_then(|message| message.row());
        let tail_target = ours.map(|row| Target { sequence: tail, position: self.position(row) });
        let Some(looked) = self.horizon.as_mut() else { return };
        looked.look = None;
        let forgotten = looked.last_stored.is_some_and(|stored| stored.sequence > tail);
        if crashed || forgotten {
            looked.held.clear();
        }
        looked.last_stored = tail_target;
    }

    /// The steps the server's syncing and forgetting, time and the looks add.
    pub(super) fn horizon_steps(&self, steps: &mut Vec<Step>) {
        if self.faults.forgets > 0 && self.synced < self.jetstream.stored.len() {
            steps.extend([Step::Sync, Step::Forget]);
        }
        if self.unnoticed {
            steps.push(Step::Notice);
        }
        let Some(looked) = &self.horizon else { return };
        if self.faults.horizons > 0 && looked.held.iter().any(|held| !held.ripe) {
            steps.push(Step::HorizonPasses);
        }
        match looked.look {
            Some(_) => steps.push(Step::LookAnswered),
            None if looked.held.iter().any(|held| held.ripe && held.target.is_some()) => {
                steps.push(Step::Look)
            }
            None => {}
        }
    }

    pub(super) fn apply_horizon(&mut self, step: Step) {
        match step {
            Step::Sync => self.synced = self.jetstream.stored.len(),
            Step::Forget => {
                self.faults.forgets -= 1;
                self.forget();
            }
            Step::Notice => self.end_attempt(false),
            Step::HorizonPasses => self.horizon_passes(),
            Step::Look => self.look(),
            Step::LookAnswered => self.look_answered(),
            _ => unreachable!("not a step of the horizon: {step:?}"),
        }
    }

    /// The server restarts with what it synced; its connections die, and pgoutbox has not
    /// noticed yet.
    fn forget(&mut self) {
        self.jetstream.forget_after(self.synced);
        for connection in &mut self.connections {
            connection.to_server.clear();
            connection.to_client.clear();
        }
        self.unnoticed = true;
    }

    /// A horizon passes: the server has synced what it stored before (it syncs at least
    /// once a horizon), and every waiting position is ripe; by time alone, released.
    fn horizon_passes(&mut self) {
        self.faults.horizons -= 1;
        self.synced = self.jetstream.stored.len();
        let Some(looked) = self.horizon.as_mut() else { return };
        for held in &mut looked.held {
            held.ripe = true;
        }
        let mut released = None;
        while let Some(held) = looked.held.front() {
            if !(looked.time_only || held.target.is_none()) {
                break;
            }
            released = Some(held.lsn);
            looked.held.pop_front();
        }
        if let Some(lsn) = released {
            self.slot_confirmed = self.slot_confirmed.max(lsn);
        }
    }

    /// Asks the stream for the newest ripe position's message.
    fn look(&mut self) {
        let Some(looked) = self.horizon.as_mut() else { return };
        let ripe = looked.held.iter().take_while(|held| held.ripe);
        let newest = ripe.filter_map(|held| Some((held.target?, held.lsn))).last();
        looked.look = newest;
    }

    /// The stream still holds the message at the sequence asked for, written from the same
    /// position: every ripe position up to the look's is released. Anything else: the
    /// stream lost an acknowledged message, and the attempt ends.
    fn look_answered(&mut self) {
        let Some((target, lsn)) = self.horizon.as_mut().and_then(|looked| looked.look.take())
        else {
            return;
        };
        let message = self.jetstream.stored.get(target.sequence.wrapping_sub(1)).copied();
        let position = message.and_then(Message::row).map(|row| self.position(row));
        if position != Some(target.position) {
            self.end_attempt(false);
            return;
        }
        let Some(looked) = self.horizon.as_mut() else { return };
        while looked.held.front().is_some_and(|held| held.ripe && held.lsn <= lsn) {
            looked.held.pop_front();
        }
        self.slot_confirmed = self.slot_confirmed.max(lsn);
    }
}

#[cfg(test)]
mod tests {
    use super::super::jetstream::Checks;
    use super::super::search::explore;
    use super::super::{Broken, Faults};
    use super::*;

    /// Rows in flight, kill -9, a power loss at any step noticed at any later step, and a
    /// horizon passing at any step, in every check order: behind the horizon every row is
    /// stored once, in order, and nothing confirmed is lost.
    #[test]
    fn a_server_that_forgets_its_unsynced_tail_loses_nothing_behind_the_horizon() {
        every_check_order(Faults { forgets: 1, crashes: 1, horizons: 2, ..Faults::NONE });
    }

    /// Three rows behind the horizon with `faults`, in every check order: no promise
    /// broken, and a search wide enough to mean it.
    fn every_check_order(faults: Faults) {
        for checks in Checks::ALL {
            let world = World::new(vec![0, 1, 1], 2, checks, faults).with_horizon();
            let states =
                explore(world, 4_000_000).unwrap_or_else(|err| panic!("{checks:?}: {err:?}"));
            eprintln!("{checks:?}: {states} states");
            assert!(states > 1_000, "{checks:?}: only {states} states");
        }
    }

    /// The same with an attempt given up (its connection's writes landing late or never)
    /// instead of kill -9: what waits is carried to the next attempt.
    #[test]
    fn an_attempt_given_up_across_a_power_loss_loses_nothing_behind_the_horizon() {
        every_check_order(Faults { forgets: 1, give_ups: 1, horizons: 2, ..Faults::NONE });
    }

    /// Two power losses, one after another's refill.
    #[test]
    fn two_power_losses_lose_nothing_behind_the_horizon() {
        let faults = Faults { forgets: 2, horizons: 2, ..Faults::NONE };
        for checks in Checks::ALL {
            let world = World::new(vec![0, 1, 2], 2, checks, faults).with_horizon();
            explore(world, 4_000_000).unwrap_or_else(|err| panic!("{checks:?}: {err:?}"));
        }
    }

    /// Without the horizon the slot is confirmed past what the server then forgets.
    #[test]
    fn the_model_check_finds_the_loss_without_a_horizon() {
        let faults = Faults { forgets: 1, ..Faults::NONE };
        let world = World::new(vec![0, 1], 2, Checks::DedupeFirst, faults);
        let Err(Broken(why)) = explore(world, 2_000_000) else {
            panic!("a forgetful server without a horizon passed the model check");
        };
        eprintln!("{why}");
        assert!(why.contains("which is not stored") && why.contains("Forget"), "{why}");
    }

    /// By pgoutbox's clock alone, a position is released once a horizon passed, though the
    /// server lost its message in between and pgoutbox has not noticed yet (a process
    /// paused across the restart): the look is what keeps it.
    #[test]
    fn the_model_check_finds_the_loss_of_the_rule_by_time_alone() {
        let faults = Faults { forgets: 1, horizons: 1, ..Faults::NONE };
        let world = World::new(vec![0, 1], 2, Checks::DedupeFirst, faults);
        let Err(Broken(why)) = explore(world.with_time_only_horizon(), 2_000_000) else {
            panic!("the horizon by time alone passed the model check");
        };
        eprintln!("{why}");
        assert!(why.contains("which is not stored") && why.contains("HorizonPasses"), "{why}");
    }

    #[test]
    fn forgetting_and_time_are_faults_and_looking_is_progress() {
        assert!(Step::Forget.is_fault() && Step::Sync.is_fault());
        assert!(Step::HorizonPasses.is_fault());
        assert!(!Step::Look.is_fault() && !Step::LookAnswered.is_fault());
        assert!(!Step::Notice.is_fault());
    }
}
