//! NATS's per-message controls a row may set: `Nats-TTL` from `--ttl-column`, delayed
//! delivery (`Nats-Schedule`) from `--schedule-column`, and the `Nats-` headers
//! `--allow-nats-header` lets the headers column set.
//!
//! Any other `Nats-` header in a row is a dead letter: the server acts on them. Some can
//! never be allowed, since they would undo the publish protocol (`domain/publishing.rs`):
//! `Nats-Msg-Id` and `Nats-Expected-*` are pgoutbox's guard, `Nats-Rollup` purges the
//! stream's tail, `Nats-Trace-Only` keeps a message from being stored, the batch and counter
//! headers change what an ack means; `Nats-TTL` and `Nats-Schedule*` have their own
//! columns, since pgoutbox must know of them (a schedule's subject, the messages the server
//! writes at its time: `nats::publisher`'s tail).

use super::dead_letter::shorten;
use super::{
    Headers, MAX_SUBJECT_BYTES, Rejection, RowMapping, SHOWN_VALUE_BYTES, check_subject_token, utf8,
};
use crate::domain::progress::Position;
use crate::domain::row::ColumnValue;

/// The header holding a message's time to live (nats-server 2.11+, `allow_msg_ttl`).
pub const TTL_HEADER: &str = "Nats-TTL";
/// The header holding when a scheduled message is delivered (nats-server 2.12+, ADR-51,
/// the stream's `allow_msg_schedules`): `@at <RFC 3339 time>`.
pub const SCHEDULE_HEADER: &str = "Nats-Schedule";
/// The subject the server delivers a scheduled message to, in the same stream.
pub const SCHEDULE_TARGET_HEADER: &str = "Nats-Schedule-Target";
/// A scheduled message's TTL: the server gives it to the message it delivers as `Nats-TTL`.
pub const SCHEDULE_TTL_HEADER: &str = "Nats-Schedule-TTL";
/// Set by the server on the message it delivers at a schedule's time: the schedule's
/// subject. The delivered message keeps the schedule's other headers but not its
/// `Nats-Msg-Id` or `Nats-Expected-*` (tried on 2.12.8).
pub const SCHEDULER_HEADER: &str = "Nats-Scheduler";
/// On a scheduled row: its `Nats-Msg-Id`, which its delivery keeps under this name, so that
/// a consumer dedups the delivered event by the row's id as it does any other.
pub const EVENT_ID_HEADER: &str = "Pgoutbox-Event-Id";

/// `--schedule-column`: a row whose column holds a time is held by the stream and delivered
/// to its subject then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleColumn {
    pub column: String,
    /// A held row's message goes to `<subject_prefix>.<its Nats-Msg-Id>.<its position>`
    /// ([`held_at`]): consumers of the events' subjects must not see it before its time.
    pub subject_prefix: String,
}

/// Room [`held_at`] takes after a held message's subject: a dot and a position
/// (`FFFFFFFF/FFFFFFFF:4294967295`).
pub const HELD_POSITION_BYTES: usize = 29;

impl ScheduleColumn {
    /// The subject that holds the schedule of the message `msg_id`, before [`held_at`]
    /// makes it the event's own.
    pub fn subject(&self, msg_id: &str) -> String {
        format!("{}.{msg_id}", self.subject_prefix)
    }

    /// The `Nats-Msg-Id` of the schedule a delivered message came from, read from its
    /// `Nats-Scheduler` header; `None` when that subject is not one of ours. Schedules held
    /// before the position was added (`<prefix>.<id>`) are read too.
    pub fn msg_id_of_scheduler<'a>(&self, scheduler: &'a str) -> Option<&'a str> {
        let held = scheduler.strip_prefix(self.subject_prefix.as_str())?.strip_prefix('.')?;
        let with_position = held.rsplit_once('.').filter(|(_, p)| p.parse::<Position>().is_ok());
        Some(with_position.map_or(held, |(msg_id, _)| msg_id))
    }
}

/// The subject a held message (one with `Nats-Schedule`) waits on, made the event's own by
/// its position: nats-server keeps one schedule per subject, and a message on that subject
/// replaces it, so a second row with the same id (a table truncated with its sequence
/// restarted, a restore) would cancel the first's schedule (issue 45, R2). The same row
/// decoded again keeps its position, and so its subject.
pub fn held_at(subject: &mut String, headers: &super::Headers, position: Position) {
    use std::fmt::Write;
    if headers.get(SCHEDULE_HEADER).is_some() {
        let _ = write!(subject, ".{position}");
    }
}

