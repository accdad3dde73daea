//! One table's settings: which column plays which role, and what the message makes of
//! them, gathered in a [`TableEntry`], so that each table of several has its own.

use super::{CloudEvents, ScheduleColumn, SubjectTemplate, TablePattern};

/// Which column plays which role, and what the message makes of them; defaults follow
/// `sql/outbox.sql`. One table's settings, so that each table could have its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnRoles {
    pub id: String,
    pub payload: String,
    /// A JSON object of string pairs added as headers; optional.
    pub headers: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub created_at: String,
    /// `--ttl-column`: its value becomes `Nats-TTL` (NULL: none).
    pub ttl: Option<String>,
    /// `--schedule-column`: a row whose value is a time is delivered then (NULL: now).
    pub schedule: Option<ScheduleColumn>,
    /// `--allow-nats-header`: the `Nats-` headers the headers column may set, lowercase.
    pub allowed_nats_headers: Vec<String>,
    /// `--cloudevents`: each message is also a CloudEvent.
    pub cloudevents: Option<CloudEvents>,
}

impl Default for ColumnRoles {
    fn default() -> Self {
        ColumnRoles {
            id: "id".into(),
            payload: "payload".into(),
            headers: "headers".into(),
            aggregate_type: "aggregate_type".into(),
            aggregate_id: "aggregate_id".into(),
            event_type: "event_type".into(),
            created_at: "created_at".into(),
            ttl: None,
            schedule: None,
            allowed_nats_headers: Vec::new(),
            cloudevents: None,
        }
    }
}

/// A schema-qualified table name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

/// A `--table` value that names no table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid table name {0:?}: expected schema.table or table")]
pub struct InvalidTableName(String);

impl std::str::FromStr for TableName {
    type Err = InvalidTableName;

    fn from_str(s: &str) -> Result<Self, InvalidTableName> {
        let (schema, name) = s.split_once('.').unwrap_or(("public", s));
        if schema.is_empty() || name.is_empty() || name.contains('.') {
            return Err(InvalidTableName(s.to_owned()));
        }
        Ok(TableName { schema: schema.to_owned(), name: name.to_owned() })
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

impl TableName {
    pub fn quoted(&self) -> String {
        use postgres_protocol::escape::escape_identifier as quote_ident;
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

/// What a row's `Nats-Msg-Id` is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageId {
    /// The id column's text, as with one table: what consumers deduplicated by so far.
    Row,
    /// `<schema>.<table>:<id>`: with several tables, bigserial ids of two tables collide,
    /// and JetStream would take the second row for a duplicate of the first.
    Qualified,
}

/// One outbox table and everything that is its own: the column roles, the subject
/// template, the dead-letter subject and how its message ids are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableEntry {
    /// The table; for an entry of a pattern, the pattern's text until a table matches,
    /// then (in the pipeline) each matched table's name.
    pub table: TableName,
    /// `Some`: the entry names its tables by a pattern with `*` (schema-per-tenant), and a
    /// matched table whose shape does not fit has its rows made dead letters instead of
    /// stopping pgoutbox.
    pub pattern: Option<TablePattern>,
    pub roles: ColumnRoles,
    pub template: SubjectTemplate,
    pub dead_letter_subject: String,
    pub message_id: MessageId,
}

impl TableEntry {
    /// The `table` label of this entry's series on `/metrics` (`pgoutbox_rows_published_total`
    /// and the other per-row counters): its table, `schema.table`, as configured, or its
    /// pattern's text for every table the pattern matched. Bounded by the configuration,
    /// whatever the rows or the tenants are.
    pub fn metrics_label(&self) -> String {
        match &self.pattern {
            Some(pattern) => pattern.to_string(),
            None => self.table.to_string(),
        }
    }

    /// The entry as the one of `table`, a table its pattern matched.
    pub fn for_table(&self, table: TableName) -> TableEntry {
        TableEntry { table, ..self.clone() }
    }
}
