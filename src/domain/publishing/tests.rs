//! The publish protocol, answer by answer.

use super::*;

fn at(commit_lsn: u64) -> Position {
    Position { commit_lsn, index: 0 }
}

fn start(stream_sequence: u64) -> Publishing {
    let start = Start { lsn: 0, stream_sequence, skip_through: None };
    Publishing::new(start, Carried::default())
}

#[test]
fn the_first_message_is_anchored_by_sequence_and_the_rest_chained_by_id_and_sequence() {
    let mut p = start(41);
    assert_eq!(p.guard(), Guard { last_sequence: 41, last_msg_id: None });
    p.on_sent("a".into());
    assert_eq!(p.guard(), Guard { last_sequence: 42, last_msg_id: Some("a") });
    p.on_sent("b".into());
    assert_eq!(p.guard(), Guard { last_sequence: 43, last_msg_id: Some("b") });
}

#[test]
fn a_duplicate_just_behind_the_chain_is_already_in_place() {
    let mut p = start(41);
    p.on_sent("a".into());
    p.on_sent("b".into());
    p.on_commit(10, Timing { committed: 0, received: 0 }).unwrap();
    assert_eq!(p.on_answer(Answer::Duplicate { sequence: 42 }), Outcome::AlreadyInPlace);
    assert_eq!(p.on_answer(Answer::Stored { sequence: 43 }), Outcome::Stored);
    assert_eq!(p.confirmed(), 10);
}

#[test]
fn a_replay_elsewhere_takes_no_place_and_is_skipped_next_time() {
    let mut p = start(41);
    p.on_sent("a".into());
    p.on_sent("b".into());
    let outcome = p.on_answer(Answer::Duplicate { sequence: 7 });
    assert_eq!(outcome, Outcome::CheckDuplicate { sequence: 7 });
    assert_eq!(p.in_flight(), 2, "not counted before its origin is known");
    assert_eq!(p.on_duplicate_origin(at(5), true), Outcome::Replayed);
    // The message behind it, chained to the duplicate's id, is refused.
    assert_eq!(p.on_answer(Answer::NotStored), Outcome::EndAttempt);
    let next = Publishing::new(
        Start { lsn: 5, stream_sequence: 41, skip_through: None },
        p.take_carried(),
    );
    let mut next = next;
    assert_eq!(next.on_row(at(5), None), Ok(RowStep::Skip));
    assert_eq!(next.on_row(at(6), None), Ok(RowStep::Publish));
}

#[test]
fn a_collision_is_never_counted_as_published() {
    let mut p = start(41);
    p.on_sent("z".into());
    p.on_sent("a".into());
    p.on_commit(10, Timing { committed: 0, received: 0 }).unwrap();
    let outcome = p.on_answer(Answer::Duplicate { sequence: 7 });
    assert_eq!(outcome, Outcome::CheckDuplicate { sequence: 7 });
    assert_eq!(p.on_duplicate_origin(at(5), false), Outcome::EndAttempt, "z is in flight");
    assert_eq!(p.confirmed(), 0, "confirmed past a row that is not in the stream");
    let next = Publishing::new(
        Start { lsn: 0, stream_sequence: 41, skip_through: None },
        p.take_carried(),
    );
    let mut next = next;
    let step = next.on_row(at(5), None);
    assert_eq!(step, Ok(RowStep::Publish), "its dead letter goes in its place next time");
}

#[test]
fn nothing_is_confirmed_past_a_message_not_known_to_be_stored() {
    for answer in [Answer::NotStored, Answer::Staged] {
        let mut p = start(0);
        p.on_sent("a".into());
        p.on_commit(10, Timing { committed: 0, received: 0 }).unwrap();
        assert_eq!(p.on_answer(answer), Outcome::EndAttempt);
        assert_eq!(p.confirmed(), 0);
    }
}

const NO_TIMING: Timing = Timing { committed: 0, received: 0 };

fn from_tail(lsn: u64, tail: Position) -> Publishing {
    let skip_through = Some(TailRow { position: tail, msg_id: "t".into() });
    Publishing::new(Start { lsn, stream_sequence: 9, skip_through }, Carried::default())
}

#[test]
fn only_the_tails_transaction_is_skipped_in_part_and_only_up_to_a_row() {
    let p = from_tail(0, Position { commit_lsn: 5, index: 2 });
    assert!(p.skips_part_of(5));
    assert!(!p.skips_part_of(3) && !p.skips_part_of(6));
    let fresh = Start { lsn: 0, stream_sequence: 0, skip_through: None };
    assert!(!Publishing::new(fresh, Carried::default()).skips_part_of(5), "an empty stream");
    let end = TailRow {
        position: Position { commit_lsn: 5, index: 3 },
        msg_id: "transaction:s/0/5".into(),
    };
    let ended = Start { lsn: 0, stream_sequence: 9, skip_through: Some(end) };
    assert!(
        !Publishing::new(ended, Carried::default()).skips_part_of(5),
        "skipped whole, with its end"
    );
}