impl RowMapping {
    /// `--ttl-column`: the row's time to live, as the header the server reads it from.
    pub(super) fn set_ttl(
        &self,
        tuple: &[ColumnValue],
        headers: &mut Headers,
    ) -> Result<(), Rejection> {
        let Some(i) = self.ttl else { return Ok(()) };
        let (ColumnValue::Text(value) | ColumnValue::Binary(value)) = &tuple[i] else {
            return Ok(());
        };
        let ttl = ttl_value(utf8(value, || self.name(i))?)
            .map_err(|Rejection(why)| Rejection(format!("column {}: {why}", self.name(i))))?;
        // A held row's TTL is its delivered message's (ADR-51's `Nats-Schedule-TTL`), not its
        // schedule's, which would expire before its time.
        let held = self.schedule.as_ref().is_some_and(|(s, _)| {
            matches!(&tuple[*s], ColumnValue::Text(_) | ColumnValue::Binary(_))
        });
        headers.insert(if held { SCHEDULE_TTL_HEADER } else { TTL_HEADER }, &ttl);
        Ok(())
    }

    /// `--schedule-column`: a row with a time is held until then on a subject of its own
    /// (returned), its schedule's headers naming when and the event's `subject`; the row's
    /// id is `text`, its message id `id`.
    pub(super) fn hold_until_due(
        &self,
        tuple: &[ColumnValue],
        text: &str,
        id: &str,
        subject: &str,
        headers: &mut Headers,
    ) -> Result<Option<String>, Rejection> {
        let Some((i, schedule)) = &self.schedule else { return Ok(None) };
        let (ColumnValue::Text(value) | ColumnValue::Binary(value)) = &tuple[*i] else {
            return Ok(None);
        };
        let at = schedule_value(utf8(value, || self.name(*i))?)
            .map_err(|Rejection(why)| Rejection(format!("column {}: {why}", self.name(*i))))?;
        let held_on = schedule.subject(id);
        if !held_on.split('.').all(|token| check_subject_token(token).is_ok())
            || held_on.len() + HELD_POSITION_BYTES > MAX_SUBJECT_BYTES
        {
            return Err(Rejection(format!(
                "column {} = {:?} cannot name the subject a scheduled row is held on \
                 ({held_on:?}: an id with an empty token, whitespace, `*` or `>`, or too long)",
                self.name(self.id),
                shorten(text, SHOWN_VALUE_BYTES)
            )));
        }
        headers.insert(SCHEDULE_HEADER, &at);
        headers.insert(SCHEDULE_TARGET_HEADER, subject);
        // The event's id, as a consumer keys it: a replay's copy is the same event.
        headers.insert(EVENT_ID_HEADER, &format!("{}{text}", self.id_qualifier));
        Ok(Some(held_on))
    }
}

/// Names (lowercase, a trailing `*` for a prefix) `--allow-nats-header` refuses, and why.
const NEVER_ALLOWED: [(&str, &str); 9] = [
    ("nats-msg-id", "it is the row's id, pgoutbox's own"),
    ("nats-expected-*", "pgoutbox chains every message with these"),
    ("nats-rollup", "it purges messages, the stream's tail among them"),
    ("nats-trace-only", "the message would not be stored"),
    ("nats-batch-*", "pgoutbox publishes one message at a time"),
    ("nats-incr", "counters are not events"),
    ("nats-required-api-level", "pgoutbox checks the server itself"),
    ("nats-schedule*", "use --schedule-column"),
    ("nats-ttl", "use --ttl-column"),
];

/// Why `name` cannot be in `--allow-nats-header`, if it cannot.
pub fn refuse_allowed(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if !lower.starts_with("nats-") || !super::headers::valid_name(name) {
        return Some(format!("{name:?} is not a header name starting with Nats-"));
    }
    NEVER_ALLOWED.iter().find_map(|(never, why)| {
        let matches = match never.strip_suffix('*') {
            Some(prefix) => lower.starts_with(prefix),
            None => lower == *never,
        };
        matches.then(|| format!("{name} cannot be allowed: {why}"))
    })
}

