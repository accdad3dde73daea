//! Everything that talks to Postgres: connection parameters and TLS, the search path every
//! session pins at login (`pinned_names`), the walsender session
//! (`walsender`, over `socket`, with the pure CopyBoth envelope in `wire`), the pure
//! pgoutput decoder, libpq's environment and files (`libpq_env`), the password command
//! run at each connection (`password_command`), SQL for setup and status on an ordinary connection (`admin`), and the
//! check that the outbox table is still the one streamed (`outbox_table`), and the table as a
//! new slot's snapshot shows it (`table_snapshot`), and the tables a pattern matches
//! (`tenant_tables`), published by an event trigger or adopted (`adoption`) without
//! pgoutbox ever writing to them, and read only when their owner is trusted (`trust`);
//! pgoutbox's own objects in a schema of its own (`own_schema`).

pub(crate) mod acknowledged;
pub(crate) mod admin;
pub(crate) mod adoption;
mod backend;
pub(crate) mod conninfo;
pub mod libpq_env;
pub(crate) mod outbox_table;
pub(crate) mod own_schema;
pub(crate) mod password_command;
pub mod pgoutput;
mod pinned_names;
pub(crate) mod replay_table;
mod socket;
pub(crate) mod table_snapshot;
pub(crate) mod tenant_tables;
pub(crate) mod tls;
pub(crate) mod trust;
pub(crate) mod walsender;
pub(crate) mod wire;

pub use backend::ServerError;
pub use walsender::{ConnectionError, ReplicationConnection, SystemIdentity};
pub use wire::{ReplicationMessage, StandbyStatus};
