use bytes::Bytes;

use super::*;
use crate::domain::row::{Column, ColumnValue, Relation};

fn column(name: &str, type_oid: u32) -> Column {
    Column { flags: 0, name: name.into(), type_oid, type_modifier: -1 }
}

/// The shipped table: id uuid, aggregate_type, aggregate_id, event_type, payload jsonb,
/// headers jsonb, created_at timestamptz.
fn outbox_relation() -> Relation {
    Relation {
        rel_id: 1,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: vec![
            column("id", 2950),
            column("aggregate_type", 25),
            column("aggregate_id", 25),
            column("event_type", 25),
            column("payload", 3802),
            column("headers", 3802),
            column("created_at", 1184),
        ],
    }
}

fn text(s: &str) -> ColumnValue {
    ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn row(aggregate_type: ColumnValue, event_type: &str, headers: ColumnValue) -> Vec<ColumnValue> {
    vec![
        text("6f1c1a52-0000-4000-8000-000000000001"),
        aggregate_type,
        text("42"),
        text(event_type),
        text(r#"{"total": 10}"#),
        headers,
        text("2026-11-22 10:00:00+00"),
    ]
}

fn default_mapping() -> RowMapping {
    let template = "outbox.{aggregate_type}.{event_type}".parse().unwrap();
    RowMapping::new(&outbox_relation(), &ColumnRoles::default(), &template).unwrap()
}

fn header<'a>(event: &'a OutboxEvent, name: &str) -> Option<&'a str> {
    event.headers.get(name)
}

