use bytes::Bytes;

use super::*;
use crate::domain::outbox::{ColumnRoles, SubjectTemplate};
use crate::domain::row::{Column, Relation};

const SUBJECT: &str = "outbox.dead_letter";
const POSITION: Position = Position { commit_lsn: 0x1_0000_00A0, index: 7 };

fn relation(id_type: u32, payload_type: u32) -> Relation {
    let column =
        |name: &str, type_oid| Column { flags: 0, name: name.into(), type_oid, type_modifier: -1 };
    Relation {
        rel_id: 1,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: vec![
            column("id", id_type),
            column("aggregate_type", 25),
            column("aggregate_id", 25),
            column("event_type", 25),
            column("payload", payload_type),
            column("headers", 3802),
            column("created_at", 1184),
        ],
    }
}

fn mapping(relation: &Relation) -> RowMapping {
    let template: SubjectTemplate = "outbox.{aggregate_type}.{event_type}".parse().unwrap();
    RowMapping::new(relation, &ColumnRoles::default(), &template).unwrap()
}

fn text(s: &str) -> ColumnValue {
    ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn row(id: ColumnValue, payload: ColumnValue) -> Vec<ColumnValue> {
    vec![id, text("order"), text("42"), text("created"), payload, ColumnValue::Null, text("now")]
}

fn header<'a>(letter: &'a DeadLetter, name: &str) -> Option<&'a str> {
    letter.event.headers.get(name)
}

fn body(letter: &DeadLetter) -> serde_json::Value {
    serde_json::from_slice(&letter.event.payload).unwrap()
}

fn size(letter: &DeadLetter) -> usize {
    letter.event.headers.wire_len() + letter.event.payload.len()
}

/// Every row of these tests, as a dead letter at `budget`: it fits and its headers are sane.
fn letter(tuple: &[ColumnValue], reason: &str, budget: usize) -> DeadLetter {
    let letter = mapping(&relation(25, 3802)).dead_letter(
        tuple,
        POSITION,
        &Rejection(reason.into()),
        SUBJECT,
        budget,
    );
    assert!(size(&letter) <= budget.max(MIN_BUDGET), "{} > {budget}", size(&letter));
    for (_, value) in letter.event.headers.iter() {
        assert!(!value.contains(['\r', '\n']));
    }
    assert_eq!(letter.event.subject, SUBJECT);
    let body = body(&letter);
    assert_eq!(body["table"], "public.outbox");
    assert_eq!(body["position"], "1/A0:7");
    assert!(body["reason"].as_str().is_some_and(|r| !r.is_empty()));
    letter
}

#[test]
fn a_line_break_in_the_id_moves_the_position_into_the_message_id() {
    let letter = letter(&row(text("a\nb"), text("{}")), "not a usable message id", 4096);
    assert_eq!(letter.event.id, "dead-letter:1/A0:7");
    assert_eq!(header(&letter, "Nats-Msg-Id"), Some("dead-letter:1/A0:7"));
    assert_eq!(body(&letter)["id"], "a\nb", "the body keeps the id as it is");
    assert_eq!(body(&letter)["row"]["id"], "a\nb");
    assert_eq!(header(&letter, PAYLOAD_OMITTED_HEADER), Some("false"));
    assert!(!letter.payload_omitted);
}

#[test]
fn a_plain_id_is_kept_in_the_message_id() {
    let letter = letter(&row(text("6f1c"), text("{}")), "why", 4096);
    assert_eq!(header(&letter, "Nats-Msg-Id"), Some("dead-letter:6f1c"));
    assert_eq!(body(&letter)["row"]["payload"], "{}");
}

#[test]
fn a_reason_with_line_breaks_is_one_line_in_its_header() {
    let letter = letter(&row(text("x"), text("{}")), "first\r\nsecond", 4096);
    assert_eq!(header(&letter, DEAD_LETTER_REASON_HEADER), Some("first  second"));
    assert_eq!(letter.reason, "first  second");
    assert_eq!(body(&letter)["reason"], "first\r\nsecond");
}

