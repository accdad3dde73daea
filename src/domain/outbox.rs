//! Outbox row → NATS message: the one place where columns become subject, headers and body.
//!
//! A [`RowMapping`] is built once per pgoutput Relation message (so schema changes are
//! honoured) and then maps each inserted tuple without looking names up again. A row that
//! cannot become a correct message is never published under a wrong subject nor dropped: it
//! is turned into a [`Rejection`], and [`RowMapping::dead_letter`] builds the message the
//! pipeline sends to the dead-letter subject in its place.
//!
//! Everything here is pure: no I/O, no async, and no panic whatever bytes a column holds
//! (every header name and value is checked before it is set), so it is unit-, property- and
//! fuzz-tested on values alone.

use bytes::Bytes;

use crate::domain::row::{ColumnValue, Relation, bytea_text};

mod cloudevents;
mod controls;
mod dead_letter;
mod emitted;
mod headers;
mod partition;
mod pattern;
mod roles;
mod subject;
mod template;

pub use cloudevents::{CloudEvents, ContentMode};
pub use controls::{
    SCHEDULE_HEADER, SCHEDULE_TARGET_HEADER, SCHEDULER_HEADER, ScheduleColumn, held_at,
    refuse_allowed,
};
pub use dead_letter::{
    DEAD_LETTER_ID_PREFIX, DEAD_LETTER_REASON_HEADER, DeadLetter, MIN_BUDGET,
    PAYLOAD_OMITTED_HEADER, RefusedRows, TRUNCATED, letter_row, letter_row_in,
};
pub use emitted::{EMITTED_LABEL, log_preview};
pub use headers::Headers;
use headers::{header_safe_table, header_value, optional_headers};
pub use partition::partition;
pub use pattern::{InvalidPattern, TablePattern};
pub use roles::{ColumnRoles, InvalidTableName, MessageId, TableEntry, TableName};
use subject::SubjectPart;
pub use template::{MAX_SUBJECT_BYTES, SubjectTemplate, TemplateError, subjects_overlap};
use template::{Part, check_subject_token};

const BYTEA_OID: u32 = 17;
/// How much of a bad value a rejection's reason quotes.
const SHOWN_VALUE_BYTES: usize = 64;

/// The header JetStream deduplicates by: the row's id.
pub const MESSAGE_ID_HEADER: &str = "Nats-Msg-Id";

/// The table a row came from, `<schema>.<table>`, on every message of a table row, dead
/// letters included: with several tables, consumers and `pgoutbox` itself tell them apart.
pub const TABLE_HEADER: &str = "Pgoutbox-Table";

/// On every message of an emitted event (dead letters too), in `Pgoutbox-Table`'s place: the
/// prefix it was emitted with. Such a message is no table's row, whatever its id says, and
/// nothing reading the stream back (a recovery, `verify`) takes it for one (issue 45).
pub const EMITTED_HEADER: &str = "Pgoutbox-Emitted";

/// A ready-to-publish message.
#[derive(Debug, Clone)]
pub struct OutboxEvent {
    pub id: String,
    pub subject: String,
    pub headers: Headers,
    pub payload: Bytes,
}

/// Why a row cannot be published as it is. The row goes to the dead-letter subject.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rejection(pub String);

/// The outbox table's shape does not fit the configured roles: no row could ever map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("table {table} has no column {column:?} (needed as the {role}); {hint}")]
pub struct MappingError {
    pub table: String,
    pub column: String,
    pub role: &'static str,
    hint: &'static str,
}

