//! The replication connection: the walsender session and its CopyBoth envelope.

pub mod connection;
mod socket;
pub mod wire;

pub use connection::{ConnectionError, ReplicationConnection, ServerError, SystemIdentity};
pub use wire::{ReplicationMessage, StandbyStatus};
