//! pgoutbox streams committed outbox rows from Postgres to NATS JetStream.
//!
//! ```text
//! Postgres WAL ─▶ postgres::walsender ─▶ postgres::pgoutput (decode) ─▶ domain::outbox
//!                        ▲                                                 │ (row → message)
//!                        │ standby status: flush = domain::progress::LsnTracker
//!                        └──────────── service::pipeline (the one loop) ◀── nats::outbound
//! ```
//! The invariant everything rests on: the LSN reported to Postgres never passes the end of
//! a transaction that has a message JetStream has not acknowledged. It is enforced in one
//! place, [`service::pipeline`], from one small pure type, [`domain::progress::LsnTracker`].
//!
//! Layers, each using only those listed before it: [`domain`] (pure rules), [`postgres`]
//! and [`nats`] (the two servers), [`settings`] (arguments → validated config),
//! [`service`] (the loop and what runs beside it), [`commands`] (one per subcommand).
//! docs/architecture.md draws them. Only what the binary and the fuzz targets use is
//! public; `nats`, `service` and the Postgres connection modules are the crate's own.

pub mod commands;
pub mod domain;
pub(crate) mod nats;
pub mod postgres;
pub(crate) mod service;
pub mod settings;

/// nats-server's `/varz` read for its sync interval, public for its fuzz target
/// (`fuzz/fuzz_targets/varz_sync.rs`).
pub use nats::monitor::parse_varz;
/// The NATS protocol parser, public for its fuzz target (`fuzz/fuzz_targets/nats_wire.rs`).
pub use nats::wire as nats_wire;