/// Column positions for one version of the outbox table.
#[derive(Clone)]
pub struct RowMapping {
    table: String,
    column_names: Vec<String>,
    id: usize,
    payload: usize,
    payload_is_bytea: bool,
    headers: Option<usize>,
    header_columns: Vec<(&'static str, usize)>,
    subject: Vec<SubjectPart>,
    /// Why no row of this version of the table can be published, when none can: it lacks a
    /// column the mapping needs that the table has today (it was added later).
    unusable: Option<String>,
    /// Put before the id in `Nats-Msg-Id`: a replay's rows are messages of their own
    /// (`replay_id_prefix` in domain/seed.rs); empty otherwise.
    id_prefix: String,
    ttl: Option<usize>,
    /// `--schedule-column`'s position, and the settings.
    schedule: Option<(usize, ScheduleColumn)>,
    allowed_nats_headers: Vec<String>,
    envelope: Option<Box<cloudevents::Envelope>>,
    /// The entry's own (see [`RowMapping::in_entry`]); empty until then.
    dead_letter_subject: String,
    /// The header that says where its messages come from: `Pgoutbox-Table` and the table
    /// (header-safe), or `Pgoutbox-Emitted` and the prefix; no header while the value is empty.
    origin: (&'static str, String),
    /// Put between the id prefix and the id: `<schema>.<table>:` with several tables.
    id_qualifier: String,
    /// What `/metrics` counts this mapping's messages under (the `table` label): its entry's
    /// [`TableEntry::metrics_label`], or [`EMITTED_LABEL`]; empty until
    /// [`RowMapping::in_entry`].
    counted_as: String,
}

impl RowMapping {
    pub fn new(
        relation: &Relation,
        roles: &ColumnRoles,
        template: &SubjectTemplate,
    ) -> Result<Self, MappingError> {
        let table = format!("{}.{}", relation.namespace, relation.name);
        let find = |name: &str| relation.columns.iter().position(|c| c.name == name);
        let require = |name: &str, role: &'static str| {
            find(name).ok_or_else(|| MappingError {
                table: table.clone(),
                column: name.to_owned(),
                role,
                hint: "set the column roles with --id-column, --payload-column or \
                       --subject-template to match the table",
            })
        };
        let id = require(&roles.id, "id")?;
        let payload = require(&roles.payload, "payload")?;
        let (subject, unusable) = subject::resolve(template, relation, roles, require)?;
        let header_columns = optional_headers(roles)
            .filter_map(|(header, column)| Some((header, find(column)?)))
            .collect();
        let ttl = roles.ttl.as_deref().map(|c| require(c, "TTL column")).transpose()?;
        let schedule = match &roles.schedule {
            Some(s) => Some((require(&s.column, "schedule column")?, s.clone())),
            None => None,
        };
        let envelope = match &roles.cloudevents {
            None => None,
            Some(settings) => {
                let typed = |name: &str| find(name).map(|i| (i, relation.columns[i].type_oid));
                let payload_type = Some(relation.columns[payload].type_oid);
                let envelope =
                    cloudevents::Envelope::new(settings, roles, &table, payload_type, typed);
                Some(Box::new(envelope.ok_or_else(|| MappingError {
                    table: table.clone(),
                    column: roles.event_type.clone(),
                    role: "event type, ce-type",
                    hint: "a CloudEvent needs a type: set --event-type-column",
                })?))
            }
        };
        Ok(RowMapping {
            payload_is_bytea: relation.columns[payload].type_oid == BYTEA_OID,
            column_names: relation.columns.iter().map(|c| c.name.clone()).collect(),
            headers: find(&roles.headers),
            table,
            id,
            payload,
            header_columns,
            subject,
            unusable,
            id_prefix: String::new(),
            ttl,
            schedule,
            allowed_nats_headers: roles.allowed_nats_headers.clone(),
            envelope,
            dead_letter_subject: String::new(),
            origin: (TABLE_HEADER, String::new()),
            id_qualifier: String::new(),
            counted_as: String::new(),
        })
    }

    /// The mapping of a row of `entry`'s table, as pgoutput described it in `relation`.
    pub fn of_entry(relation: &Relation, entry: &TableEntry) -> Result<Self, MappingError> {
        Ok(Self::new(relation, &entry.roles, &entry.template)?.in_entry(entry))
    }

    /// The same mapping, as one of `entry`'s table: its dead-letter subject, its
    /// `Pgoutbox-Table` header (dead letters too) and, with several tables, its ids
    /// qualified by the table's name (`MessageId::Qualified`).
    pub fn in_entry(mut self, entry: &TableEntry) -> Self {
        let table = entry.table.to_string();
        self.dead_letter_subject = entry.dead_letter_subject.clone();
        self.id_qualifier = match entry.message_id {
            MessageId::Row => String::new(),
            MessageId::Qualified => format!("{table}:"),
        };
        self.origin = (TABLE_HEADER, header_safe_table(&table));
        self.counted_as = entry.metrics_label();
        self
    }

    /// The `Pgoutbox-Table` its messages carry; empty for emitted messages.
    pub fn source_table(&self) -> &str {
        match self.origin {
            (TABLE_HEADER, ref table) => table,
            _ => "",
        }
    }

    /// What `/metrics` counts this mapping's messages under: the `table` label.
    pub fn counted_as(&self) -> &str {
        &self.counted_as
    }

    /// Its messages' subjects in few names, for traces (a subject is unique per aggregate,
    /// tenant or row): the subject template (`tenants.{$schema}.{event_type}`), or for a
    /// `held` row the subjects it is held on (`schedules.OUTBOX.{$id}.{$position}`).
    pub fn subject_template(&self, held: bool) -> String {
        if let Some((_, schedule)) = self.schedule.as_ref().filter(|_| held) {
            return format!("{}.{{$id}}.{{$position}}", schedule.subject_prefix);
        }
        self.template_text()
    }

    /// The same mapping, its dead letters sent to `subject`.
    pub fn with_dead_letter_subject(mut self, subject: &str) -> Self {
        subject.clone_into(&mut self.dead_letter_subject);
        self
    }

    /// The subject this mapping's dead letters go to.
    pub fn dead_letter_subject(&self) -> &str {
        &self.dead_letter_subject
    }

    /// The same mapping, with `prefix` before every id it reads.
    pub fn with_id_prefix(mut self, prefix: String) -> Self {
        self.id_prefix = prefix;
        self
    }

    /// A mapping for a version of the table that lacks a column the mapping needs, written
    /// before that column was added: each of its rows becomes a dead letter saying so, where
    /// failing would stop pgoutbox on every start until the WAL past it was thrown away.
    pub fn unusable(relation: &Relation, roles: &ColumnRoles, missing: &MappingError) -> Self {
        let why = format!(
            "the row was written before column {:?} (the {}) was added to {}",
            missing.column, missing.role, missing.table
        );
        Self::refusing(relation, roles, why)
    }

    /// A mapping that publishes none of its rows: each becomes a dead letter saying `why`
    /// (a replayed row pgoutbox may not publish, `service::pipeline::replayed`).
    pub fn refusing(relation: &Relation, roles: &ColumnRoles, why: String) -> Self {
        let find = |name: &str| relation.columns.iter().position(|c| c.name == name);
        RowMapping {
            table: format!("{}.{}", relation.namespace, relation.name),
            column_names: relation.columns.iter().map(|c| c.name.clone()).collect(),
            // Out of range when missing: a dead letter then reads nothing from them.
            id: find(&roles.id).unwrap_or(usize::MAX),
            payload: find(&roles.payload).unwrap_or(usize::MAX),
            payload_is_bytea: false,
            headers: None,
            header_columns: Vec::new(),
            subject: Vec::new(),
            unusable: Some(why),
            id_prefix: String::new(),
            ttl: None,
            schedule: None,
            allowed_nats_headers: Vec::new(),
            envelope: None,
            dead_letter_subject: String::new(),
            origin: (TABLE_HEADER, String::new()),
            id_qualifier: String::new(),
            counted_as: String::new(),
        }
    }

    /// Maps one inserted row, or says why it cannot be published.
    pub fn map(&self, tuple: &[ColumnValue]) -> Result<OutboxEvent, Rejection> {
        if let Some(why) = &self.unusable {
            return Err(Rejection(why.clone()));
        }
        if tuple.len() != self.column_names.len() {
            return Err(Rejection(format!(
                "row has {} columns, the relation announced {}",
                tuple.len(),
                self.column_names.len()
            )));
        }
        let text = self.id_text(tuple)?;
        let id = format!("{}{}{text}", self.id_prefix, self.id_qualifier);
        let mut subject = self.subject_of(tuple)?;
        let mut headers = Headers::with_capacity(256);
        headers.insert(MESSAGE_ID_HEADER, header_value(&id, || self.name(self.id))?);
        if !self.origin.1.is_empty() {
            headers.insert(self.origin.0, &self.origin.1);
        }
        for &(header, i) in &self.header_columns {
            if let ColumnValue::Text(value) = &tuple[i] {
                let value = utf8(value, || self.name(i))?;
                headers.insert(header, header_value(value, || self.name(i))?);
            }
        }
        if let Some(i) = self.headers {
            self.add_user_headers(&tuple[i], &mut headers)?;
        }
        self.set_ttl(tuple, &mut headers)?;
        if let Some(held_on) = self.hold_until_due(tuple, text, &id, &subject, &mut headers)? {
            subject = held_on;
        }
        let payload = self.payload_of(tuple)?;
        let payload = match &self.envelope {
            None => payload,
            Some(envelope) => envelope.wrap(self, tuple, text, &mut headers, payload)?,
        };
        Ok(OutboxEvent { id, subject, headers, payload })
    }

    /// The row's id column as text, if it can be a message id.
    fn id_text<'a>(&self, tuple: &'a [ColumnValue]) -> Result<&'a str, Rejection> {
        let text = self.text(tuple, self.id)?;
        if text.is_empty() || text.contains(['\r', '\n']) {
            return Err(Rejection(format!(
                "column {} is not a usable message id",
                self.name(self.id)
            )));
        }
        Ok(text)
    }

    /// The payload column's bytes (a `bytea` as the bytes it holds).
    fn payload_of(&self, tuple: &[ColumnValue]) -> Result<Bytes, Rejection> {
        match &tuple[self.payload] {
            ColumnValue::Text(bytes) if self.payload_is_bytea => bytea_text(bytes)
                .ok_or_else(|| Rejection("bytea payload is not in hex format".into())),
            ColumnValue::Text(bytes) | ColumnValue::Binary(bytes) => Ok(bytes.clone()),
            ColumnValue::Null => {
                Err(Rejection(format!("column {} is NULL", self.name(self.payload))))
            }
            ColumnValue::UnchangedToast => {
                Err(Rejection("payload was not sent (unchanged TOAST)".into()))
            }
        }
    }

    fn add_user_headers(
        &self,
        value: &ColumnValue,
        headers: &mut Headers,
    ) -> Result<(), Rejection> {
        let bytes = match value {
            ColumnValue::Text(b) | ColumnValue::Binary(b) => b,
            ColumnValue::Null | ColumnValue::UnchangedToast => return Ok(()),
        };
        let column = self.headers.map(|i| self.name(i)).unwrap_or_default();
        let object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(bytes)
            .map_err(|_| Rejection(format!("column {column} is not a JSON object")))?;
        for (key, value) in object {
            // A string is the header's value; `null` leaves the header out; anything else
            // arrives as its compact JSON text (`3`, `true`, `{"a":1}`), which never holds a
            // line break, so nothing the application wrote is lost or turned away.
            let value = match value {
                serde_json::Value::String(text) => text,
                serde_json::Value::Null => continue,
                other => other.to_string(),
            };
            if key.is_empty() {
                return Err(Rejection(format!("an empty header name in column {column}")));
            }
            let lower = key.to_ascii_lowercase();
            let allowed = || self.allowed_nats_headers.contains(&lower);
            if (lower.starts_with("nats-") && !allowed()) || lower.starts_with("pgoutbox-") {
                return Err(Rejection(format!("header {key:?} in column {column} is reserved")));
            }
            if let Some(why) = self.envelope.as_ref().and_then(|e| e.reserves(&lower)) {
                return Err(Rejection(format!(
                    "header {key:?} in column {column} is reserved: {why}"
                )));
            }
            if !headers::valid_name(&key) {
                return Err(Rejection(format!(
                    "header name {key:?} in column {column} is invalid"
                )));
            }
            headers.insert(&key, header_value(&value, || column)?);
        }
        Ok(())
    }

    fn text<'a>(&self, tuple: &'a [ColumnValue], i: usize) -> Result<&'a str, Rejection> {
        match &tuple[i] {
            ColumnValue::Text(b) | ColumnValue::Binary(b) => utf8(b, || self.name(i)),
            ColumnValue::Null => Err(Rejection(format!("column {} is NULL", self.name(i)))),
            ColumnValue::UnchangedToast => {
                Err(Rejection(format!("column {} was not sent (unchanged TOAST)", self.name(i))))
            }
        }
    }

    fn name(&self, i: usize) -> &str {
        &self.column_names[i]
    }
}

fn utf8<'a, 'n>(bytes: &'a [u8], column: impl Fn() -> &'n str) -> Result<&'a str, Rejection> {
    std::str::from_utf8(bytes)
        .map_err(|_| Rejection(format!("column {} is not valid UTF-8", column())))
}

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;
