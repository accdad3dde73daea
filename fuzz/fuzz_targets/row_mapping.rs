//! The row mapping on an arbitrary relation, column roles, subject template and tuple:
//! `RowMapping::new`, `map` and `dead_letter` must never panic; a mapped row must have a
//! valid subject and valid headers; a dead letter must fit its budget and have valid
//! headers and a JSON body.
#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pgoutbox::domain::outbox::{
    CloudEvents, ColumnRoles, ContentMode, Headers, MIN_BUDGET, PAYLOAD_OMITTED_HEADER, Rejection,
    RowMapping, ScheduleColumn, SubjectTemplate, refuse_allowed,
};
use pgoutbox::domain::progress::Position;
use pgoutbox::postgres::pgoutput::{Column, ColumnValue, Relation};

#[derive(Arbitrary, Debug)]
enum Value {
    Null,
    UnchangedToast,
    Text(Vec<u8>),
    Binary(Vec<u8>),
}

/// A role names a column of the relation (so rows can map) or any string.
#[derive(Arbitrary, Debug)]
enum Role {
    Column(u8),
    Named(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    namespace: String,
    name: String,
    columns: Vec<(String, u32)>,
    /// id, payload, headers, aggregate_type, aggregate_id, event_type, created_at.
    roles: [Role; 7],
    /// `--ttl-column`, `--allow-nats-header`s, and `--cloudevents` (structured or binary,
    /// with a source or not).
    ttl: Option<Role>,
    /// `--schedule-column` and `--schedule-subject-prefix`.
    schedule: Option<(Role, String)>,
    allowed_nats_headers: Vec<String>,
    cloudevents: Option<(bool, Option<String>)>,
    /// Placeholders of the subject template, as roles; the template's literal prefix.
    placeholders: Vec<Role>,
    prefix: String,
    tuple: Vec<Value>,
    budget: u32,
    commit_lsn: u64,
    index: u32,
}

/// Checked here independently of the crate's own validation, as NATS would.
fn valid_headers(headers: &Headers) -> bool {
    headers.iter().all(|(name, value)| {
        !name.is_empty()
            && name.chars().all(|c| c.is_ascii_graphic() && c != ':')
            && !value.contains(['\r', '\n'])
    })
}

fuzz_target!(|input: Input| {
    let columns: Vec<Column> = input
        .columns
        .iter()
        .map(|(name, type_oid)| Column {
            flags: 0,
            name: name.clone(),
            type_oid: *type_oid,
            type_modifier: -1,
        })
        .collect();
    let role = |role: &Role| match role {
        Role::Column(i) if !columns.is_empty() => {
            columns[usize::from(*i) % columns.len()].name.clone()
        }
        Role::Column(_) => String::new(),
        Role::Named(name) => name.clone(),
    };
    let [id, payload, headers, aggregate_type, aggregate_id, event_type, created_at] = &input.roles;
    let roles = ColumnRoles {
        id: role(id),
        payload: role(payload),
        headers: role(headers),
        aggregate_type: role(aggregate_type),
        aggregate_id: role(aggregate_id),
        event_type: role(event_type),
        created_at: role(created_at),
        ttl: input.ttl.as_ref().map(role),
        schedule: input.schedule.as_ref().map(|(column, subject_prefix)| ScheduleColumn {
            column: role(column),
            subject_prefix: subject_prefix.clone(),
        }),
        // As the settings take them: valid names only, lowercase.
        allowed_nats_headers: input
            .allowed_nats_headers
            .iter()
            .filter(|name| refuse_allowed(name).is_none())
            .map(|name| name.to_ascii_lowercase())
            .collect(),
        cloudevents: input.cloudevents.clone().map(|(structured, source)| CloudEvents {
            mode: if structured { ContentMode::Structured } else { ContentMode::Binary },
            source,
            database: "db".into(),
        }),
    };
    let mut placeholders = String::new();
    for placeholder in &input.placeholders {
        placeholders.push_str(&format!(".{{{}}}", role(placeholder)));
    }
    // An odd prefix or column name makes an invalid template; fall back so that the
    // mapping is still exercised.
    let Some(template) =
        [format!("{}{placeholders}", input.prefix), format!("outbox{placeholders}")]
            .iter()
            .find_map(|t| t.parse::<SubjectTemplate>().ok())
            .or_else(|| "outbox.fixed".parse().ok())
    else {
        return;
    };
    let relation = Relation {
        rel_id: 1,
        namespace: input.namespace.clone(),
        name: input.name.clone(),
        replica_identity: b'd',
        columns,
    };
    let Ok(mapping) = RowMapping::new(&relation, &roles, &template) else {
        return;
    };
    let tuple: Vec<ColumnValue> = input
        .tuple
        .iter()
        .map(|value| match value {
            Value::Null => ColumnValue::Null,
            Value::UnchangedToast => ColumnValue::UnchangedToast,
            Value::Text(b) => ColumnValue::Text(Bytes::copy_from_slice(b)),
            Value::Binary(b) => ColumnValue::Binary(Bytes::copy_from_slice(b)),
        })
        .collect();
    let rejection = match mapping.map(&tuple) {
        Ok(event) => {
            assert!(
                event.subject.split('.').all(|token| !token.is_empty()
                    && !token.contains(|c: char| c.is_whitespace()
                        || c.is_control()
                        || c == '*'
                        || c == '>')),
                "invalid subject {:?}",
                event.subject
            );
            assert!(valid_headers(&event.headers), "{:?}", event.headers);
            Rejection("refused by JetStream".into())
        }
        Err(rejection) => rejection,
    };
    let budget = input.budget as usize % (1 << 20);
    let position = Position { commit_lsn: input.commit_lsn, index: input.index };
    let letter = mapping.dead_letter(&tuple, position, &rejection, "outbox.dead_letter", budget);
    let size = letter.event.headers.wire_len() + letter.event.payload.len();
    assert!(size <= budget.max(MIN_BUDGET), "{size} > {budget}");
    assert!(valid_headers(&letter.event.headers), "{:?}", letter.event.headers);
    assert!(letter.event.headers.get(PAYLOAD_OMITTED_HEADER).is_some());
    let body: serde_json::Value =
        serde_json::from_slice(&letter.event.payload).expect("the body is JSON");
    assert!(body["reason"].is_string() && body["table"].is_string());
});