/// A TTL column's value as `Nats-TTL` sends it (whole seconds, or `never`), or why it
/// cannot be one. Taken: `never`, whole seconds (an integer column), or a duration in
/// whole seconds, minutes and hours such as `90s`, `10m`, `1h30m`; at least one second,
/// as nats-server requires. Checked here so that a bad value is a dead letter saying so
/// rather than a publish the server refuses.
pub fn ttl_value(text: &str) -> Result<String, Rejection> {
    let text = text.trim();
    let invalid = || {
        Rejection(format!(
            "{:?} is not a TTL: give whole seconds (e.g. 30), a duration such as 90s, 10m or \
             1h30m, or never",
            super::dead_letter::shorten(text, 64)
        ))
    };
    if text.eq_ignore_ascii_case("never") {
        return Ok("never".into());
    }
    let seconds = match text.parse::<u64>() {
        Ok(seconds) => seconds,
        Err(_) => {
            let mut total: u64 = 0;
            let mut number = String::new();
            for c in text.chars() {
                match c {
                    '0'..='9' => number.push(c),
                    's' | 'm' | 'h' if !number.is_empty() => {
                        let unit = match c {
                            's' => 1,
                            'm' => 60,
                            _ => 3_600,
                        };
                        let n: u64 = number.parse().map_err(|_| invalid())?;
                        total = n
                            .checked_mul(unit)
                            .and_then(|s| total.checked_add(s))
                            .ok_or_else(invalid)?;
                        number.clear();
                    }
                    _ => return Err(invalid()),
                }
            }
            if !number.is_empty() || text.is_empty() {
                return Err(invalid());
            }
            total
        }
    };
    // nats-server keeps a TTL as nanoseconds in an int64.
    if seconds == 0 || seconds > i64::MAX as u64 / 1_000_000_000 {
        return Err(Rejection(format!(
            "{text:?} is not a TTL: it must be at least 1s and at most 290 years"
        )));
    }
    Ok(seconds.to_string())
}

