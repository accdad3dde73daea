//! The runs checked: exhaustive over small cases, random over larger ones.

use proptest::prelude::*;

use super::jetstream::Checks;
use super::search::{explore, explore_live, play};
use super::{Broken, Faults, Legacy, World};

const ALL_CHECKS: [Checks; 5] = Checks::ALL;

/// Explores the world `world` makes for each check order; any broken promise fails the
/// test, naming the order.
fn in_every_check_order(world: impl Fn(Checks) -> World) {
    for checks in ALL_CHECKS {
        explore(world(checks), 2_000_000).unwrap_or_else(|err| panic!("{checks:?}: {err:?}"));
    }
}

#[test]
fn every_interleaving_of_late_writes_keeps_the_chain_whole() {
    let faults = Faults { give_ups: 2, ..Faults::NONE };
    for checks in ALL_CHECKS {
        // Three rows: one alone, then two in one transaction; two in flight at once.
        let world = World::new(vec![0, 1, 1], 2, checks, faults);
        let states = explore(world, 2_000_000).unwrap_or_else(|err| panic!("{checks:?}: {err:?}"));
        assert!(states > 1_000, "{checks:?}: only {states} states were explored");
    }
}

#[test]
fn kills_restarts_and_an_expired_window_keep_the_chain_whole() {
    let faults =
        Faults { give_ups: 1, crashes: 1, server_restarts: 1, window_expiries: 1, ..Faults::NONE };
    in_every_check_order(|checks| World::new(vec![0, 1], 2, checks, faults));
}

#[test]
fn the_model_check_finds_the_loss_of_the_sequence_chain() {
    let faults = Faults { give_ups: 2, ..Faults::NONE };
    let mut world = World::new(vec![0, 1, 1], 2, Checks::DedupeFirst, faults);
    world.legacy = Some(Legacy::default());
    world.start_attempt(false);
    let Err(Broken(why)) = explore(world, 2_000_000) else {
        panic!("the sequence chain passed the model check");
    };
    eprintln!("{why}");
    assert!(why.contains("which is not stored") || why.contains("the stream holds"), "{why}");
}

/// A row that reuses the tail's id, with rows behind it in flight (issue 28, F1): the id
/// guard alone let the next row be stored behind the refused duplicate.
#[test]
fn a_reused_tail_id_lets_no_later_row_pass_it() {
    let faults = Faults { give_ups: 1, window_expiries: 1, ..Faults::NONE };
    in_every_check_order(|checks| {
        World::with_ids(vec![0, 0, 1], vec![7, 1, 2], &[7], 3, checks, faults)
    });
}

/// Rows that reuse each other's ids and an old message's, with late writes and give-ups.
#[test]
fn every_interleaving_of_reused_ids_keeps_every_row() {
    let faults = Faults { give_ups: 2, ..Faults::NONE };
    in_every_check_order(|checks| {
        World::with_ids(vec![0, 1, 1], vec![5, 5, 6], &[6], 2, checks, faults)
    });
}

/// The id chain alone, as before issue 28: the model check finds F1's loss.
#[test]
fn the_model_check_finds_the_loss_of_the_id_chain_alone() {
    let faults = Faults::NONE;
    let mut world =
        World::with_ids(vec![0, 0, 1], vec![7, 1, 2], &[7], 3, Checks::DedupeFirst, faults);
    world.ids_only = true;
    let Err(Broken(why)) = explore(world, 2_000_000) else {
        panic!("the id chain alone passed the model check");
    };
    eprintln!("{why}");
    assert!(why.contains("the stream holds [Old(0), Row(1), Row(2)]"), "{why}");
}

/// Ids staged by refused publishes, on every replicated check order, expiring one at a time:
/// from every state reached with a give-up and a server restart (which forgets the last
/// id, so the next message is refused at apply, as after a leader change), the run without more faults ends with every
/// row stored, and no message sent after a "staged" answer stages its id anew (a protocol
/// that kept sending behind a staged id would stage the next ones, each attempt, and wait
/// for a duplicate window per window of rows).
#[test]
fn staged_ids_never_stall_the_stream() {
    let faults = Faults { give_ups: 1, server_restarts: 1, ..Faults::NONE };
    for checks in [Checks::StagedIds, Checks::StagedInProcess, Checks::ProposalTime] {
        let world = World::new(vec![0, 1, 2, 3], 2, checks, faults);
        explore_live(world, 2_000_000).unwrap_or_else(|err| panic!("{checks:?}: {err:?}"));
    }
}

/// Another writer stores messages in the stream between pgoutbox's: its next message is
/// refused, and the attempt after finds the rows it stored by the duplicate window.
#[test]
fn a_foreign_writer_never_makes_a_row_lost_doubled_or_out_of_order() {
    let faults = Faults { give_ups: 1, foreign_writes: 1, ..Faults::NONE };
    in_every_check_order(|checks| World::new(vec![0, 1, 1], 2, checks, faults));
}

/// Duplicate entries that expire one at a time, the oldest first, beside reused ids: a row
/// whose older namesake's entry ended is stored as itself, never twice.
#[test]
fn entries_expiring_one_at_a_time_keep_every_row() {
    let faults = Faults { give_ups: 1, oldest_expiries: 2, ..Faults::NONE };
    in_every_check_order(|checks| {
        World::with_ids(vec![0, 0, 1], vec![7, 1, 2], &[7], 2, checks, faults)
    });
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
        oldest_expiries in 0u8..4,
        foreign_writes in 0u8..3,
        choices in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let transaction_of =
            sizes.iter().enumerate().flat_map(|(t, &n)| std::iter::repeat_n(t, n)).collect();
        // A foreign message at the tail hides what the slot sent last: rows stored behind
        // it are found again by the duplicate window alone (docs/guarantees.md).
        let window_expiries = if foreign_writes > 0 { 0 } else { window_expiries };
        let oldest_expiries = if foreign_writes > 0 { 0 } else { oldest_expiries };
        let faults = Faults {
            give_ups,
            crashes,
            server_restarts,
            window_expiries,
            oldest_expiries,
            foreign_writes,
            forgets: 0,
            horizons: 0,
        };
        let world = World::new(transaction_of, window_size, checks, faults);
        prop_assert_eq!(play(world, &choices), Ok(()));
    }

    /// The same with ids drawn from a few, so that rows reuse each other's and old ones.
    #[test]
    fn random_runs_with_reused_ids_keep_every_row(
        rows in proptest::collection::vec((0usize..4, 0usize..5), 1..10),
        old in proptest::collection::vec(0usize..5, 0..3),
        window_size in 1usize..6,
        checks in prop::sample::select(ALL_CHECKS.to_vec()),
        give_ups in 0u8..4,
        crashes in 0u8..2,
        server_restarts in 0u8..2,
        window_expiries in 0u8..2,
        oldest_expiries in 0u8..3,
        choices in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut transaction_of: Vec<usize> = rows.iter().map(|&(t, _)| t).collect();
        transaction_of.sort();
        let ids = rows.iter().map(|&(_, id)| id).collect();
        let faults = Faults {
            give_ups,
            crashes,
            server_restarts,
            window_expiries,
            oldest_expiries,
            ..Faults::NONE
        };
        let world = World::with_ids(transaction_of, ids, &old, window_size, checks, faults);
        prop_assert_eq!(play(world, &choices), Ok(()));
    }
}
