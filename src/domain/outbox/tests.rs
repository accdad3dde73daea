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
    // A server or database with `bytea_output = 'escape'` sends the other text format.
    tuple[4] = text("\\000\\377A");
    assert_eq!(&mapping.map(&tuple).unwrap().payload[..], &[0x00, 0xff, 0x41]);
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

fn mapping_with(roles: ColumnRoles, relation: &Relation) -> RowMapping {
    let template = "outbox.{aggregate_type}".parse().unwrap();
    RowMapping::new(relation, &roles, &template).unwrap()
}

fn cloudevents(mode: ContentMode) -> ColumnRoles {
    ColumnRoles {
        cloudevents: Some(CloudEvents { mode, source: None, database: "shop".into() }),
        ..ColumnRoles::default()
    }
}

#[test]
fn binary_cloudevents_put_the_attributes_in_headers_and_keep_the_rest() {
    let mapping = mapping_with(cloudevents(ContentMode::Binary), &outbox_relation());
    let event = mapping.map(&row(text("order"), "order created", ColumnValue::Null)).unwrap();
    let id = "6f1c1a52-0000-4000-8000-000000000001";
    for (name, value) in [
        ("ce-specversion", "1.0"),
        ("ce-id", id),
        ("ce-source", "/postgres/shop/public.outbox"),
        ("ce-type", "order%20created"),
        ("ce-time", "2026-11-22T10:00:00+00:00"),
        ("ce-subject", "42"),
        ("ce-datacontenttype", "application/json"),
        ("Content-Type", "application/json"),
        ("Nats-Msg-Id", id),
        ("Outbox-Event-Type", "order created"),
    ] {
        assert_eq!(header(&event, name), Some(value), "{name}");
    }
    assert_eq!(&event.payload[..], br#"{"total": 10}"#);
    // Without --cloudevents, nothing of it.
    let plain = mapping_with(ColumnRoles::default(), &outbox_relation());
    let event = plain.map(&row(text("order"), "created", ColumnValue::Null)).unwrap();
    assert!(event.headers.iter().all(|(name, _)| !name.starts_with("ce-")));
}

#[test]
fn structured_cloudevents_carry_json_text_or_bytes_as_data() {
    let mut relation = outbox_relation();
    relation.columns[4].type_oid = 17; // bytea
    let mapping = mapping_with(cloudevents(ContentMode::Structured), &relation);
    let mut tuple = row(text("order"), "created", ColumnValue::Null);
    tuple[4] = text("\\x00ff");
    let event = mapping.map(&tuple).unwrap();
    assert_eq!(header(&event, "Content-Type"), Some("application/cloudevents+json"));
    let body: serde_json::Value = serde_json::from_slice(&event.payload).unwrap();
    assert_eq!(body["data_base64"], "AP8=");
    assert_eq!(body["datacontenttype"], "application/octet-stream");
    assert_eq!(body["type"], "created");
    assert!(body.get("data").is_none());

    let mapping = mapping_with(cloudevents(ContentMode::Structured), &outbox_relation());
    let event = mapping.map(&row(text("order"), "created", ColumnValue::Null)).unwrap();
    let body: serde_json::Value = serde_json::from_slice(&event.payload).unwrap();
    assert_eq!(body["data"], serde_json::json!({"total": 10}));
    assert_eq!(body["time"], "2026-11-22T10:00:00+00:00");
}

#[test]
fn a_cloudevent_without_a_type_or_with_an_unreadable_time_is_a_dead_letter() {
    let mapping = mapping_with(cloudevents(ContentMode::Binary), &outbox_relation());
    let mut tuple = row(text("order"), "created", ColumnValue::Null);
    tuple[3] = ColumnValue::Null;
    let Rejection(why) = mapping.map(&tuple).unwrap_err();
    assert!(why.contains("event_type is NULL") && why.contains("ce-type"), "{why}");
    let mut relation = outbox_relation();
    relation.columns[6].type_oid = 25; // a text column
    let mapping = mapping_with(cloudevents(ContentMode::Binary), &relation);
    let mut tuple = row(text("order"), "created", ColumnValue::Null);
    tuple[6] = text("yesterday");
    let Rejection(why) = mapping.map(&tuple).unwrap_err();
    assert!(why.contains("ce-time"), "{why}");
    // A timestamp without time zone has no zone to give: ce-time is left out.
    relation.columns[6].type_oid = 1114;
    let mapping = mapping_with(cloudevents(ContentMode::Binary), &relation);
    tuple[6] = text("2026-11-22 10:00:00");
    assert_eq!(header(&mapping.map(&tuple).unwrap(), "ce-time"), None);
}

/// A row's header that another letter case of an attribute header pgoutbox sets (the NATS
/// binding's names are case-insensitive) would stand beside pgoutbox's: a dead letter.
#[test]
fn a_rows_header_that_names_a_cloudevents_attribute_in_any_case_is_a_dead_letter() {
    for mode in [ContentMode::Binary, ContentMode::Structured] {
        let mapping = mapping_with(cloudevents(mode), &outbox_relation());
        let keys = "CE-Source ce-id Ce-Type CE-SPECVERSION ce-DataContentType ce-time CE-Subject \
                    content-type Content-Type CONTENT-TYPE";
        for key in keys.split_whitespace() {
            let headers = text(&format!(r#"{{"{key}": "x"}}"#));
            let Rejection(why) = mapping.map(&row(text("order"), "created", headers)).unwrap_err();
            assert!(why.contains(key) && why.contains("reserved"), "{mode:?} {key}: {why}");
        }
        let extension = text(r#"{"ce-tenant": "acme", "CE-DataSchema": "/s"}"#);
        assert!(mapping.map(&row(text("order"), "created", extension)).is_ok(), "{mode:?}");
    }
    // Without a created-at column pgoutbox can give (no zone), the row's ce-time is its own.
    let mut relation = outbox_relation();
    relation.columns[6].type_oid = 1114;
    let mapping = mapping_with(cloudevents(ContentMode::Binary), &relation);
    let time = text(r#"{"ce-time": "2026-11-22T10:00:00Z"}"#);
    let event = mapping.map(&row(text("order"), "created", time)).unwrap();
    assert_eq!(header(&event, "ce-time"), Some("2026-11-22T10:00:00Z"));
    let plain = default_mapping().map(&row(text("o"), "c", text(r#"{"content-type": "a/b"}"#)));
    assert_eq!(header(&plain.unwrap(), "content-type"), Some("a/b"), "without --cloudevents");
}

/// With one `--cloudevents-source` for several tables, two tables' rows of the same id would
/// be one event (source, id): the id is qualified by the table, as `Nats-Msg-Id` is.
#[test]
fn with_one_source_for_several_tables_the_event_id_names_the_table() {
    let id = "6f1c1a52-0000-4000-8000-000000000001";
    let tuple = row(text("order"), "created", ColumnValue::Null);
    for (source, message_id, ce_id) in [
        (Some("https://shop.example"), MessageId::Qualified, format!("public.outbox:{id}")),
        (Some("https://shop.example"), MessageId::Row, id.to_owned()),
        (None, MessageId::Qualified, id.to_owned()),
    ] {
        for mode in [ContentMode::Binary, ContentMode::Structured] {
            let cloudevents =
                CloudEvents { mode, source: source.map(Into::into), database: "".into() };
            let entry = TableEntry {
                table: "public.outbox".parse().unwrap(),
                pattern: None,
                roles: ColumnRoles { cloudevents: Some(cloudevents), ..ColumnRoles::default() },
                template: "outbox.{aggregate_type}".parse().unwrap(),
                dead_letter_subject: "outbox.dead_letter".into(),
                message_id,
            };
            let event = RowMapping::of_entry(&outbox_relation(), &entry).unwrap().map(&tuple);
            let event = event.unwrap();
            let body = serde_json::from_slice(&event.payload).unwrap_or(serde_json::Value::Null);
            let seen = header(&event, "ce-id").or(body["id"].as_str());
            assert_eq!(seen, Some(ce_id.as_str()), "{source:?} {message_id:?} {mode:?}");
        }
    }
}

#[test]
fn a_ttl_column_sets_nats_ttl_and_an_invalid_ttl_is_a_dead_letter() {
    let mut relation = outbox_relation();
    relation.columns.push(column("ttl", 25));
    let roles = ColumnRoles { ttl: Some("ttl".into()), ..ColumnRoles::default() };
    let mapping = mapping_with(roles, &relation);
    let mut tuple = row(text("order"), "created", ColumnValue::Null);
    tuple.push(text("10m"));
    assert_eq!(header(&mapping.map(&tuple).unwrap(), "Nats-TTL"), Some("600"));
    tuple[7] = ColumnValue::Null;
    assert_eq!(header(&mapping.map(&tuple).unwrap(), "Nats-TTL"), None);
    tuple[7] = text("soon");
    let Rejection(why) = mapping.map(&tuple).unwrap_err();
    assert!(why.contains("column ttl") && why.contains("not a TTL"), "{why}");
}

#[test]
fn only_allowed_nats_headers_pass_from_the_headers_column() {
    let trace = text(r#"{"Nats-Trace-Dest": "trace.here"}"#);
    let Rejection(why) =
        default_mapping().map(&row(text("order"), "created", trace.clone())).unwrap_err();
    assert!(why.contains("reserved"), "{why}");
    let roles = ColumnRoles {
        allowed_nats_headers: vec!["nats-trace-dest".into()],
        ..ColumnRoles::default()
    };
    let event =
        mapping_with(roles, &outbox_relation()).map(&row(text("order"), "created", trace)).unwrap();
    assert_eq!(header(&event, "Nats-Trace-Dest"), Some("trace.here"));
}

#[test]
fn a_row_names_its_table_and_with_several_tables_its_id_is_qualified() {
    let entry = |message_id| TableEntry {
        table: "public.outbox".parse().unwrap(),
        pattern: None,
        roles: ColumnRoles::default(),
        template: "outbox.{aggregate_type}.{event_type}".parse().unwrap(),
        dead_letter_subject: "billing.dead_letter".into(),
        message_id,
    };
    let tuple = row(text("order"), "created", ColumnValue::Null);
    let plain = RowMapping::of_entry(&outbox_relation(), &entry(MessageId::Row)).unwrap();
    let event = plain.map(&tuple).unwrap();
    assert_eq!(header(&event, "Nats-Msg-Id"), Some("6f1c1a52-0000-4000-8000-000000000001"));
    assert_eq!(header(&event, "Pgoutbox-Table"), Some("public.outbox"));
    assert_eq!(plain.dead_letter_subject(), "billing.dead_letter");
    let qualified = RowMapping::of_entry(&outbox_relation(), &entry(MessageId::Qualified)).unwrap();
    let event = qualified.map(&tuple).unwrap();
    let id = "public.outbox:6f1c1a52-0000-4000-8000-000000000001";
    assert_eq!((event.id.as_str(), header(&event, "Nats-Msg-Id")), (id, Some(id)));
    assert_eq!(qualified.row_id(&tuple).as_deref(), Some(id));
    let letter = qualified.dead_letter(
        &tuple,
        crate::domain::progress::Position { commit_lsn: 1, index: 0 },
        &Rejection("why".into()),
        "billing.dead_letter",
        4096,
    );
    assert_eq!(header(&letter.event, "Pgoutbox-Table"), Some("public.outbox"));
    // What --retention keeps the row by is the id as the table holds it.
    assert_eq!(letter.row_id.as_deref(), Some("6f1c1a52-0000-4000-8000-000000000001"));
    let renamed =
        letter.named_by_position(crate::domain::progress::Position { commit_lsn: 1, index: 0 });
    assert_eq!(header(&renamed.event, "Pgoutbox-Table"), Some("public.outbox"));
    assert_eq!(header_safe_table("a.b\nc"), "a.b\\nc");
}

#[test]
fn a_row_with_a_time_is_held_on_its_own_subject_and_delivered_to_its_own() {
    let mut relation = outbox_relation();
    relation.columns.push(column("deliver_at", 1184));
    relation.columns.push(column("ttl", 25));
    let schedule =
        ScheduleColumn { column: "deliver_at".into(), subject_prefix: "schedules.OUTBOX".into() };
    let roles =
        ColumnRoles { schedule: Some(schedule), ttl: Some("ttl".into()), ..ColumnRoles::default() };
    let mapping = mapping_with(roles, &relation);
    let mut tuple = row(text("order"), "created", ColumnValue::Null);
    tuple.push(text("2026-11-26 21:40:00.25+01"));
    tuple.push(ColumnValue::Null);
    let held = mapping.map(&tuple).unwrap();
    assert_eq!(held.subject, format!("schedules.OUTBOX.{}", held.id));
    assert_eq!(header(&held, "Nats-Schedule"), Some("@at 2026-11-26T20:40:01Z"));
    assert_eq!(header(&held, "Nats-Schedule-Target"), Some("outbox.order"));
    assert_eq!(header(&held, "Nats-Msg-Id"), Some(held.id.as_str()));
    assert_eq!(header(&held, "Pgoutbox-Event-Id"), Some(held.id.as_str()), "kept by its delivery");
    assert_eq!(mapping.subject_template(true), "schedules.OUTBOX.{$id}.{$position}");
    assert_eq!(mapping.subject_template(false), "outbox.{aggregate_type}");

    tuple[8] = text("10m");
    let held = mapping.map(&tuple).unwrap();
    assert_eq!(header(&held, "Nats-Schedule-TTL"), Some("600"), "the delivered message's TTL");
    assert_eq!(header(&held, "Nats-TTL"), None, "the schedule must not expire before its time");

    tuple[7] = ColumnValue::Null;
    let now = mapping.map(&tuple).unwrap();
    assert_eq!(now.subject, "outbox.order");
    assert_eq!(header(&now, "Nats-Schedule"), None);
    assert_eq!(header(&now, "Pgoutbox-Event-Id"), None, "Nats-Msg-Id says it");
    assert_eq!(header(&now, "Nats-TTL"), Some("600"));

    tuple[7] = text("tomorrow");
    let Rejection(why) = mapping.map(&tuple).unwrap_err();
    assert!(why.contains("column deliver_at") && why.contains("not a time"), "{why}");
}

#[test]
fn schema_and_table_placeholders_name_the_rows_table() {
    let template: SubjectTemplate = "tenants.{$schema}.{$table}.{event_type}".parse().unwrap();
    assert_eq!(template.wildcard(), "tenants.*.*.*");
    assert_eq!(template.columns().collect::<Vec<_>>(), ["event_type"], "no such columns needed");
    assert!("x.{$other}".parse::<SubjectTemplate>().is_err());
    let tenant = Relation { namespace: "tenant_7".into(), ..outbox_relation() };
    let mapping = RowMapping::new(&tenant, &ColumnRoles::default(), &template).unwrap();
    let event = mapping.map(&row(text("order"), "created", ColumnValue::Null)).unwrap();
    assert_eq!(event.subject, "tenants.tenant_7.outbox.created");
    // Traces name a message by its template: one name for every tenant.
    assert_eq!(mapping.subject_template(false), "tenants.{$schema}.{$table}.{event_type}");
    // A schema whose name cannot be a token: each row a dead letter saying why.
    let dotted = Relation { namespace: "a.b".into(), ..outbox_relation() };
    let mapping = RowMapping::new(&dotted, &ColumnRoles::default(), &template).unwrap();
    let Rejection(why) =
        mapping.map(&row(text("order"), "created", ColumnValue::Null)).unwrap_err();
    assert!(why.starts_with("{$schema} = \"a.b\" contains `.`"), "{why}");
}

#[test]
fn subject_filters_overlap_as_nats_server_matches_them() {
    use super::template::subjects_overlap;
    for (a, b) in [
        ("schedules.OUTBOX.>", "schedules.*.x"),
        ("outbox.*.*", "outbox.dead_letter.x"),
        ("a.>", "a.b.c.d"),
        ("*.*", "a.b"),
        ("outbox.*.*", "outbox.>"),
    ] {
        assert!(subjects_overlap(a, b) && subjects_overlap(b, a), "{a} {b}");
    }
    for (a, b) in [
        ("outbox.*.*", "outbox.dead_letter"),
        ("schedules.OUTBOX.>", "schedules.OUTBOX"),
        ("outbox.*.*", "schedules.OUTBOX.>"),
        ("a.b", "a.c"),
    ] {
        assert!(!subjects_overlap(a, b) && !subjects_overlap(b, a), "{a} {b}");
    }
}
