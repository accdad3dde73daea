//! What `setup` (and `run` before streaming) does with the slot: a decision over what it
//! found, without I/O, so that each way through is a unit test. A slot that vanished or
//! was lost means events may have been skipped: it is made again only when the operator
//! asked for it, or behind a seed from the table.

use crate::service::seed::SeedKind;

/// The slot as Postgres shows it, in the terms the decision needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotFound {
    /// `wal_status = 'lost'`: the WAL it needs is gone, the slot unusable.
    pub lost: bool,
    pub pgoutput: bool,
    /// A walsender streams from it now.
    pub active: bool,
}

/// What was found, and what the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub slot: Option<SlotFound>,
    /// `run --recover` or `--backfill`.
    pub seed: Option<SeedKind>,
    /// `--recreate-slot`.
    pub recreate: bool,
    /// The stream forgot acknowledged events the slot confirmed past (looked at only for a
    /// `--recover` with an inactive slot).
    pub forgotten: bool,
    /// The slot of a seed is left over: one was under way, or finished and cut off.
    pub seed_slot_left: bool,
    pub stream_empty: bool,
    /// This source wrote the stream before (its claim and a message, or, before claims,
    /// its position in the tail).
    pub written_before: bool,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotPlan {
    /// Use the slot as it is; drop a finished seed's left-over slot; say that the seed
    /// asked for has nothing to do.
    Keep {
        drop_seed_slot: bool,
        nothing_to_seed: bool,
    },
    /// Create the slot; `anew`: this source wrote the stream before, and the operator asked.
    Create {
        anew: bool,
    },
    /// Seed the stream from the table (which creates the slot), after dropping the slot
    /// for the reason given.
    Seed(SeedKind, Dropped),
    /// Drop the lost slot and create it again, as the operator asked.
    DropLostAndCreate,
    Refuse(Refusal),
}

/// Why a slot is dropped before a seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// None to drop: the slot is missing.
    Nothing,
    /// A seed was under way when pgoutbox stopped: finished as a recovery.
    NothingSeedUnderWay,
    Lost,
    /// The stream forgot what the slot confirmed past.
    Forgotten,
    /// A new, empty stream to backfill behind an existing slot.
    EmptyStream,
}

/// Why setup stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The slot is lost, and neither a seed nor `--recreate-slot` was asked for.
    Lost,
    NotPgoutput,
    /// The slot is missing although this source wrote the stream before.
    Missing,
}

/// The decision, in order: a lost slot, a stream that forgot, a foreign plugin, an empty
/// stream to backfill, then a slot kept; without a slot, a seed asked for or under way, or
/// a new slot where nothing can have been skipped.
pub fn plan(found: &Found) -> SlotPlan {
    let Some(slot) = found.slot else { return plan_without_slot(found) };
    match found.seed {
        _ if slot.lost => match (found.seed, found.recreate) {
            (Some(seed), _) => SlotPlan::Seed(seed, Dropped::Lost),
            (None, true) => SlotPlan::DropLostAndCreate,
            (None, false) => SlotPlan::Refuse(Refusal::Lost),
        },
        Some(seed) if found.forgotten => SlotPlan::Seed(seed, Dropped::Forgotten),
        _ if !slot.pgoutput => SlotPlan::Refuse(Refusal::NotPgoutput),
        Some(SeedKind::Backfill) if !slot.active && found.stream_empty => {
            SlotPlan::Seed(SeedKind::Backfill, Dropped::EmptyStream)
        }
        _ => SlotPlan::Keep {
            drop_seed_slot: found.seed_slot_left,
            nothing_to_seed: found.seed.is_some(),
        },
    }
}

fn plan_without_slot(found: &Found) -> SlotPlan {
    match found.seed {
        Some(seed) => SlotPlan::Seed(seed, Dropped::Nothing),
        None if found.seed_slot_left => {
            SlotPlan::Seed(SeedKind::Recover, Dropped::NothingSeedUnderWay)
        }
        None if found.written_before && !found.recreate => SlotPlan::Refuse(Refusal::Missing),
        None => SlotPlan::Create { anew: found.written_before },
    }
}

#[cfg(test)]
mod tests;
