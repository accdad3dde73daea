//! Where a message comes from, and when the stream's tail may be trusted to skip rows.
//!
//! Every message carries `Pgoutbox-Source: <system id>/<timeline>/<database>/<slot>`. On each
//! (re)start pgoutbox skips the rows the stream already holds, by the `Pgoutbox-Position` of
//! its last message. That skip is only sound when the tail was written from the *same
//! history* of the *same source*: another database writing the stream, a cluster restored
//! to an earlier point, or a promoted standby whose WAL forked before the tail all reuse WAL
//! positions for different rows, and skipping by them would lose rows silently. So the
//! rules below allow a skip only when the tail provably lies in our own past, and otherwise
//! skip nothing (the `Nats-Msg-Id` duplicate window still catches a quick replay).
//!
//! A copy of the cluster restored from a volume snapshot or a cold backup keeps its system
//! id and timeline, and once its WAL has grown past the tail nothing here tells it apart:
//! the skip is then only *provisional*. The slot sends the tail's own row again, and the
//! publish protocol (`publishing.rs`) confirms nothing it skipped until that row arrives at
//! the tail's position with the tail's id ([`TailRow::is_row`]); anything else proves
//! another history, and the next attempt skips nothing.
//!
//! Pure: no I/O. The caller reads the tail, `IDENTIFY_SYSTEM` and `TIMELINE_HISTORY`.

use std::fmt;

use crate::domain::outbox::DEAD_LETTER_ID_PREFIX;
use std::str::FromStr;

use crate::domain::progress::Position;

/// Header naming the [`Source`] of a message.
pub const SOURCE_HEADER: &str = "Pgoutbox-Source";

/// One writer of a stream: a database of a Postgres cluster read through one slot.
/// Two instances of the same writer (a hot standby) share it; its timeline changes with
/// each failover or point-in-time restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// `pg_control_system().system_identifier`: shared by a cluster, its physical standbys
    /// and restores of its base backups; different for a new cluster.
    pub system_id: u64,
    pub timeline: u32,
    pub database: String,
    pub slot: String,
}

impl Source {
    pub fn new(system_id: u64, timeline: u32, database: &str, slot: &str) -> Source {
        Source { system_id, timeline, database: header_safe(database), slot: header_safe(slot) }
    }

    /// The same writer, whatever the timeline.
    pub fn same_writer(&self, other: &Source) -> bool {
        self.system_id == other.system_id
            && self.database == other.database
            && self.slot == other.slot
    }

    /// The writer without its timeline, as it is named in the stream's claim and in errors.
    pub fn writer(&self) -> String {
        format!("{}/{}/{}", self.system_id, self.database, self.slot)
    }
}

/// Header values and log lines must not carry control characters (a database may be named
/// anything); they become `?`.
fn header_safe(name: &str) -> String {
    name.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}/{}", self.system_id, self.timeline, self.database, self.slot)
    }
}

impl FromStr for Source {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        let (system_id, rest) = s.split_once('/').ok_or(())?;
        let (timeline, rest) = rest.split_once('/').ok_or(())?;
        let (database, slot) = rest.rsplit_once('/').ok_or(())?;
        Ok(Source::new(
            system_id.parse().map_err(|_| ())?,
            timeline.parse().map_err(|_| ())?,
            database,
            slot,
        ))
    }
}

/// What the stream's last message says about where it came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TailOrigin {
    /// The raw `Pgoutbox-Source` header, if any.
    pub source: Option<String>,
    pub position: Option<Position>,
    /// Its `Nats-Msg-Id`.
    pub msg_id: Option<String>,
    /// Its `Pgoutbox-Table`: the table of the row it was published from.
    pub table: Option<String>,
    /// It carries `Pgoutbox-Emitted`: an emitted event, no table's row.
    pub emitted: bool,
    /// Written by a recovery from the table: its bound, epoch seconds (`service::seed`).
    pub seed_since: Option<String>,
    /// Written under the id chain (`publishing.rs`), which leaves no gap behind
    /// a message; earlier pgoutbox versions chained by sequence alone and could.
    pub chained: bool,
    /// What it holds of its row's payload.
    pub payload: crate::domain::seed::PayloadDigest,
    /// When the stream stored it, in milliseconds since the epoch (NATS's clock).
    pub stored_at_millis: i64,
    /// The stream sequence it is stored at: not the stream's last one when deliveries of
    /// scheduled rows came after it.
    pub sequence: u64,
}

