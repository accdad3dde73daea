//! The dead letter: the message published, in the row's place and in order, for a row that
//! cannot be published as it is.
//!
//! A dead letter must always be publishable. If it is not, the row blocks every row behind
//! it, and since nothing past it is confirmed, Postgres sends the same row again after each
//! restart: one hostile row stops the stream for good. So a dead letter is built here, in
//! pure code, to a byte budget (the most the server and the stream accept, minus room for
//! the headers the pipeline adds), in this order of preference:
//!
//! 1. the whole row;
//! 2. the row without its payload (`Pgoutbox-Payload-Omitted: true`; the row stays in the
//!    table and its id is in the letter);
//! 3. the row without its payload and with every column value shortened (cut at a character
//!    boundary and marked with [`TRUNCATED`]), shorter and shorter;
//! 4. no row at all: only the reason, the table, the position and the id, each shortened.
//!
//! Whatever the row holds (line breaks, control characters, bytes that are not UTF-8,
//! values that grow when escaped as JSON), the headers are valid NATS header values: the
//! `Nats-Msg-Id` is `dead-letter:<id>` when the id is header-safe and short, else
//! `dead-letter:<position>`, which is as stable across replays (the JetStream duplicate
//! window still catches a replayed dead letter).

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{Map, Value};

use super::{
    EMITTED_HEADER, Headers, MESSAGE_ID_HEADER, MessageId, OutboxEvent, Rejection, RowMapping,
    TABLE_HEADER, TableEntry, TableName,
};
use crate::domain::progress::Position;
use crate::domain::row::ColumnValue;

/// A dead letter's `Nats-Msg-Id` is this, then its row's id (or position).
pub const DEAD_LETTER_ID_PREFIX: &str = "dead-letter:";
/// Header naming why the row could not be published as a normal message.
pub const DEAD_LETTER_REASON_HEADER: &str = "Pgoutbox-Dead-Letter-Reason";
/// Header saying whether the row's payload was left out (`true`/`false`): such a letter does
/// not hold the event, only the row's place and id, so the row must stay in the table.
pub const PAYLOAD_OMITTED_HEADER: &str = "Pgoutbox-Payload-Omitted";
/// Appended to every value that was shortened to fit.
pub const TRUNCATED: &str = "…[truncated]";

/// The smallest budget honoured. The last resort (step 4) needs less than this whatever the
/// row holds; a smaller budget is raised to it (no NATS server runs with a `max_payload` this
/// small, and a stream's `max_msg_size` this small could not hold a dead letter at all).
pub const MIN_BUDGET: usize = 1024;

/// Longest id used in the `Nats-Msg-Id`; a longer one is replaced by the position.
const HEADER_ID_BYTES: usize = 128;
/// Longest reason in the header; the body holds more of it.
const REASON_HEADER_BYTES: usize = 128;
/// Longest reason, table name and id in the body of steps 1–3.
const REASON_BODY_BYTES: usize = 1024;
const NAME_BODY_BYTES: usize = 256;
/// The same in the last resort, chosen so that it always fits [`MIN_BUDGET`]: JSON escaping
/// makes at most 6 bytes of one (a control character becomes `\u00XX`).
const REASON_LAST_BYTES: usize = 32;
const NAME_LAST_BYTES: usize = 16;

/// A dead letter ready to publish.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub event: OutboxEvent,
    /// Why the row became a dead letter, on one line and shortened, as the header says it.
    pub reason: String,
    /// Whether the row's payload was left out to fit the budget.
    pub payload_omitted: bool,
    /// The id column's text, whole, as the table holds it (no table qualifier, no replay
    /// prefix): `--retention` keeps a row whose payload was left out.
    pub row_id: Option<String>,
}

