//! `--cloudevents`: each message is also a CloudEvent 1.0, as the NATS protocol binding of
//! CloudEvents lays it out (cloudevents/spec, `bindings/nats-protocol-binding.md`).
//!
//! - Binary mode (the default): the body stays the payload as it is, and each attribute is a
//!   `ce-` header, its value percent-encoded as the binding asks (space, `"`, `%` and
//!   anything outside printable ASCII). The media type is `ce-datacontenttype`, as the NATS
//!   binding names it, and `Content-Type` too, which consumers that follow the HTTP binding
//!   read (a binary message must not say `application/cloudevents`, which means structured).
//! - Structured mode: the body is the event in the JSON format (`data` holding JSON or text,
//!   `data_base64` the bytes of a bytea payload), with `Content-Type:
//!   application/cloudevents+json`.
//!
//! Either way `Nats-Msg-Id` and the `Outbox-*` headers stay: deduplication, the restart skip
//! and `pgoutbox replay` read them, and consumers written before `--cloudevents` keep working.
//! A dead letter is pgoutbox's own message, never a CloudEvent.
//!
//! The binding's header names are case-insensitive, as HTTP's: a row's `CE-Source` or
//! `content-type` would stand beside pgoutbox's `ce-source` or `Content-Type`, and a consumer
//! could take the row's, or read a binary message as structured. So a row may not set, in
//! any letter case, `Content-Type` or an attribute header pgoutbox sets from its columns
//! ([`Envelope::reserves`]): such a row is a dead letter saying so, never sent with one of the
//! two values silently dropped. Other `ce-` keys are extension attributes, the row's own.
//!
//! Attributes: `id` is the row's id (with one `--cloudevents-source` for several tables,
//! qualified by the table as `Nats-Msg-Id` is, `<schema>.<table>:<id>`: CloudEvents
//! identifies an event by source and id, and two tables' ids collide), `source`
//! `--cloudevents-source` or `/postgres/<database>/<schema>.<table>`, `type` the event type
//! column (a row without one is a dead letter: an event no consumer can route is better seen
//! than delivered under a made-up type), `time` the created-at column in RFC 3339 (left out
//! when NULL, or when the column is a `timestamp` without time zone, whose zone pgoutbox
//! cannot know), `subject` the aggregate id (left out when NULL). This code runs only with
//! `--cloudevents`: without it a row's mapping is one `None` check longer.

use std::fmt::Write;

use base64::Engine;
use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;

use super::{ColumnRoles, Headers, Rejection, RowMapping};
use crate::domain::row::ColumnValue;

const JSON_OIDS: [u32; 2] = [114, 3802];
const BYTEA_OID: u32 = 17;
const TIMESTAMP_OID: u32 = 1114;
/// The headers (lowercase) pgoutbox sets on every event: a row may not set them in any case.
const ALWAYS_SET: [&str; 6] =
    ["ce-specversion", "ce-id", "ce-source", "ce-type", "ce-datacontenttype", "content-type"];
/// The media type of a structured message's body.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";

/// How attributes travel: in headers (binary) or with the data in a JSON body (structured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentMode {
    Binary,
    Structured,
}

/// `--cloudevents` and `--cloudevents-source`, as the settings give them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvents {
    pub mode: ContentMode,
    /// `--cloudevents-source`, the same for every table; `None`: named after the table.
    pub source: Option<String>,
    /// The database's name, in the default source.
    pub database: String,
}

/// What the payload column holds, which gives `datacontenttype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Content {
    Json,
    Text,
    Bytes,
    /// An emitted message's payload: JSON when it parses as JSON, else text.
    Guess,
}

/// The envelope of one version of a table: columns found once, per Relation message.
#[derive(Debug, Clone)]
pub(super) struct Envelope {
    mode: ContentMode,
    source: String,
    /// `--cloudevents-source`: one source for every table, so ids are qualified by the table
    /// when the mapping's are (several tables).
    shared_source: bool,
    event_type: usize,
    time: Option<usize>,
    subject: Option<usize>,
    content: Content,
}

impl Envelope {
    /// The envelope of `table`'s rows; `find` gives a column's position and type; `None`
    /// when the event type column is missing (the caller says so).
    pub(super) fn new(
        settings: &CloudEvents,
        roles: &ColumnRoles,
        table: &str,
        payload_type: Option<u32>,
        find: impl Fn(&str) -> Option<(usize, u32)>,
    ) -> Option<Envelope> {
        let (event_type, _) = find(&roles.event_type)?;
        let time = find(&roles.created_at).filter(|(_, oid)| *oid != TIMESTAMP_OID).map(|c| c.0);
        let content = match payload_type {
            None => Content::Guess,
            Some(oid) if JSON_OIDS.contains(&oid) => Content::Json,
            Some(BYTEA_OID) => Content::Bytes,
            Some(_) => Content::Text,
        };
        Some(Envelope {
            mode: settings.mode,
            source: match &settings.source {
                Some(source) => source.clone(),
                None => format!("/postgres/{}/{table}", settings.database),
            },
            shared_source: settings.source.is_some(),
            event_type,
            time,
            subject: find(&roles.aggregate_id).map(|c| c.0),
            content,
        })
    }