#[test]
fn a_payload_that_grows_when_escaped_is_left_out() {
    // 900 KB of `"`: 1.8 MB once escaped in the dead letter.
    let quotes = format!("\"{}\"", "\\\"".repeat(450_000));
    let budget = 1024 * 1024 - 128;
    let letter = letter(&row(text("id-1"), text(&quotes)), "bad subject", budget);
    assert!(letter.payload_omitted);
    assert_eq!(header(&letter, PAYLOAD_OMITTED_HEADER), Some("true"));
    let body = body(&letter);
    assert_eq!(body["row"]["payload"], serde_json::Value::Null);
    assert_eq!(body["row"]["aggregate_id"], "42", "the other columns are kept whole");
    assert_eq!(body["payload_omitted"], true);
}

#[test]
fn a_huge_bytea_payload_is_left_out() {
    let hex = format!("\\x{}", "ab".repeat(600_000));
    let m = mapping(&relation(25, 17));
    let letter = m.dead_letter(
        &row(text("id-1"), text(&hex)),
        POSITION,
        &Rejection("r".into()),
        SUBJECT,
        1 << 20,
    );
    assert!(size(&letter) <= 1 << 20);
    assert!(letter.payload_omitted);
    assert_eq!(body(&letter)["row"]["payload"], serde_json::Value::Null);
}

#[test]
fn long_columns_are_shortened_and_marked() {
    let mut tuple = row(text("id-1"), text("{}"));
    tuple[2] = text(&"y".repeat(20_000));
    let letter = letter(&tuple, "the message exceeds max_payload", 8192 - 128);
    let aggregate_id = body(&letter)["row"]["aggregate_id"].as_str().unwrap().to_owned();
    assert!(aggregate_id.starts_with("yyy") && aggregate_id.ends_with(TRUNCATED), "{aggregate_id}");
    assert!(aggregate_id.len() > 1000, "shortened no more than needed: {}", aggregate_id.len());
    assert_eq!(body(&letter)["row"]["event_type"], "created");
    assert!(letter.payload_omitted);
}

#[test]
fn bytes_that_are_not_utf8_are_replaced_not_refused() {
    let bad = ColumnValue::Binary(Bytes::from_static(&[0xff, 0xfe, b'a', 0x00, 0x80]));
    let letter = letter(&row(bad.clone(), bad), "not valid UTF-8", 4096);
    assert_eq!(body(&letter)["row"]["payload"], "\u{fffd}\u{fffd}a\u{0}\u{fffd}");
    assert_eq!(header(&letter, "Nats-Msg-Id"), Some("dead-letter:1/A0:7"));
}

#[test]
fn every_column_null_still_makes_a_letter() {
    let tuple = vec![ColumnValue::Null; 7];
    let letter = letter(&tuple, "column id is NULL", 4096);
    assert_eq!(body(&letter)["id"], serde_json::Value::Null);
    assert_eq!(body(&letter)["row"]["aggregate_type"], serde_json::Value::Null);
    assert_eq!(header(&letter, "Nats-Msg-Id"), Some("dead-letter:1/A0:7"));
}

#[test]
fn unchanged_toast_and_too_few_or_too_many_columns_do_not_panic() {
    let few = letter(&[text("only-id"), ColumnValue::UnchangedToast], "too few", 4096);
    assert_eq!(body(&few)["row"]["id"], "only-id");
    assert_eq!(body(&few)["row"]["event_type"], serde_json::Value::Null);
    letter(&[], "no columns", 4096);
    let mut long = row(text("x"), text("{}"));
    long.extend(std::iter::repeat_n(text("extra"), 10));
    letter(&long, "too many", 4096);
}