/// Rows JetStream refused for themselves (see `publisher::refused_for_itself`), kept until
/// the next attempt, when the slot sends them again, to publish their dead letter in their
/// place. It lives outside an attempt because the refusal ends the attempt: the messages
/// sent after the refused one were chained to it by `Nats-Expected-Last-Sequence` and are
/// refused too.
///
/// Bounded to [`RefusedRows::CAPACITY`] rows: past it the oldest position is forgotten. Rows
/// are replayed in position order from the confirmed position, so the oldest is the one most
/// likely confirmed already; if it was not, it is published again, refused again and
/// remembered again: one more attempt, never a lost row.
#[derive(Debug, Default)]
pub struct RefusedRows {
    rows: BTreeMap<Position, Rejection>,
}

impl RefusedRows {
    pub const CAPACITY: usize = 1024;

    /// Remembers that the row at `position` must be published as a dead letter.
    pub fn insert(&mut self, position: Position, why: Rejection) {
        self.rows.insert(position, why);
        while self.rows.len() > Self::CAPACITY {
            self.rows.pop_first();
        }
    }

    /// Why the row at `position` was refused, if it was.
    pub fn get(&self, position: &Position) -> Option<&Rejection> {
        self.rows.get(position)
    }

    /// Forgets the seed's rows (commit LSN 0): a new snapshot numbers its rows anew.
    pub fn forget_seed(&mut self) {
        self.rows.retain(|position, _| position.commit_lsn != 0);
    }
}

/// How much of the row a candidate letter carries.
#[derive(Clone, Copy)]
enum Shape {
    Whole,
    WithoutPayload,
    /// Without payload, each value cut to at most this many bytes.
    Shortened(usize),
    LastResort,
}

impl RowMapping {
    /// The id column's text, however it reads, after the mapping's id prefix: tells rows
    /// apart, not for publishing.
    pub fn row_id<'t>(&self, tuple: &'t [ColumnValue]) -> Option<Cow<'t, str>> {
        let id = self.id_column_text(tuple)?;
        match self.id_prefix.is_empty() && self.id_qualifier.is_empty() {
            true => Some(id),
            false => Some(Cow::Owned(format!("{}{}{id}", self.id_prefix, self.id_qualifier))),
        }
    }

    /// The table, `schema.table`, as a dead letter's body names it.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The id column's text as the table holds it: what SQL finds the row by.
    pub fn id_column_text<'t>(&self, tuple: &'t [ColumnValue]) -> Option<Cow<'t, str>> {
        tuple.get(self.id).and_then(lossy_text)
    }

    /// The dead letter for `tuple` at `position`, refused for `rejection`, on `subject`, no
    /// larger than `budget` bytes of headers and body (see the module doc for what is kept).
    /// Never fails and never panics, whatever the tuple holds, even when it has fewer or
    /// more columns than the relation.
    pub fn dead_letter(
        &self,
        tuple: &[ColumnValue],
        position: Position,
        rejection: &Rejection,
        subject: &str,
        budget: usize,
    ) -> DeadLetter {
        let budget = budget.max(MIN_BUDGET);
        let id = self.row_id(tuple);
        let message_id = match id.as_deref() {
            Some(id) if header_safe(id) => format!("{DEAD_LETTER_ID_PREFIX}{id}"),
            _ => format!("{DEAD_LETTER_ID_PREFIX}{position}"),
        };
        let reason = one_line(&shorten(&rejection.0, REASON_HEADER_BYTES));
        let values: Vec<(&str, Option<Cow<'_, str>>)> = self
            .column_names
            .iter()
            .enumerate()
            .map(|(i, name)| (name.as_str(), tuple.get(i).and_then(lossy_text)))
            .collect();
        let letter = Letter {
            mapping: self,
            values: &values,
            id: id.as_deref(),
            reason: &rejection.0,
            position,
        };
        let longest = values.iter().filter_map(|(_, v)| v.as_ref().map(|v| v.len())).max();
        let mut shapes = vec![Shape::Whole, Shape::WithoutPayload];
        // Halving from the most that could fit keeps the number of tries logarithmic.
        let mut limit = longest.unwrap_or(0).min(budget);
        while limit > 0 {
            shapes.push(Shape::Shortened(limit));
            limit /= 2;
        }
        shapes.push(Shape::Shortened(0));
        let (headers, body, payload_omitted) = shapes
            .into_iter()
            .map(|shape| {
                let omitted = !matches!(shape, Shape::Whole);
                let headers = headers(&message_id, &self.origin, &reason, omitted);
                (headers, letter.body(shape), omitted)
            })
            .find(|(headers, body, _)| headers.wire_len() + body.len() <= budget)
            .unwrap_or_else(|| {
                let headers = headers(&message_id, &self.origin, &reason, true);
                (headers, letter.body(Shape::LastResort), true)
            });
        DeadLetter {
            event: OutboxEvent {
                id: message_id,
                subject: subject.to_owned(),
                headers,
                payload: Bytes::from(body),
            },
            reason,
            payload_omitted,
            row_id: self.id_column_text(tuple).map(Cow::into_owned),
        }
    }
}

