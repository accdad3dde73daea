use super::*;

const HEALTHY: SlotFound = SlotFound { lost: false, pgoutput: true, active: false };
const LOST: SlotFound = SlotFound { lost: true, ..HEALTHY };

fn found(slot: Option<SlotFound>) -> Found {
    Found {
        slot,
        seed: None,
        recreate: false,
        forgotten: false,
        seed_slot_left: false,
        stream_empty: false,
        written_before: true,
    }
}

#[test]
fn a_healthy_slot_is_kept_whatever_was_asked() {
    let keep = |drop_seed_slot, nothing_to_seed| SlotPlan::Keep { drop_seed_slot, nothing_to_seed };
    assert_eq!(plan(&found(Some(HEALTHY))), keep(false, false));
    let recover = Found { seed: Some(SeedKind::Recover), ..found(Some(HEALTHY)) };
    assert_eq!(plan(&recover), keep(false, true), "nothing to seed");
    let left = Found { seed_slot_left: true, ..found(Some(HEALTHY)) };
    assert_eq!(plan(&left), keep(true, false), "a finished seed's slot");
}

#[test]
fn a_lost_slot_is_never_made_again_unasked() {
    assert_eq!(plan(&found(Some(LOST))), SlotPlan::Refuse(Refusal::Lost));
    let recreate = Found { recreate: true, ..found(Some(LOST)) };
    assert_eq!(plan(&recreate), SlotPlan::DropLostAndCreate);
    let recover = Found { seed: Some(SeedKind::Recover), ..found(Some(LOST)) };
    assert_eq!(plan(&recover), SlotPlan::Seed(SeedKind::Recover, Dropped::Lost));
    // Lost wins over a foreign plugin: the slot is unusable either way.
    let foreign = Found { slot: Some(SlotFound { pgoutput: false, ..LOST }), ..found(None) };
    assert_eq!(plan(&foreign), SlotPlan::Refuse(Refusal::Lost));
}

#[test]
fn a_stream_that_forgot_is_seeded_again_from_the_table() {
    let forgot = Found { seed: Some(SeedKind::Recover), forgotten: true, ..found(Some(HEALTHY)) };
    assert_eq!(plan(&forgot), SlotPlan::Seed(SeedKind::Recover, Dropped::Forgotten));
}

#[test]
fn a_slot_of_another_plugin_is_refused() {
    let foreign = found(Some(SlotFound { pgoutput: false, ..HEALTHY }));
    assert_eq!(plan(&foreign), SlotPlan::Refuse(Refusal::NotPgoutput));
}

#[test]
fn a_backfill_into_an_empty_stream_makes_an_idle_slot_again() {
    let backfill =
        Found { seed: Some(SeedKind::Backfill), stream_empty: true, ..found(Some(HEALTHY)) };
    assert_eq!(plan(&backfill), SlotPlan::Seed(SeedKind::Backfill, Dropped::EmptyStream));
    let streaming = Found { slot: Some(SlotFound { active: true, ..HEALTHY }), ..backfill };
    let keep = SlotPlan::Keep { drop_seed_slot: false, nothing_to_seed: true };
    assert_eq!(plan(&streaming), keep, "another streams from it");
    let written = Found { stream_empty: false, ..backfill };
    assert_eq!(plan(&written), keep);
}

#[test]
fn a_missing_slot_is_created_only_where_nothing_can_have_been_skipped() {
    assert_eq!(plan(&found(None)), SlotPlan::Refuse(Refusal::Missing));
    let fresh = Found { written_before: false, ..found(None) };
    assert_eq!(plan(&fresh), SlotPlan::Create { anew: false });
    let recreate = Found { recreate: true, ..found(None) };
    assert_eq!(plan(&recreate), SlotPlan::Create { anew: true });
    let recover = Found { seed: Some(SeedKind::Recover), ..found(None) };
    assert_eq!(plan(&recover), SlotPlan::Seed(SeedKind::Recover, Dropped::Nothing));
    let under_way = Found { seed_slot_left: true, ..found(None) };
    assert_eq!(plan(&under_way), SlotPlan::Seed(SeedKind::Recover, Dropped::NothingSeedUnderWay));
}