#[test]
fn rows_at_or_before_the_tail_are_skipped_once_the_tails_row_is_seen() {
    let tail = Position { commit_lsn: 5, index: 2 };
    let mut p = from_tail(0, tail);
    assert_eq!(p.on_row(Position { commit_lsn: 3, index: 0 }, Some("a")), Ok(RowStep::Skip));
    assert_eq!(p.on_commit(4, NO_TIMING), Ok(()));
    assert_eq!(p.on_keepalive(5), Ok(()));
    assert_eq!(p.confirmed(), 0, "confirmed a skip before the tail's row came");
    assert_eq!(p.on_row(Position { commit_lsn: 5, index: 1 }, Some("b")), Ok(RowStep::Skip));
    assert_eq!(p.on_row(tail, Some("t")), Ok(RowStep::Skip));
    assert_eq!(p.on_row(Position { commit_lsn: 5, index: 3 }, None), Ok(RowStep::Publish));
    assert_eq!(p.on_commit(6, NO_TIMING), Ok(()));
}

#[test]
fn a_slot_past_the_tail_without_its_row_is_another_history() {
    let tail = Position { commit_lsn: 5, index: 2 };
    let another_row = |p: &mut Publishing| p.on_row(tail, Some("other")).map(|_| ());
    let a_later_row =
        |p: &mut Publishing| p.on_row(Position { commit_lsn: 7, index: 0 }, None).map(|_| ());
    let its_commit_without_it = |p: &mut Publishing| {
        p.on_row(Position { commit_lsn: 5, index: 1 }, Some("b"))?;
        p.on_commit(6, NO_TIMING)
    };
    let a_keepalive_past_it = |p: &mut Publishing| p.on_keepalive(6);
    type Case<'a> = &'a dyn Fn(&mut Publishing) -> Result<(), TailNotInWal>;
    let cases: [Case; 4] =
        [&another_row, &a_later_row, &its_commit_without_it, &a_keepalive_past_it];
    for (i, case) in cases.iter().enumerate() {
        let mut p = from_tail(0, tail);
        let err = case(&mut p).expect_err(&format!("case {i}"));
        assert_eq!(err.tail.position, tail);
        assert_eq!(p.confirmed(), 0);
    }
}

#[test]
fn a_tail_below_the_slot_is_never_sent_again_and_needs_no_check() {
    let mut p = from_tail(10, Position { commit_lsn: 5, index: 2 });
    assert_eq!(p.on_row(Position { commit_lsn: 12, index: 0 }, None), Ok(RowStep::Publish));
    assert_eq!(p.on_keepalive(20), Ok(()));
}

#[test]
fn a_collision_alone_in_flight_is_replaced_by_its_letter_in_place() {
    let mut p = start(41);
    p.on_sent("a".into());
    assert_eq!(p.on_answer(Answer::Stored { sequence: 42 }), Outcome::Stored);
    p.on_sent("b".into());
    p.on_commit(10, NO_TIMING).unwrap();
    assert_eq!(
        p.on_answer(Answer::Duplicate { sequence: 7 }),
        Outcome::CheckDuplicate { sequence: 7 }
    );
    assert_eq!(p.on_duplicate_origin(at(5), false), Outcome::Collision);
    assert_eq!(p.send_limit(), 1, "one at a time after a duplicate");
    assert_eq!(
        p.guard(),
        Guard { last_sequence: 42, last_msg_id: Some("a") },
        "the letter goes where b would have"
    );
    p.on_sent("letter-b".into());
    assert_eq!(p.confirmed(), 0, "confirmed before the letter was stored");
    assert_eq!(p.on_answer(Answer::Stored { sequence: 43 }), Outcome::Stored);
    assert_eq!(p.confirmed(), 10);
    assert_eq!(p.guard(), Guard { last_sequence: 43, last_msg_id: Some("letter-b") });
    for sequence in 44..44 + CALM as u64 {
        assert_eq!(p.send_limit(), 1, "still one at a time at {sequence}");
        p.on_sent(format!("m{sequence}"));
        p.on_answer(Answer::Stored { sequence });
    }
    assert_eq!(p.send_limit(), 2, "the window grows by one per message stored");
}

#[test]
fn the_send_window_is_carried_to_the_next_attempt() {
    let mut p = start(41);
    p.on_sent("a".into());
    p.on_sent("b".into());
    p.on_answer(Answer::Duplicate { sequence: 7 });
    assert_eq!(p.on_duplicate_origin(at(5), false), Outcome::EndAttempt);
    let next = Publishing::new(
        Start { lsn: 0, stream_sequence: 41, skip_through: None },
        p.take_carried(),
    );
    assert_eq!(next.send_limit(), 1);
}
