//! One table's settings: which column plays which role, and what the message makes of
//! them. Kept together so that each table could later have its own.

use super::CloudEvents;

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
            allowed_nats_headers: Vec::new(),
            cloudevents: None,
        }
    }
}