/// The stream's last message, as the row it was published from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailRow {
    pub position: Position,
    pub msg_id: String,
}

impl TailRow {
    /// Whether the row decoded at the tail's position, whose id column reads `row_id`, is
    /// the one the tail was published from: as itself, or as its dead letter (named by the
    /// id, or by the position when the id could not name it).
    pub fn is_row(&self, row_id: Option<&str>) -> bool {
        let letter = self.msg_id.strip_prefix(DEAD_LETTER_ID_PREFIX);
        row_id.is_some_and(|id| self.msg_id == id || letter == Some(id))
            || letter == Some(self.position.to_string().as_str())
    }
}

impl fmt::Display for TailRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} at {}", self.msg_id, self.position)
    }
}

/// What the stream's tail means for this source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailVerdict {
    /// Rows at or before this row's position are in the stream already, provided the slot
    /// still holds this row there.
    SkipThrough(TailRow),
    /// Nothing may be skipped; the reason is worth a log line when there is one.
    NothingToSkip(Option<&'static str>),
    /// Another pgoutbox source wrote the tail.
    OtherWriter(Source),
}

/// Judges the stream's tail. `wal_end` is the server's current WAL position and `history`
/// our timeline's history (from `TIMELINE_HISTORY`; empty on timeline 1).
pub fn judge_tail(
    ours: &Source,
    wal_end: u64,
    history: &[TimelineSwitch],
    tail: &TailOrigin,
) -> TailVerdict {
    let Some(raw) = tail.source.as_deref() else {
        return TailVerdict::NothingToSkip(
            tail.position.map(
                |_| "the stream's last message names no source (written by an older pgoutbox)",
            ),
        );
    };
    let Ok(theirs) = raw.parse::<Source>() else {
        return TailVerdict::NothingToSkip(Some(
            "the stream's last message has an unreadable source",
        ));
    };
    if !ours.same_writer(&theirs) {
        return TailVerdict::OtherWriter(theirs);
    }
    let (Some(position), Some(msg_id)) = (tail.position, tail.msg_id.clone()) else {
        return TailVerdict::NothingToSkip(None);
    };
    let skip = TailVerdict::SkipThrough(TailRow { position, msg_id });
    if !tail.chained {
        return TailVerdict::NothingToSkip(Some(
            "the stream's last message was written by a pgoutbox that chained messages by \
             sequence alone, which could leave a gap behind it; nothing is skipped",
        ));
    }
    if position.commit_lsn > wal_end {
        return TailVerdict::NothingToSkip(Some(
            "the stream's last message lies beyond the server's WAL (a restore to an earlier \
             point?); nothing is skipped",
        ));
    }
    if theirs.timeline == ours.timeline {
        return skip;
    }
    // Written on an ancestor timeline: ours shares its WAL only up to where we branched off.
    let shared = theirs.timeline < ours.timeline
        && history
            .iter()
            .find(|switch| switch.timeline == theirs.timeline)
            .is_some_and(|switch| position.commit_lsn < switch.ended_at);
    if shared {
        skip
    } else {
        TailVerdict::NothingToSkip(Some(
            "the stream's last message was written on a timeline this server's history left \
             before it (a failover or restore); nothing is skipped",
        ))
    }
}

/// A message met looking back from the stream's end for pgoutbox's newest row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behind {
    /// Written by pgoutbox (or by anyone but the server's scheduler).
    Written(TailOrigin),
    /// Written by nats-server at a schedule's time (`Nats-Scheduler`), with its schedule's
    /// headers: as the schedule's row when the schedule was pgoutbox's, else as nothing.
    Delivered(TailOrigin),
    /// Deleted or purged: an expired TTL, a delivered schedule.
    Missing,
}

/// The look back from the stream's end for the row pgoutbox wrote last. The server writes
/// a scheduled row's delivery behind pgoutbox's back, after the rows pgoutbox wrote since,
/// and deletes the schedule, so the newest row is the highest position among the trailing
/// deliveries and the first message before them pgoutbox wrote; a missing message ends
/// the look back with what was seen (nothing seen: nothing to skip by).
#[derive(Debug, Default)]
pub struct TailSearch {
    newest: Option<TailOrigin>,
}

