//! Events without a table: `pg_logical_emit_message(true, '<prefix>', '<json>')`.
//!
//! The content is a JSON object whose keys are the outbox column names under the configured
//! roles. It becomes a row of a table that exists only here (its columns are those names),
//! so the one [`RowMapping`] turns it into subject, headers and body, and its dead letter is
//! built the same way as a table row's.
//!
//! A key's value becomes the column's text: a string as it is (unescaped), any other value as
//! its JSON text exactly as written (so `"payload": {"b": 1, "a": 2}` is the body
//! `{"b": 1, "a": 2}`, key order and spacing kept), `null` or a missing key as NULL.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::cloudevents::Envelope;
use super::template::PARTITION_PLACEHOLDER;
use super::{
    ColumnRoles, EMITTED_HEADER, Part, Rejection, RowMapping, SubjectPart, SubjectTemplate,
    header_safe_table,
};
use crate::domain::row::ColumnValue;

/// The namespace shown as the "table" of an emitted message (in dead letters).
const NAMESPACE: &str = "pg_logical_emit_message";

/// The `table` label `/metrics` counts emitted messages under: no table's name can be it
/// (a table named so would be written `public."(emitted)"`, with its schema).
pub const EMITTED_LABEL: &str = "(emitted)";

impl RowMapping {
    /// The mapping of messages emitted with `prefix`: the id, payload, headers and the
    /// other roles' names, and every column the subject template reads, as text columns.
    pub fn for_emitted_messages(
        prefix: &str,
        roles: &ColumnRoles,
        template: &SubjectTemplate,
    ) -> RowMapping {
        let mut column_names: Vec<String> = Vec::new();
        let mut position = |name: &str| match column_names.iter().position(|c| c == name) {
            Some(i) => i,
            None => {
                column_names.push(name.to_owned());
                column_names.len() - 1
            }
        };
        let id = position(&roles.id);
        let payload = position(&roles.payload);
        let headers = Some(position(&roles.headers));
        let header_columns = super::optional_headers(roles)
            .map(|(header, column)| (header, position(column)))
            .collect();
        // An event's content never says which table or tenant sent it: `{$schema}` and
        // `{$table}` name the table a row was decoded from, and an emitted event has none.
        // Each becomes a dead letter saying so (issue 45, R6).
        let unusable = template.names_table().then(|| {
            format!(
                "an emitted event has no table, and the subject template {template} names one \
                 ({{$schema}} or {{$table}}), which only a table's row may fill: set \
                 --message-prefix '' to stream tables only, or a template without them"
            )
        });
        let subject = template
            .parts
            .iter()
            .map(|part| match part {
                Part::Literal(l) => SubjectPart::Literal(l.clone()),
                // The aggregate id the event names, as a table row's: `aggregate_id` (or
                // the --aggregate-id-column's name) in the object.
                Part::Column(c) if c == PARTITION_PLACEHOLDER => SubjectPart::Partition(
                    position(&roles.aggregate_id),
                    template.partitions().unwrap_or(0),
                ),
                Part::Column(c) if c.starts_with('$') => SubjectPart::Literal(String::new()),
                Part::Column(c) => SubjectPart::Column(position(c)),
            })
            .collect();
        let ttl = roles.ttl.as_deref().map(&mut position);
        let table = format!("{NAMESPACE}.{prefix}");
        // Every column is text: the payload's type is guessed per message.
        let envelope = roles.cloudevents.as_ref().and_then(|settings| {
            let typed = |name: &str| column_names.iter().position(|c| c == name).map(|i| (i, 25));
            Envelope::new(settings, roles, &table, None, typed).map(Box::new)
        });
        RowMapping {
            table,
            column_names,
            id,
            payload,
            payload_is_bytea: false,
            headers,
            header_columns,
            subject,
            unusable,
            id_prefix: String::new(),
            ttl,
            schedule: None,
            allowed_nats_headers: roles.allowed_nats_headers.clone(),
            envelope,
            dead_letter_subject: String::new(),
            origin: (EMITTED_HEADER, header_safe_table(prefix)),
            id_qualifier: String::new(),
            counted_as: EMITTED_LABEL.to_owned(),
        }
    }

    /// The row an emitted message stands for. Content that is not a JSON object is refused;
    /// the row then holds the content as its payload, so that the dead letter carries it.
    pub fn emitted_row(
        &self,
        content: &Bytes,
    ) -> Result<Vec<ColumnValue>, (Vec<ColumnValue>, Rejection)> {
        let object: HashMap<String, &RawValue> = match serde_json::from_slice(content) {
            Ok(object) => object,
            Err(err) => {
                let mut row = vec![ColumnValue::Null; self.column_names.len()];
                row[self.payload] = ColumnValue::Text(content.clone());
                let why = format!("the message is not a JSON object of outbox columns: {err}");
                return Err((row, Rejection(why)));
            }
        };
        Ok(self
            .column_names
            .iter()
            .map(|name| match object.get(name) {
                None => ColumnValue::Null,
                Some(raw) => column_value(raw),
            })
            .collect())
    }
}

/// The content on one short line, for the log line of a message that is not published.
pub fn log_preview(content: &[u8]) -> String {
    let text = String::from_utf8_lossy(content);
    super::dead_letter::shorten(&text, 200).replace(|c: char| c.is_control(), " ")
}

