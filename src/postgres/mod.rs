//! Everything that talks to Postgres: connection parameters and TLS, the walsender session
//! (`walsender`, over `socket`, with the pure CopyBoth envelope in `wire`), the pure
//! pgoutput decoder, and SQL for setup and status on an ordinary connection (`admin`).

pub(crate) mod admin;
mod backend;
pub(crate) mod conninfo;
pub mod pgoutput;
mod socket;
pub(crate) mod tls;
pub(crate) mod walsender;
pub(crate) mod wire;

pub use backend::ServerError;
pub use walsender::{ConnectionError, ReplicationConnection, SystemIdentity};
pub use wire::{ReplicationMessage, StandbyStatus};