impl TailSearch {
    /// Takes the next message back; whether to read the one before it.
    pub fn look_back(&mut self, message: Behind) -> bool {
        let (origin, further) = match message {
            Behind::Missing => return false,
            Behind::Written(origin) => (origin, false),
            Behind::Delivered(origin) => (origin, true),
        };
        if self.newest.as_ref().is_none_or(|seen| origin.position > seen.position) {
            self.newest = Some(origin);
        }
        further
    }

    /// The newest row's origin.
    pub fn tail(self) -> TailOrigin {
        self.newest.unwrap_or_default()
    }
}

/// One line of a timeline history file: `timeline` ended at WAL position `ended_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineSwitch {
    pub timeline: u32,
    pub ended_at: u64,
}

/// Parses a timeline history file (`TIMELINE_HISTORY` content): lines of
/// `<parent timeline>\t<switch LSN>\t<reason>`; comments and blank lines are skipped.
/// An unreadable line is left out: a switch we cannot read only means fewer skips.
pub fn parse_timeline_history(content: &str) -> Vec<TimelineSwitch> {
    content
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let timeline = fields.next()?.parse().ok()?;
            let lsn: tokio_postgres::types::PgLsn = fields.next()?.parse().ok()?;
            Some(TimelineSwitch { timeline, ended_at: lsn.into() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(lsn: u64, msg_id: &str) -> TailOrigin {
        TailOrigin {
            position: Some(Position { commit_lsn: lsn, index: 0 }),
            msg_id: Some(msg_id.to_owned()),
            ..TailOrigin::default()
        }
    }

    fn search(behind: &[Behind]) -> (TailOrigin, usize) {
        let mut search = TailSearch::default();
        let read = 1 + behind.iter().take_while(|m| search.look_back((*m).clone())).count();
        (search.tail(), read.min(behind.len()))
    }

    #[test]
    fn the_tail_is_pgoutboxs_newest_row_past_the_deliveries_behind_it() {
        use Behind::{Delivered, Missing, Written};
        // Row 3 written after row 2's schedule; row 2 delivered behind it: row 3.
        let (tail, read) =
            search(&[Delivered(at(2, "2")), Written(at(3, "3")), Written(at(1, "1"))]);
        assert_eq!((tail, read), (at(3, "3"), 2));
        // Row 2's schedule was the last row; delivered and deleted: its delivery stands in.
        let (tail, read) = search(&[Delivered(at(2, "2")), Missing, Written(at(1, "1"))]);
        assert_eq!((tail, read), (at(2, "2"), 2));
        // Two deliveries out of their rows' order: the newer row.
        let (tail, _) = search(&[Delivered(at(1, "1")), Delivered(at(2, "2")), Missing]);
        assert_eq!(tail, at(2, "2"));
        // A delivery of a schedule that was not pgoutbox's names no row: looked past.
        let (tail, read) =
            search(&[Delivered(TailOrigin::default()), Written(at(5, "5")), Written(at(4, "4"))]);
        assert_eq!((tail, read), (at(5, "5"), 2));
        // No delivery: the last message, alone, as before.
        let (tail, read) = search(&[Written(at(7, "7")), Written(at(6, "6"))]);
        assert_eq!((tail, read), (at(7, "7"), 1));
        // The last message gone: nothing to skip by.
        let (tail, _) = search(&[Missing, Written(at(6, "6"))]);
        assert_eq!(tail, TailOrigin::default());
    }

    fn ours() -> Source {
        Source::new(7, 2, "app", "pgoutbox")
    }

    fn tail(source: &str, lsn: u64) -> TailOrigin {
        TailOrigin {
            source: Some(source.to_owned()),
            position: Some(Position { commit_lsn: lsn, index: 0 }),
            msg_id: Some("id-1".to_owned()),
            table: None,
            emitted: false,
            seed_since: None,
            chained: true,
            payload: Default::default(),
            stored_at_millis: 0,
            sequence: 9,
        }
    }

    fn skip_through(lsn: u64) -> TailVerdict {
        let position = Position { commit_lsn: lsn, index: 0 };
        TailVerdict::SkipThrough(TailRow { position, msg_id: "id-1".to_owned() })
    }

    #[test]
    fn source_round_trips_and_database_names_may_hold_slashes() {
        let s = Source::new(7301, 3, "a/b", "slot_1");
        assert_eq!(s.to_string(), "7301/3/a/b/slot_1");
        assert_eq!("7301/3/a/b/slot_1".parse::<Source>(), Ok(s.clone()));
        assert_eq!(s.writer(), "7301/a/b/slot_1");
        assert!("x/1/db/s".parse::<Source>().is_err());
        assert!("1/db".parse::<Source>().is_err());
    }

    #[test]
    fn control_characters_in_names_never_reach_a_header() {
        let s = Source::new(1, 1, "we\nird\r", "s");
        assert_eq!(s.database, "we?ird?");
    }

    #[test]
    fn our_own_tail_on_our_timeline_is_skipped_through() {
        let verdict = judge_tail(&ours(), 1_000, &[], &tail("7/2/app/pgoutbox", 500));
        assert_eq!(verdict, skip_through(500));
    }

    #[test]
    fn another_database_slot_or_cluster_is_another_writer() {
        for other in ["7/2/other/pgoutbox", "7/2/app/slot_b", "8/2/app/pgoutbox"] {
            let verdict = judge_tail(&ours(), 1_000, &[], &tail(other, 500));
            assert!(matches!(verdict, TailVerdict::OtherWriter(_)), "{other}: {verdict:?}");
        }
    }

    #[test]
    fn a_tail_beyond_the_servers_wal_is_another_history() {
        let verdict = judge_tail(&ours(), 400, &[], &tail("7/2/app/pgoutbox", 500));
        assert!(matches!(verdict, TailVerdict::NothingToSkip(Some(_))));
    }

    #[test]
    fn an_ancestor_timeline_counts_only_before_the_branch_point() {
        let history = [TimelineSwitch { timeline: 1, ended_at: 600 }];
        let before = judge_tail(&ours(), 1_000, &history, &tail("7/1/app/pgoutbox", 500));
        assert_eq!(before, skip_through(500));
        let after = judge_tail(&ours(), 1_000, &history, &tail("7/1/app/pgoutbox", 700));
        assert!(matches!(after, TailVerdict::NothingToSkip(Some(_))));
        let unknown = judge_tail(&ours(), 1_000, &[], &tail("7/1/app/pgoutbox", 500));
        assert!(matches!(unknown, TailVerdict::NothingToSkip(Some(_))));
        let newer = judge_tail(&ours(), 1_000, &history, &tail("7/3/app/pgoutbox", 500));
        assert!(matches!(newer, TailVerdict::NothingToSkip(Some(_))));
    }

    #[test]
    fn a_tail_without_a_readable_source_skips_nothing() {
        let legacy =
            TailOrigin { source: None, position: Some(Position::default()), ..tail("", 0) };
        assert!(matches!(judge_tail(&ours(), 1, &[], &legacy), TailVerdict::NothingToSkip(_)));
        let empty = TailOrigin::default();
        assert_eq!(judge_tail(&ours(), 1, &[], &empty), TailVerdict::NothingToSkip(None));
        let garbage = tail("not a source", 1);
        assert!(matches!(judge_tail(&ours(), 1, &[], &garbage), TailVerdict::NothingToSkip(_)));
    }

    #[test]
    fn a_tail_chained_by_sequence_alone_skips_nothing() {
        let unchained = TailOrigin { chained: false, ..tail("7/2/app/pgoutbox", 500) };
        let verdict = judge_tail(&ours(), 1_000, &[], &unchained);
        assert!(matches!(verdict, TailVerdict::NothingToSkip(Some(why)) if why.contains("gap")));
    }

    #[test]
    fn the_tail_row_is_known_by_its_id_or_its_dead_letter() {
        let position = Position { commit_lsn: 0x1_0000_00A0, index: 3 };
        let row = |msg_id: &str| TailRow { position, msg_id: msg_id.to_owned() };
        assert!(row("42").is_row(Some("42")));
        assert!(row("dead-letter:42").is_row(Some("42")));
        assert!(row("dead-letter:1/A0:3").is_row(None), "a letter named by its position");
        assert!(!row("42").is_row(Some("43")), "another row at the same place");
        assert!(!row("42").is_row(None));
        assert!(!row("dead-letter:1/A0:4").is_row(None));
    }

    #[test]
    fn timeline_history_files_parse_and_skip_noise() {
        let content = "# comment\n1\t0/3000158\tno recovery target specified\n\n\
                       2\t1/A0\tat restore point\nbad line\n";
        assert_eq!(
            parse_timeline_history(content),
            [
                TimelineSwitch { timeline: 1, ended_at: 0x3000158 },
                TimelineSwitch { timeline: 2, ended_at: 0x1_0000_00A0 },
            ]
        );
    }
}