#[test]
fn maps_a_row_to_subject_body_and_headers() {
    let event = default_mapping()
        .map(&row(text("order"), "created", text(r#"{"Trace-Id": "abc"}"#)))
        .unwrap();
    assert_eq!(event.subject, "outbox.order.created");
    assert_eq!(&event.payload[..], br#"{"total": 10}"#);
    assert_eq!(header(&event, "Nats-Msg-Id"), Some("6f1c1a52-0000-4000-8000-000000000001"));
    assert_eq!(header(&event, "Outbox-Aggregate-Type"), Some("order"));
    assert_eq!(header(&event, "Outbox-Aggregate-Id"), Some("42"));
    assert_eq!(header(&event, "Outbox-Event-Type"), Some("created"));
    assert_eq!(header(&event, "Outbox-Created-At"), Some("2026-11-22 10:00:00+00"));
    assert_eq!(header(&event, "Trace-Id"), Some("abc"));
}

#[test]
fn null_headers_column_adds_no_headers() {
    let event = default_mapping().map(&row(text("order"), "created", ColumnValue::Null)).unwrap();
    assert_eq!(event.headers.len(), 5);
}

#[test]
fn values_that_would_make_a_wrong_subject_are_rejected_not_rewritten() {
    let mapping = default_mapping();
    for bad in ["a.b", "with space", "", "*", ">", "tab\there"] {
        let rejection = mapping.map(&row(text(bad), "created", ColumnValue::Null)).unwrap_err();
        assert!(rejection.0.contains("aggregate_type"), "{bad:?}: {}", rejection.0);
    }
    let rejection = mapping.map(&row(ColumnValue::Null, "created", ColumnValue::Null)).unwrap_err();
    assert_eq!(rejection.0, "column aggregate_type is NULL");
}

#[test]
fn a_subject_too_long_for_the_control_line_is_rejected() {
    let mapping = default_mapping();
    // "outbox." + token + ".created": the longest token that still fits.
    let fits = "a".repeat(MAX_SUBJECT_BYTES - "outbox..created".len());
    assert!(mapping.map(&row(text(&fits), "created", ColumnValue::Null)).is_ok());
    let long = format!("{fits}a");
    let rejection = mapping.map(&row(text(&long), "created", ColumnValue::Null)).unwrap_err();
    assert!(rejection.0.contains("control line"), "{}", rejection.0);
    assert!(rejection.0.len() < 300, "the reason stays short: {}", rejection.0);
}

#[test]
fn header_values_that_are_not_strings_arrive_as_json_text_and_null_is_left_out() {
    let mapping = default_mapping();
    let headers = r#"{"trace-id": "abc", "retries": 3, "urgent": true, "gone": null,
        "ratio": 0.5, "tags": ["a", "b"], "ctx": {"k": "v\nw"}}"#;
    let event = mapping.map(&row(text("order"), "created", text(headers))).unwrap();
    assert_eq!(header(&event, "trace-id"), Some("abc"));
    assert_eq!(header(&event, "retries"), Some("3"));
    assert_eq!(header(&event, "urgent"), Some("true"));
    assert_eq!(header(&event, "ratio"), Some("0.5"));
    assert_eq!(header(&event, "tags"), Some(r#"["a","b"]"#));
    // Compact JSON escapes a line break, so a nested value always fits a header.
    assert_eq!(header(&event, "ctx"), Some(r#"{"k":"v\nw"}"#));
    assert_eq!(header(&event, "gone"), None);
}

#[test]
fn headers_must_be_a_json_object_without_reserved_names() {
    let mapping = default_mapping();
    for bad in [
        r#"[1,2]"#,
        r#""text""#,
        r#"not json"#,
        r#"{"Nats-Msg-Id": "x"}"#,
        r#"{"a:b": "x"}"#,
        r#"{"a": "line\nbreak"}"#,
    ] {
        let result = mapping.map(&row(text("order"), "created", text(bad)));
        assert!(result.is_err(), "{bad} was accepted");
    }
}

#[test]
fn debezium_columns_work_through_roles() {
    let relation = Relation {
        rel_id: 2,
        namespace: "public".into(),
        name: "outboxevent".into(),
        replica_identity: b'd',
        columns: vec![
            column("id", 2950),
            column("aggregatetype", 1043),
            column("aggregateid", 1043),
            column("type", 1043),
            column("payload", 114),
        ],
    };
    let roles = ColumnRoles {
        aggregate_type: "aggregatetype".into(),
        aggregate_id: "aggregateid".into(),
        event_type: "type".into(),
        ..ColumnRoles::default()
    };
    let template = "outbox.{aggregatetype}.{type}".parse().unwrap();
    let mapping = RowMapping::new(&relation, &roles, &template).unwrap();
    let event = mapping
        .map(&[text("id-1"), text("customer"), text("7"), text("updated"), text("{}")])
        .unwrap();
    assert_eq!(event.subject, "outbox.customer.updated");
    assert_eq!(header(&event, "Outbox-Event-Type"), Some("updated"));
    assert_eq!(header(&event, "Outbox-Created-At"), None);
}

#[test]
fn a_missing_role_column_is_a_mapping_error() {
    let template = "outbox.{kind}".parse().unwrap();
    let err =
        RowMapping::new(&outbox_relation(), &ColumnRoles::default(), &template).err().unwrap();
    assert_eq!(err.column, "kind");
}

#[test]
fn bytea_payload_is_sent_raw() {
    let mut relation = outbox_relation();
    relation.columns[4].type_oid = 17;
    let template = "outbox.{aggregate_type}.{event_type}".parse().unwrap();
    let mapping = RowMapping::new(&relation, &ColumnRoles::default(), &template).unwrap();
    let mut tuple = row(text("order"), "created", ColumnValue::Null);
    tuple[4] = text("\\x00ff41");
    assert_eq!(&mapping.map(&tuple).unwrap().payload[..], &[0x00, 0xff, 0x41]);
    tuple[4] = text("\\x0");
    assert!(mapping.map(&tuple).is_err());
}

#[test]
fn templates_parse_and_yield_their_stream_wildcard() {
    let t: SubjectTemplate = "outbox.{aggregate_type}.{event_type}".parse().unwrap();
    assert_eq!(t.wildcard(), "outbox.*.*");
    assert_eq!(t.columns().collect::<Vec<_>>(), ["aggregate_type", "event_type"]);
    let t: SubjectTemplate = "events.v1_{type}".parse().unwrap();
    assert_eq!(t.wildcard(), "events.*");
    let t: SubjectTemplate = "fixed.subject".parse().unwrap();
    assert_eq!(t.wildcard(), "fixed.subject");
    for bad in [
        "outbox.{a",
        "outbox.}",
        "outbox..{a}",
        "outbox.{}",
        "a b.{x}",
        "outbox.*",
        "x.>",
        "\0",
        "outbox.a\rb",
        "outbox.\u{a0}.{x}",
    ] {
        assert!(bad.parse::<SubjectTemplate>().is_err(), "{bad} was accepted");
    }
}