    /// Why a header named `lower` (lowercase) may not come from the row: it is one pgoutbox
    /// sets, the attributes it takes from the row's columns (`ce-time` and `ce-subject` only
    /// when the table has a column for them) and `Content-Type`, in binary and structured mode
    /// alike (a structured event holds them in its body, and must not be contradicted).
    pub(super) fn reserves(&self, lower: &str) -> Option<String> {
        let own = [("ce-time", self.time.is_some()), ("ce-subject", self.subject.is_some())];
        let taken = ALWAYS_SET.contains(&lower) || own.contains(&(lower, true));
        taken.then(|| {
            format!("--cloudevents sets {lower} itself, and header names match in any letter case")
        })
    }

    /// Sets the attributes of the row `tuple` (whose id is `id`), and gives the body.
    pub(super) fn wrap(
        &self,
        mapping: &RowMapping,
        tuple: &[ColumnValue],
        id: &str,
        headers: &mut Headers,
        payload: Bytes,
    ) -> Result<Bytes, Rejection> {
        // One source for several tables: the id names the table, as `Nats-Msg-Id` does.
        let qualified;
        let id = match self.shared_source && !mapping.id_qualifier.is_empty() {
            true => {
                qualified = format!("{}{id}", mapping.id_qualifier);
                qualified.as_str()
            }
            false => id,
        };
        let event_type = mapping.text(tuple, self.event_type).map_err(|Rejection(why)| {
            Rejection(format!("{why}: a CloudEvent needs a type (ce-type)"))
        })?;
        let time = self.time_of(mapping, tuple)?;
        let subject = match self.subject.map(|i| &tuple[i]) {
            Some(ColumnValue::Null | ColumnValue::UnchangedToast) | None => None,
            Some(_) => self.subject.map(|i| mapping.text(tuple, i)).transpose()?,
        };
        let event = Event {
            specversion: "1.0",
            id,
            source: &self.source,
            event_type,
            subject,
            time: time.as_deref(),
            datacontenttype: self.content_type(&payload),
            data: None,
            data_base64: None,
        };
        match self.mode {
            ContentMode::Binary => {
                event.write_headers(headers);
                Ok(payload)
            }
            ContentMode::Structured => {
                headers.insert("Content-Type", STRUCTURED_CONTENT_TYPE);
                event.structured(&payload)
            }
        }
    }

    /// The time column's value as RFC 3339 (ce-time), if the envelope has one.
    fn time_of(
        &self,
        mapping: &RowMapping,
        tuple: &[ColumnValue],
    ) -> Result<Option<String>, Rejection> {
        match self.time.map(|i| (i, &tuple[i])) {
            Some((i, ColumnValue::Text(text) | ColumnValue::Binary(text))) => {
                let text = std::str::from_utf8(text).ok();
                let time = text.and_then(rfc3339).ok_or_else(|| {
                    Rejection(format!(
                        "column {} = {:?} is not a time with a zone, needed as ce-time",
                        mapping.name(i),
                        super::dead_letter::shorten(text.unwrap_or_default(), 64)
                    ))
                })?;
                Ok(Some(time))
            }
            _ => Ok(None),
        }
    }

    /// The payload's media type: the column's type says, or, where it cannot, the payload.
    fn content_type(&self, payload: &[u8]) -> &'static str {
        match self.content {
            Content::Json => "application/json",
            Content::Bytes => "application/octet-stream",
            Content::Text => "text/plain",
            Content::Guess if serde_json::from_slice::<&RawValue>(payload).is_ok() => {
                "application/json"
            }
            Content::Guess => "text/plain",
        }
    }
}

