//! pgoutbox streams committed outbox rows from Postgres to NATS JetStream.
//!
//! ```text
//! Postgres WAL ─▶ replication::connection ─▶ pgoutput (decode) ─▶ outbox (row → message)
//!                        ▲                                              │
//!                        │ standby status: flush = progress::LsnTracker │ publisher (JetStream,
//!                        └───────────── pipeline (the one loop) ◀───────┘  acks in flight)
//! ```
//! The invariant everything rests on: the LSN reported to Postgres never passes the end of
//! a transaction that has a message JetStream has not acknowledged. It is enforced in one
//! place, [`pipeline`], from one small pure type, [`progress::LsnTracker`].
//!
//! Modules: `pgoutput` and `replication::wire` are pure decoding; `replication::connection`
//! is the walsender session; `outbox` maps rows; `publisher` talks to JetStream; `pipeline`
//! owns the loop and LSN bookkeeping; `slot` is SQL for setup and status; `liveness` checks
//! while streaming that Postgres still answers; `conninfo` reads the libpq parameters
//! tokio-postgres does not (TCP keepalive, timeouts); `cli`, `config` and `commands` are the
//! edges.

pub mod claim;
pub mod cli;
pub mod commands;
pub mod config;
pub mod conninfo;
pub mod error;
pub mod liveness;
pub mod outbox;
pub mod pgoutput;
pub mod pipeline;
pub mod progress;
pub mod publisher;
pub mod replication;
pub mod retention;
pub mod shutdown;
pub mod slot;
pub mod source;
pub mod stall;
pub mod telemetry;
pub mod tls;
pub mod units;
