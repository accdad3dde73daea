//! The integration tests: one binary, so the support code compiles once. Each module of
//! `cases` is one behaviour against real PostgreSQL and nats-server processes that the
//! tests start and stop themselves (`support`).

// Test output: println! is fine here (clippy.toml forbids it in src/).
#![allow(clippy::disallowed_macros)]

mod cases;
mod support;
