//! A server that forgets what it acknowledged (issue 46): nats-server syncs its file store
//! every 2 minutes by default, and a power loss loses what it stored since. The model's
//! server syncs at any step ([`Step::Sync`]: the interval passed) and may lose power
//! ([`Step::Forget`]), keeping only what it synced; every connection dies with it and
//! pgoutbox starts a new attempt.
//!
//! With a durability horizon as long as the sync interval, a position is confirmed only
//! once the acknowledgements it rests on are older than the horizon, so synced: here, once
//! the server synced as many messages as the stream held when the position became
//! confirmable (`domain::horizon` does it by looking at the stream a horizon after the
//! acknowledgement). Then nothing confirmed is ever forgotten, and the next attempt
//! publishes again, from the slot, what the server lost. Without the horizon the check
//! finds the loss.

use super::{Step, World};

impl World {
    /// Turns the durability horizon on: confirmed positions wait for the server's sync.
    pub(super) fn with_horizon(mut self) -> World {
        self.horizon = Some(Default::default());
        self
    }

    /// The position the slot may be confirmed to, given that `confirmable` is: all of it
    /// without a horizon, else what rests on synced acknowledgements.
    pub(super) fn through_horizon(&mut self, confirmable: u64) -> u64 {
        let Some(held) = self.horizon.as_mut() else { return confirmable };
        if held.back().is_none_or(|&(lsn, _)| confirmable > lsn) && confirmable > 0 {
            held.push_back((confirmable, self.acked_len));
        }
        let mut released = 0;
        while let Some(&(lsn, stored)) = held.front() {
            if stored > self.synced {
                break;
            }
            released = lsn;
            held.pop_front();
        }
        released
    }

    /// [`Step::Forget`]: the server restarts with what it synced; its connections die.
    pub(super) fn forget(&mut self) {
        self.jetstream.forget_after(self.synced);
        for connection in &mut self.connections {
            connection.to_server.clear();
            connection.to_client.clear();
        }
        self.end_attempt(false);
    }
}

#[cfg(test)]
mod tests {
    use super::super::jetstream::Checks;
    use super::super::search::explore;
    use super::super::{Broken, Faults};
    use super::*;

    /// Rows in flight, kill -9 and give-ups, and a power loss at any step, in every check
    /// order: behind the horizon every row is stored once, in order, and nothing confirmed
    /// is lost.
    #[test]
    fn a_server_that_forgets_its_unsynced_tail_loses_nothing_behind_the_horizon() {
        let faults = Faults { forgets: 1, crashes: 1, give_ups: 1, ..Faults::NONE };
        for checks in Checks::ALL {
            let world = World::new(vec![0, 1, 1], 2, checks, faults).with_horizon();
            let states =
                explore(world, 2_000_000).unwrap_or_else(|err| panic!("{checks:?}: {err:?}"));
            assert!(states > 1_000, "{checks:?}: only {states} states");
        }
    }

    /// Two power losses, one after another's refill.
    #[test]
    fn two_power_losses_lose_nothing_behind_the_horizon() {
        let faults = Faults { forgets: 2, ..Faults::NONE };
        for checks in Checks::ALL {
            let world = World::new(vec![0, 1, 2], 2, checks, faults).with_horizon();
            explore(world, 2_000_000).unwrap_or_else(|err| panic!("{checks:?}: {err:?}"));
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

    #[test]
    fn forgetting_is_a_fault_and_syncing_is_time() {
        assert!(Step::Forget.is_fault() && Step::Sync.is_fault());
    }
}