/// What a dead letter's body is made of.
struct Letter<'a> {
    mapping: &'a RowMapping,
    values: &'a [(&'a str, Option<Cow<'a, str>>)],
    id: Option<&'a str>,
    reason: &'a str,
    position: Position,
}

impl Letter<'_> {
    /// The JSON body: `{"table", "reason", "position", "id", "payload_omitted", "row"}`.
    fn body(&self, shape: Shape) -> Vec<u8> {
        let (text_bytes, name_bytes) = match shape {
            Shape::LastResort => (REASON_LAST_BYTES, NAME_LAST_BYTES),
            _ => (REASON_BODY_BYTES, NAME_BODY_BYTES),
        };
        let mut body = Map::new();
        let text = |s: &str, max| Value::String(shorten(s, max).into_owned());
        body.insert("table".into(), text(&self.mapping.table, name_bytes));
        body.insert("reason".into(), text(self.reason, text_bytes));
        body.insert("position".into(), Value::String(self.position.to_string()));
        body.insert("id".into(), self.id.map_or(Value::Null, |id| text(id, name_bytes)));
        body.insert("payload_omitted".into(), Value::Bool(!matches!(shape, Shape::Whole)));
        let row = match shape {
            Shape::LastResort => Value::Null,
            Shape::Whole => self.row(None, None),
            Shape::WithoutPayload => self.row(Some(self.mapping.payload), None),
            Shape::Shortened(limit) => self.row(Some(self.mapping.payload), Some(limit)),
        };
        body.insert("row".into(), row);
        Value::Object(body).to_string().into_bytes()
    }

    /// Every column as text or null; `omit` is set to null, values cut to `limit` bytes.
    fn row(&self, omit: Option<usize>, limit: Option<usize>) -> Value {
        let mut row = Map::new();
        for (i, (name, value)) in self.values.iter().enumerate() {
            let value = match value {
                Some(_) if omit == Some(i) => Value::Null,
                Some(v) => Value::String(match limit {
                    Some(limit) => shorten(v, limit).into_owned(),
                    None => v.clone().into_owned(),
                }),
                None => Value::Null,
            };
            row.insert((*name).to_owned(), value);
        }
        Value::Object(row)
    }
}

/// What a dead letter's body says of its row: its id, and the payload column's text unless
/// it was left out (`None`). `None` for a body that is not a letter this version wrote.
pub fn letter_row(body: &[u8], payload_column: &str) -> Option<(String, Option<String>)> {
    let body: Value = serde_json::from_slice(body).ok()?;
    let id = body.get("id")?.as_str()?.to_owned();
    let payload = match body.get("payload_omitted").and_then(Value::as_bool) {
        Some(false) => body.get("row")?.get(payload_column)?.as_str().map(str::to_owned),
        _ => None,
    };
    Some((id, payload))
}