/// A schedule column's value as `Nats-Schedule` sends it, `@at <UTC time>Z` in whole
/// seconds, or why it cannot be one. Taken: PostgreSQL's text of a `timestamptz`
/// (`2026-11-26 21:40:00.5+05:30`), of a `timestamp` (no offset: read as UTC), and RFC 3339
/// (`2026-11-26T21:40:00Z`). A fraction of a second rounds up: a row is never delivered
/// before its time. The server is given UTC, the form every nats-server release parses.
pub fn schedule_value(text: &str) -> Result<String, Rejection> {
    let text = text.trim();
    let at = parse_time(text).ok_or_else(|| {
        Rejection(format!(
            "{:?} is not a time to deliver at: give a timestamptz, or a time such as \
             2026-11-26T21:40:00Z",
            super::dead_letter::shorten(text, 64)
        ))
    })?;
    Ok(format!(
        "@at {:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    ))
}

/// `YYYY-MM-DD[T ]HH:MM[:SS[.fraction]][Z|±HH[:MM[:SS]]]`, as UTC rounded up to the second;
/// years 1 to 9999 (as Go's RFC 3339 parser takes them).
fn parse_time(text: &str) -> Option<time::OffsetDateTime> {
    use time::{Date, Duration, Month, PrimitiveDateTime, Time, UtcOffset};
    let number = |digits: &str, len: usize| -> Option<u32> {
        (digits.len() == len && digits.bytes().all(|b| b.is_ascii_digit()))
            .then(|| digits.parse().ok())?
    };
    let (date, rest) = (text.get(..10)?, text.get(10..)?);
    let rest = rest.strip_prefix(['T', 't', ' '])?;
    let year = number(date.get(..4)?, 4)?;
    let month = number(date.get(5..7)?, 2)?;
    let day = number(date.get(8..10)?, 2)?;
    if date.as_bytes()[4] != b'-' || date.as_bytes()[7] != b'-' || year == 0 {
        return None;
    }
    let date = Date::from_calendar_date(
        i32::try_from(year).ok()?,
        Month::try_from(u8::try_from(month).ok()?).ok()?,
        u8::try_from(day).ok()?,
    )
    .ok()?;
    // The clock, up to where the offset starts.
    let clock_end = rest.find(['Z', 'z', '+', '-']).unwrap_or(rest.len());
    let (clock, offset) = rest.split_at(clock_end);
    let (clock, fraction) = match clock.split_once('.') {
        Some((clock, fraction)) => {
            if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (clock, fraction.bytes().any(|b| b != b'0'))
        }
        None => (clock, false),
    };
    let mut parts = clock.split(':');
    let hour = number(parts.next()?, 2)?;
    let minute = number(parts.next()?, 2)?;
    let second = parts.next().map(|s| number(s, 2)).unwrap_or(Some(0))?;
    if parts.next().is_some() {
        return None;
    }
    let time = Time::from_hms(
        u8::try_from(hour).ok()?,
        u8::try_from(minute).ok()?,
        u8::try_from(second).ok()?,
    )
    .ok()?;
    let offset = match offset {
        "" | "Z" | "z" => UtcOffset::UTC,
        signed => {
            let negative = signed.starts_with('-');
            let mut fields = signed.get(1..)?.split(':');
            let hours = number(fields.next()?, 2)?;
            let minutes = fields.next().map(|m| number(m, 2)).unwrap_or(Some(0))?;
            let seconds = fields.next().map(|s| number(s, 2)).unwrap_or(Some(0))?;
            if fields.next().is_some() {
                return None;
            }
            let sign = if negative { -1 } else { 1 };
            UtcOffset::from_hms(
                sign * i8::try_from(hours).ok()?,
                sign * i8::try_from(minutes).ok()?,
                sign * i8::try_from(seconds).ok()?,
            )
            .ok()?
        }
    };
    let at = PrimitiveDateTime::new(date, time).assume_offset(offset);
    let at = if fraction { at.checked_add(Duration::SECOND)? } else { at };
    let utc = at.checked_to_offset(UtcOffset::UTC)?;
    (1..=9999).contains(&utc.year()).then_some(utc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_read_as_nats_server_reads_them() {
        for (given, sent) in [
            ("2", "2"),
            ("90s", "90"),
            ("10m", "600"),
            ("1h30m", "5400"),
            (" 5 ", "5"),
            ("NEVER", "never"),
        ] {
            assert_eq!(ttl_value(given).as_deref(), Ok(sent), "{given}");
        }
        for bad in ["0", "0s", "-1", "1.5s", "500ms", "soon", "", "1d", "s", "99999999999999h"] {
            let Rejection(why) = ttl_value(bad).expect_err(bad);
            assert!(why.contains("is not a TTL"), "{why}");
        }
    }

    #[test]
    fn schedule_times_are_sent_as_utc_seconds_never_early() {
        for (given, sent) in [
            ("2026-11-26 21:40:00+00", "@at 2026-11-26T21:40:00Z"),
            ("2026-11-26 21:40:00.000001+00", "@at 2026-11-26T21:40:01Z"),
            ("2026-11-26 21:40:00.000+00", "@at 2026-11-26T21:40:00Z"),
            ("2026-11-26 23:59:59.5+05:30", "@at 2026-11-26T18:30:00Z"),
            ("2026-11-26 01:00:00-03", "@at 2026-11-26T04:00:00Z"),
            ("2026-12-31 23:30:00-01:00", "@at 2027-01-01T00:30:00Z"),
            ("1900-01-01 00:00:00+00:09:21", "@at 1899-12-31T23:50:39Z"),
            ("2026-11-26T21:40:00Z", "@at 2026-11-26T21:40:00Z"),
            ("2026-11-26t21:40:00z", "@at 2026-11-26T21:40:00Z"),
            ("2026-11-26 21:40", "@at 2026-11-26T21:40:00Z"),
            (" 2024-02-29 12:00:00 ", "@at 2024-02-29T12:00:00Z"),
        ] {
            assert_eq!(schedule_value(given).as_deref(), Ok(sent), "{given}");
        }
        for bad in [
            "",
            "infinity",
            "-infinity",
            "now",
            "2026-11-26",
            "2026-02-30 00:00:00+00",
            "2026-11-26 24:00:00+00",
            "2026-11-26 21:40:00 BC",
            "0000-01-01 00:00:00+00",
            "2026-11-26 21:40:00+",
            "2026-11-26 21:40:00.+00",
            "2026-11-26 21:40:00+99",
            "2026-11-26 21:40:00+01:00:00:00",
            "9999-12-31 23:59:59.5+00",
            "2026-11-26 21:4:00",
            "@at 2026-11-26T21:40:00Z",
            "@every 1m",
            "२०२६-11-26 21:40:00",
        ] {
            let Rejection(why) = schedule_value(bad).expect_err(bad);
            assert!(why.contains("is not a time to deliver at"), "{why}");
        }
    }

    #[test]
    fn a_delivered_message_names_its_schedule() {
        let schedule = ScheduleColumn {
            column: "deliver_at".into(),
            subject_prefix: "schedules.OUTBOX".into(),
        };
        let subject = schedule.subject("public.outbox:42");
        assert_eq!(subject, "schedules.OUTBOX.public.outbox:42");
        assert_eq!(schedule.msg_id_of_scheduler(&subject), Some("public.outbox:42"));
        assert_eq!(schedule.msg_id_of_scheduler("schedules.OUTBOXES.1"), None);
        assert_eq!(schedule.msg_id_of_scheduler("other.1"), None);
        let mut held = subject.clone();
        let mut headers = super::super::Headers::with_capacity(64);
        let position = Position { commit_lsn: 0x1_0000_00A0, index: 3 };
        held_at(&mut held, &headers, position);
        assert_eq!(held, subject, "a message not held keeps its subject");
        headers.insert(SCHEDULE_HEADER, "@at 2026-11-26T21:40:00Z");
        held_at(&mut held, &headers, position);
        assert_eq!(held, "schedules.OUTBOX.public.outbox:42.1/A0:3");
        assert_eq!(schedule.msg_id_of_scheduler(&held), Some("public.outbox:42"));
    }

    #[test]
    fn two_rows_with_one_id_are_held_on_two_subjects() {
        let schedule = ScheduleColumn { column: "d".into(), subject_prefix: "schedules.S".into() };
        let mut headers = super::super::Headers::with_capacity(64);
        headers.insert(SCHEDULE_HEADER, "@at 2026-11-26T21:40:00Z");
        let (mut first, mut second) = (schedule.subject("1"), schedule.subject("1"));
        held_at(&mut first, &headers, Position { commit_lsn: 0x100, index: 0 });
        held_at(&mut second, &headers, Position { commit_lsn: 0x200, index: 0 });
        assert_ne!(first, second);
        let longest = Position { commit_lsn: u64::MAX, index: u32::MAX }.to_string();
        assert_eq!(longest.len() + 1, HELD_POSITION_BYTES);
    }

    #[test]
    fn headers_that_undo_the_publish_protocol_cannot_be_allowed() {
        for never in [
            "Nats-Msg-Id",
            "Nats-Expected-Last-Sequence",
            "nats-rollup",
            "Nats-Schedule",
            "Nats-Schedule-Target",
            "Nats-TTL",
            "Nats-Batch-Id",
            "Outbox-Thing",
            "Nats",
        ] {
            assert!(refuse_allowed(never).is_some(), "{never}");
        }
        for fine in ["Nats-Trace-Dest", "Nats-Custom"] {
            assert_eq!(refuse_allowed(fine), None, "{fine}");
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever PostgreSQL prints for a timestamptz, in any session time zone, is sent
        /// as the same instant rounded up to the second; any other text is refused, never
        /// a panic.
        #[test]
        fn a_timestamptz_is_sent_as_its_instant(
            seconds in -62_000_000_000i64..253_000_000_000,
            micros in 0u32..1_000_000,
            offset_minutes in -15 * 60i32..=15 * 60,
        ) {
            let instant = time::OffsetDateTime::from_unix_timestamp(seconds).unwrap()
                + time::Duration::microseconds(i64::from(micros));
            let offset = time::UtcOffset::from_whole_seconds(offset_minutes * 60).unwrap();
            let local = instant.to_offset(offset);
            prop_assume!((1..=9999).contains(&local.year()));
            let (h, m, _) = offset.as_hms();
            let text = format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}{}{:02}:{:02}",
                local.year(), u8::from(local.month()), local.day(),
                local.hour(), local.minute(), local.second(), micros,
                if offset.is_negative() { '-' } else { '+' }, h.abs(), m.abs(),
            );
            let rounded_up = if micros == 0 { seconds } else { seconds + 1 };
            let expected = time::OffsetDateTime::from_unix_timestamp(rounded_up).unwrap();
            match schedule_value(&text) {
                Ok(sent) => {
                    let expected = format!(
                        "@at {:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                        expected.year(), u8::from(expected.month()), expected.day(),
                        expected.hour(), expected.minute(), expected.second(),
                    );
                    prop_assert_eq!(sent, expected, "{}", text);
                }
                Err(_) => prop_assert!(!(1..=9999).contains(&expected.year()), "{}", text),
            }
        }

        #[test]
        fn any_text_is_a_time_or_a_reason(text in any::<String>()) {
            let _ = schedule_value(&text);
        }
    }
}