fn column_value(raw: &RawValue) -> ColumnValue {
    let text = raw.get();
    if text == "null" {
        return ColumnValue::Null;
    }
    if text.starts_with('"')
        && let Ok(unescaped) = serde_json::from_str::<String>(text)
    {
        return ColumnValue::Text(Bytes::from(unescaped));
    }
    ColumnValue::Text(Bytes::copy_from_slice(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::progress::Position;

    fn mapping() -> RowMapping {
        let template = "outbox.{aggregate_type}.{event_type}".parse().unwrap();
        RowMapping::for_emitted_messages("outbox", &ColumnRoles::default(), &template)
    }

    fn map(content: &str) -> Result<super::super::OutboxEvent, Rejection> {
        let mapping = mapping();
        let row =
            mapping.emitted_row(&Bytes::copy_from_slice(content.as_bytes())).map_err(|e| e.1)?;
        mapping.map(&row)
    }

    #[test]
    fn maps_the_issue_example_to_subject_body_and_headers() {
        let event = map(r#"{"id":"7f0c","aggregate_type":"order","aggregate_id":"42",
            "event_type":"paid","payload":{"amount":42}}"#)
        .unwrap();
        assert_eq!(event.subject, "outbox.order.paid");
        assert_eq!(&event.payload[..], br#"{"amount":42}"#);
        assert_eq!(event.headers.get("Nats-Msg-Id"), Some("7f0c"));
        assert_eq!(event.headers.get("Outbox-Aggregate-Id"), Some("42"));
    }

    #[test]
    fn the_body_is_the_payload_exactly_as_written_and_a_string_payload_is_its_text() {
        let event = map(r#"{"id":"1","aggregate_type":"a","event_type":"b",
            "payload": {"b": 1,  "a": [2]}}"#)
        .unwrap();
        assert_eq!(&event.payload[..], br#"{"b": 1,  "a": [2]}"#);
        let event =
            map(r#"{"id":"1","aggregate_type":"a","event_type":"b","payload":"x\ny"}"#).unwrap();
        assert_eq!(&event.payload[..], b"x\ny");
    }

    #[test]
    fn numbers_and_headers_work_as_in_a_table() {
        let event = map(r#"{"id":7,"aggregate_type":"a","event_type":"b","payload":1,
            "headers":{"retries":3,"trace-id":"t"},"created_at":"2026-11-23T10:00:00Z"}"#)
        .unwrap();
        assert_eq!(event.id, "7");
        assert_eq!(event.headers.get("retries"), Some("3"));
        assert_eq!(event.headers.get("trace-id"), Some("t"));
        assert_eq!(event.headers.get("Outbox-Created-At"), Some("2026-11-23T10:00:00Z"));
    }

    #[test]
    fn content_that_cannot_be_an_event_is_refused_with_a_reason() {
        for (content, why) in [
            ("not json", "not a JSON object"),
            ("[1]", "not a JSON object"),
            (r#"{"aggregate_type":"a","event_type":"b","payload":1}"#, "column id is NULL"),
            (r#"{"id":"1","aggregate_type":"a.b","event_type":"b","payload":1}"#, "aggregate_type"),
            (r#"{"id":"1","aggregate_type":"a","event_type":"b"}"#, "column payload is NULL"),
        ] {
            let rejection = map(content).unwrap_err();
            assert!(rejection.0.contains(why), "{content}: {}", rejection.0);
        }
    }

    #[test]
    fn a_refused_message_keeps_its_content_in_the_dead_letter() {
        let mapping = mapping();
        let content = Bytes::from_static(b"{oops");
        let (row, rejection) = mapping.emitted_row(&content).unwrap_err();
        let position = Position { commit_lsn: 16, index: 0 };
        let letter = mapping.dead_letter(&row, position, &rejection, "outbox.dead_letter", 4096);
        let body: serde_json::Value = serde_json::from_slice(&letter.event.payload).unwrap();
        assert_eq!(body["table"], "pg_logical_emit_message.outbox");
        assert_eq!(body["row"]["payload"], "{oops");
        assert!(!letter.payload_omitted);
    }

    #[test]
    fn an_event_never_names_its_table_or_tenant() {
        let template = "tenants.{$schema}.{$table}.{event_type}".parse().unwrap();
        let mapping =
            RowMapping::for_emitted_messages("outbox", &ColumnRoles::default(), &template);
        let content = Bytes::from_static(
            br#"{"id":"x1","$schema":"tenant_b","$table":"outbox","event_type":"b","payload":{}}"#,
        );
        let row = mapping.emitted_row(&content).unwrap();
        let Rejection(why) = mapping.map(&row).unwrap_err();
        assert!(why.contains("{$schema}") && why.contains("no table"), "{why}");
        let position = Position { commit_lsn: 16, index: 0 };
        let letter = mapping.dead_letter(&row, position, &Rejection(why), "tenants.dead", 4096);
        assert_eq!(letter.event.subject, "tenants.dead", "the letter's subject names no tenant");
    }

    #[test]
    fn template_columns_outside_the_roles_are_read_from_the_object() {
        let template = "events.{tenant}.{event_type}".parse().unwrap();
        let mapping =
            RowMapping::for_emitted_messages("outbox", &ColumnRoles::default(), &template);
        let content =
            Bytes::from_static(br#"{"id":"1","tenant":"acme","event_type":"b","payload":{}}"#);
        let event = mapping.map(&mapping.emitted_row(&content).unwrap()).unwrap();
        assert_eq!(event.subject, "events.acme.b");
    }
}
