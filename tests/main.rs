//! The integration tests: one binary, so the support code compiles once. Each module of
//! `cases` is one behaviour against real PostgreSQL and nats-server processes that the
//! tests start and stop themselves (`support`).

mod cases;
mod support;
