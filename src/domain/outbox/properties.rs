//! Property tests of the row mapping, run with the unit tests (and so in CI): whatever a row
//! holds, mapping never panics, and gives either a message NATS accepts as it is or a dead
//! letter that fits its budget. The fuzz targets in `fuzz/` push the same properties further.

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::domain::progress::Position;
use crate::domain::row::{Column, ColumnValue, Relation};

const ROLES: [&str; 7] =
    ["id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at"];

/// Any value a column can arrive as, biased towards values that map, so that both the
/// message and the dead-letter branch are exercised.
fn column_value() -> impl Strategy<Value = ColumnValue> {
    let text = |s: String| ColumnValue::Text(Bytes::from(s));
    prop_oneof![
        1 => Just(ColumnValue::Null),
        1 => Just(ColumnValue::UnchangedToast),
        2 => proptest::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| ColumnValue::Text(Bytes::from(b))),
        1 => proptest::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| ColumnValue::Binary(Bytes::from(b))),
        1 => any::<String>().prop_map(text),
        4 => "[a-z0-9_-]{1,12}".prop_map(text),
        1 => "\\\\x([0-9a-f]{2}){0,8}".prop_map(text),
        1 => r#"\{("[A-Za-z:-]{0,6}": "[^\r]{0,6}")?\}"#.prop_map(text),
        1 => (0usize..3000, any::<char>()).prop_map(move |(n, c)| text(c.to_string().repeat(n))),
    ]
}

/// A row that maps, but for at most one column, which holds anything.
fn nearly_good_tuple() -> impl Strategy<Value = Vec<ColumnValue>> {
    let token = "[a-z0-9_-]{1,12}";
    (token, token, token, 0..8usize, column_value()).prop_map(
        |(aggregate_type, event_type, id, bad, value)| {
            let text = |s: &str| ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()));
            let mut row = vec![
                text(&id),
                text(&aggregate_type),
                text("42"),
                text(&event_type),
                text("\\x00ff"),
                ColumnValue::Null,
                text("2026-11-23 12:00:00+00"),
            ];
            if let Some(column) = row.get_mut(bad) {
                *column = value;
            }
            row
        },
    )
}

/// A tuple usually as wide as the relation, sometimes narrower or wider.
fn tuple() -> impl Strategy<Value = Vec<ColumnValue>> {
    prop_oneof![
        4 => nearly_good_tuple(),
        4 => proptest::collection::vec(column_value(), 7),
        1 => proptest::collection::vec(column_value(), 0..10),
    ]
}

fn mapping(payload_type: u32) -> RowMapping {
    let columns = ROLES
        .iter()
        .map(|name| Column {
            flags: 0,
            name: (*name).into(),
            type_oid: if *name == "payload" { payload_type } else { 25 },
            type_modifier: -1,
        })
        .collect();
    let relation = Relation {
        rel_id: 1,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns,
    };
    let template: SubjectTemplate = "outbox.{aggregate_type}.{event_type}".parse().unwrap();
    RowMapping::new(&relation, &ColumnRoles::default(), &template).unwrap()
}

/// Names NATS accepts (printable ASCII, no `:`), values on one line.
fn assert_valid_headers(headers: &Headers) {
    for (name, value) in headers.iter() {
        assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_graphic() && c != ':'));
        assert!(!value.contains(['\r', '\n']), "{name}: {value:?}");
    }
    assert_eq!(headers.lines().matches("\r\n").count(), headers.len(), "one line per header");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_row_maps_to_a_valid_message_or_a_dead_letter_that_fits(
        tuple in tuple(),
        bytea in any::<bool>(),
        budget in MIN_BUDGET..20_000usize,
        commit_lsn in any::<u64>(),
        index in any::<u32>(),
    ) {
        let mapping = mapping(if bytea { 17 } else { 3802 });
        let position = Position { commit_lsn, index };
        let rejection = match mapping.map(&tuple) {
            Ok(event) => {
                for token in event.subject.split('.') {
                    prop_assert!(!token.is_empty(), "{:?}", event.subject);
                    prop_assert!(
                        !token.contains(|c: char| c.is_whitespace() || c.is_control()
                            || c == '*' || c == '>'),
                        "{:?}", event.subject
                    );
                }
                assert_valid_headers(&event.headers);
                let id = event.headers.get("Nats-Msg-Id").map(str::to_owned);
                prop_assert_eq!(id.as_deref(), Some(event.id.as_str()));
                prop_assert!(!event.id.is_empty());
                // A mapped row can still be refused by the server: its letter must fit too.
                Rejection("refused by JetStream".into())
            }
            Err(rejection) => rejection,
        };
        let letter = mapping.dead_letter(&tuple, position, &rejection, "outbox.dead_letter", budget);
        let size = letter.event.headers.wire_len() + letter.event.payload.len();
        prop_assert!(size <= budget, "{size} > {budget}");
        assert_valid_headers(&letter.event.headers);
        let body: serde_json::Value = serde_json::from_slice(&letter.event.payload).unwrap();
        prop_assert_eq!(&body["table"], "public.outbox");
        prop_assert_eq!(&body["position"], &serde_json::Value::String(position.to_string()));
        prop_assert!(body["reason"].as_str().is_some());
        prop_assert_eq!(
            letter.event.headers.get(PAYLOAD_OMITTED_HEADER),
            Some(if letter.payload_omitted { "true" } else { "false" })
        );
    }

    /// Whatever an application emits (any bytes, or a JSON object of any values under the
    /// column names), the emitted message maps to a valid message or a dead letter that fits.
    #[test]
    fn any_emitted_message_maps_to_a_valid_message_or_a_dead_letter_that_fits(
        content in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200).prop_map(Bytes::from),
            proptest::collection::vec(
                (proptest::sample::select(ROLES.to_vec()), json_value()),
                0..8,
            )
            .prop_map(|pairs| {
                let object: serde_json::Map<String, serde_json::Value> =
                    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                Bytes::from(serde_json::Value::Object(object).to_string())
            }),
        ],
        budget in MIN_BUDGET..20_000usize,
    ) {
        let template = "outbox.{aggregate_type}.{event_type}".parse().unwrap();
        let mapping = RowMapping::for_emitted_messages("outbox", &ColumnRoles::default(), &template);
        let position = Position { commit_lsn: 1, index: 0 };
        let (row, rejection) = match mapping.emitted_row(&content) {
            Ok(row) => match mapping.map(&row) {
                Ok(event) => {
                    assert_valid_headers(&event.headers);
                    prop_assert!(!event.id.is_empty());
                    (row, Rejection("refused by JetStream".into()))
                }
                Err(rejection) => (row, rejection),
            },
            Err(refused) => refused,
        };
        let letter = mapping.dead_letter(&row, position, &rejection, "outbox.dead_letter", budget);
        let size = letter.event.headers.wire_len() + letter.event.payload.len();
        prop_assert!(size <= budget, "{size} > {budget}");
        assert_valid_headers(&letter.event.headers);
    }
}

/// JSON values of every kind, strings with line breaks and control characters among them.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        ".{0,40}".prop_map(serde_json::Value::String),
        "[a-z]{1,8}".prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map("[a-zA-Z-]{0,10}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}