#[derive(Serialize)]
struct Event<'a> {
    specversion: &'static str,
    id: &'a str,
    source: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<&'a str>,
    datacontenttype: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Data<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_base64: Option<String>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Data<'a> {
    Json(&'a RawValue),
    Text(&'a str),
}

impl<'a> Event<'a> {
    /// Binary content mode: each attribute a `ce-` header, the payload the body as it is.
    fn write_headers(&self, headers: &mut Headers) {
        headers.insert("ce-specversion", self.specversion);
        headers.insert("ce-id", &percent_encode(self.id));
        headers.insert("ce-source", &percent_encode(self.source));
        headers.insert("ce-type", &percent_encode(self.event_type));
        if let Some(time) = self.time {
            headers.insert("ce-time", time);
        }
        if let Some(subject) = self.subject {
            headers.insert("ce-subject", &percent_encode(subject));
        }
        headers.insert("ce-datacontenttype", self.datacontenttype);
        headers.insert("Content-Type", self.datacontenttype);
    }

    /// Structured content mode: the event as one JSON document, the payload its `data` (JSON
    /// or text) or `data_base64` (bytes).
    fn structured(self, payload: &'a [u8]) -> Result<Bytes, Rejection> {
        let not_utf8 = || Rejection("the payload is not valid UTF-8 text".into());
        let event = match self.datacontenttype {
            "application/json" => Event {
                data: Some(Data::Json(
                    serde_json::from_slice(payload)
                        .map_err(|_| Rejection("the payload is not valid JSON".into()))?,
                )),
                ..self
            },
            "text/plain" => Event {
                data: Some(Data::Text(std::str::from_utf8(payload).map_err(|_| not_utf8())?)),
                ..self
            },
            _ => Event {
                data_base64: Some(base64::engine::general_purpose::STANDARD.encode(payload)),
                ..self
            },
        };
        serde_json::to_vec(&event)
            .map(Bytes::from)
            .map_err(|err| Rejection(format!("the event cannot be written as JSON: {err}")))
    }
}

/// A header value as the NATS binding encodes a string: space, `"`, `%` and every byte
/// outside printable ASCII as `%XY`.
fn percent_encode(value: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        if (0x21..=0x7e).contains(&byte) && byte != b'"' && byte != b'%' {
            encoded.push(byte as char);
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

/// A `timestamptz` as Postgres writes it (`2026-11-23 12:00:00.5+01`, ISO DateStyle) or an
/// RFC 3339 time, as RFC 3339 (`2026-11-23T12:00:00.5+01:00`); `None` without a zone, or
/// with one RFC 3339 cannot say (seconds in the offset), BC or past year 9999.
fn rfc3339(text: &str) -> Option<String> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (date, rest) = (text.get(..10)?, text.get(10..)?);
    let rest = rest.strip_prefix([' ', 'T', 't'])?;
    let d: Vec<&str> = date.split('-').collect();
    if d.len() != 3
        || d[0].len() != 4
        || d[1].len() != 2
        || d[2].len() != 2
        || !d.iter().all(|p| digits(p))
    {
        return None;
    }
    let zone_at = rest.find(['+', '-', 'Z', 'z'])?;
    let (clock, zone) = rest.split_at(zone_at);
    let (hms, fraction) = clock.split_once('.').map_or((clock, None), |(a, b)| (a, Some(b)));
    let t: Vec<&str> = hms.split(':').collect();
    if t.len() != 3
        || !t.iter().all(|p| p.len() == 2 && digits(p))
        || fraction.is_some_and(|f| !digits(f))
    {
        return None;
    }
    let zone = match zone {
        "Z" | "z" => "Z".to_owned(),
        _ => {
            let (sign, offset) = zone.split_at(1);
            let parts: Vec<&str> = offset.split(':').collect();
            match parts.as_slice() {
                [h] if h.len() == 2 && digits(h) => format!("{sign}{h}:00"),
                [h, m] if h.len() == 2 && m.len() == 2 && digits(h) && digits(m) => {
                    format!("{sign}{h}:{m}")
                }
                _ => return None,
            }
        }
    };
    let fraction = fraction.map(|f| format!(".{f}")).unwrap_or_default();
    Some(format!("{date}T{hms}{fraction}{zone}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_times_become_rfc_3339() {
        for (pg, rfc) in [
            ("2026-11-23 12:00:00+00", "2026-11-23T12:00:00+00:00"),
            ("2026-11-23 12:00:00.123456+05:30", "2026-11-23T12:00:00.123456+05:30"),
            ("2026-11-23 12:00:00-08", "2026-11-23T12:00:00-08:00"),
            ("2026-11-23T12:00:00Z", "2026-11-23T12:00:00Z"),
        ] {
            assert_eq!(rfc3339(pg).as_deref(), Some(rfc), "{pg}");
        }
        for bad in [
            "2026-11-23 12:00:00",
            "2026-11-23 12:00:00+00 BC",
            "infinity",
            "2026-11-23 12:00:00+00:19:32",
            "12345-01-01 00:00:00+00",
            "2026-11-23 1:00:00+00",
            "",
        ] {
            assert_eq!(rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn header_values_are_percent_encoded_as_the_nats_binding_says() {
        assert_eq!(percent_encode("order-1/a_b"), "order-1/a_b");
        assert_eq!(percent_encode("Euro € 😀"), "Euro%20%E2%82%AC%20%F0%9F%98%80");
        assert_eq!(percent_encode("a\"b%c"), "a%22b%25c");
    }
}