/// Which row of `entry`'s tables a dead letter read back names, by the `table` and `id` of
/// its body (either may be shortened, ending in [`TRUNCATED`]): `None` for a letter of
/// another table; else the table's name (for a pattern's entry, the table the pattern
/// matched) and the id column's text, or its start followed by `TRUNCATED`, without the
/// `<schema>.<table>:` that several tables qualify ids with. An id shortened within that
/// qualifier names no row in particular: `TRUNCATED` alone, whose empty start matches every
/// row of the table (`--retention` keeps them all rather than the only copy of one).
pub fn letter_row_in(entry: &TableEntry, table: &str, id: &str) -> Option<(String, String)> {
    if let Some(pattern) = &entry.pattern {
        let matched = table.parse::<TableName>().ok()?;
        if !pattern.matches(&matched.schema, &matched.name) {
            return None;
        }
        let entry = TableEntry { table: matched, pattern: None, ..entry.clone() };
        return letter_row_in(&entry, table, id);
    }
    let name = entry.table.to_string();
    let named = match table.strip_suffix(TRUNCATED) {
        Some(start) => name.starts_with(start),
        None => table == name,
    };
    if !named {
        return None;
    }
    if entry.message_id == MessageId::Row {
        return Some((name, id.to_owned()));
    }
    let qualifier = format!("{name}:");
    let row = match (id.strip_prefix(&qualifier), id.strip_suffix(TRUNCATED)) {
        (Some(own), _) => own.to_owned(),
        (None, Some(start)) if qualifier.starts_with(start) => TRUNCATED.to_owned(),
        (None, _) => id.to_owned(),
    };
    Some((name, row))
}

impl RowMapping {
    /// The payload column's text as a dead letter carries it; `None` when NULL or unsent.
    pub fn payload_text<'t>(&self, tuple: &'t [ColumnValue]) -> Option<Cow<'t, str>> {
        tuple.get(self.payload).and_then(lossy_text)
    }
}

/// The dead letter's headers; every value is made one line here.
impl DeadLetter {
    /// Names the letter `dead-letter:<position>` rather than by the row's id: for a row whose
    /// id an older message has, since a letter named by that id could collide as well.
    pub fn named_by_position(mut self, position: Position) -> DeadLetter {
        self.event.id = format!("{DEAD_LETTER_ID_PREFIX}{position}");
        let origin = [TABLE_HEADER, EMITTED_HEADER]
            .into_iter()
            .find_map(|name| Some((name, self.event.headers.get(name)?.to_owned())));
        let origin = origin.unwrap_or((TABLE_HEADER, String::new()));
        self.event.headers = headers(&self.event.id, &origin, &self.reason, self.payload_omitted);
        self
    }
}

/// `origin`: the mapping's header saying where the row came from (its value header-safe
/// already), none when the value is empty.
fn headers(
    message_id: &str,
    (origin, value): &(&'static str, String),
    reason: &str,
    payload_omitted: bool,
) -> Headers {
    let mut headers = Headers::with_capacity(128 + message_id.len() + reason.len());
    headers.insert(MESSAGE_ID_HEADER, &one_line(message_id));
    if !value.is_empty() {
        headers.insert(origin, value);
    }
    headers.insert(DEAD_LETTER_REASON_HEADER, &one_line(reason));
    headers.insert(PAYLOAD_OMITTED_HEADER, if payload_omitted { "true" } else { "false" });
    headers
}

/// A column's value as text (invalid UTF-8 replaced), or `None` for NULL and unsent TOAST.
fn lossy_text(value: &ColumnValue) -> Option<Cow<'_, str>> {
    match value {
        ColumnValue::Text(b) | ColumnValue::Binary(b) => Some(String::from_utf8_lossy(b)),
        ColumnValue::Null | ColumnValue::UnchangedToast => None,
    }
}

/// Whether `id` can stand in a header as it is: short, non-empty, no control characters
/// and no surrounding whitespace (which a header parser may trim, changing the id).
fn header_safe(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= HEADER_ID_BYTES
        && !id.chars().any(char::is_control)
        && id.trim() == id
}

/// Control characters (line breaks among them) replaced by spaces.
fn one_line(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// `text` cut to at most `max` bytes at a character boundary, marked when cut.
pub(crate) fn shorten(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{TRUNCATED}", &text[..end]))
}

#[cfg(test)]
mod tests;