#[test]
fn the_last_resort_fits_the_smallest_budget_whatever_the_names_hold() {
    let mut relation = relation(25, 3802);
    relation.namespace = "\u{1}".repeat(5000);
    for column in &mut relation.columns {
        column.name = format!("{}{}", column.name, "\u{2}".repeat(3000));
    }
    let m = mapping_with_names(&relation);
    let id = text(&"\u{3}".repeat(5000));
    let reason = Rejection("\u{4}".repeat(5000));
    let letter = m.dead_letter(&row(id, text("{}")), POSITION, &reason, SUBJECT, 0);
    assert!(size(&letter) <= MIN_BUDGET, "{}", size(&letter));
    assert_eq!(body(&letter)["row"], serde_json::Value::Null);
    assert!(body(&letter)["id"].as_str().is_some_and(|id| id.ends_with(TRUNCATED)));
}

/// A mapping whose role columns carry the relation's (odd) names.
fn mapping_with_names(relation: &Relation) -> RowMapping {
    let name = |i: usize| relation.columns[i].name.clone();
    let roles = ColumnRoles {
        id: name(0),
        aggregate_type: name(1),
        aggregate_id: name(2),
        event_type: name(3),
        payload: name(4),
        headers: name(5),
        created_at: name(6),
        ..ColumnRoles::default()
    };
    let template: SubjectTemplate = "outbox.fixed".parse().unwrap();
    RowMapping::new(relation, &roles, &template).unwrap()
}

#[test]
fn refused_rows_stay_bounded_forgetting_the_oldest() {
    let mut refused = RefusedRows::default();
    let at = |index| Position { commit_lsn: 1, index };
    for index in 0..=RefusedRows::CAPACITY as u32 {
        refused.insert(at(index), Rejection(format!("{index}")));
    }
    assert_eq!(refused.get(&at(0)), None, "the oldest is forgotten past the capacity");
    assert_eq!(refused.get(&at(1)), Some(&Rejection("1".into())));
    assert!(refused.get(&at(RefusedRows::CAPACITY as u32)).is_some());
}

#[test]
fn a_letter_read_back_names_its_tables_row_whatever_it_had_to_shorten() {
    let entry = |table: &str, message_id| TableEntry {
        table: table.parse().unwrap(),
        pattern: None,
        roles: ColumnRoles::default(),
        template: "outbox.{aggregate_type}".parse().unwrap(),
        dead_letter_subject: SUBJECT.into(),
        message_id,
    };
    let t = |text: &str| format!("{text}{TRUNCATED}");
    let row = |entry: &TableEntry, table: &str, id: &str| letter_row_in(entry, table, id);
    let kept = |table: &str, id: &str| Some((table.to_owned(), id.to_owned()));
    let one = entry("public.outbox", MessageId::Row);
    assert_eq!(row(&one, "public.outbox", "7"), kept("public.outbox", "7"));
    assert_eq!(row(&one, "billing.outbox", "7"), None);
    let long = entry("billing_service.outbox", MessageId::Row);
    let cut = t("billing_service.");
    assert_eq!(row(&long, &cut, &t("6f1c")), kept("billing_service.outbox", &t("6f1c")));
    let several = entry("billing.outbox", MessageId::Qualified);
    let seven = row(&several, "billing.outbox", "billing.outbox:7");
    assert_eq!(seven, kept("billing.outbox", "7"));
    let six = row(&several, "billing.outbox", &t("billing.outbox:6f"));
    assert_eq!(six, kept("billing.outbox", &t("6f")));
    // A pattern's letter names the table it matched, and is kept there.
    let tenants = TableEntry {
        pattern: Some("tenant_*.outbox".parse().unwrap()),
        ..entry("tenant_*.outbox", MessageId::Qualified)
    };
    let tenant = row(&tenants, "tenant_7.outbox", "tenant_7.outbox:9");
    assert_eq!(tenant, kept("tenant_7.outbox", "9"));
    assert_eq!(row(&tenants, "other_7.outbox", "other_7.outbox:9"), None);
    let long = entry("billing_service.outbox", MessageId::Qualified);
    let cut_row = row(&long, &cut, &cut).map(|(_, row)| row);
    assert_eq!(
        cut_row.as_deref(),
        Some(TRUNCATED),
        "an id cut within its qualifier keeps every row"
    );
}
