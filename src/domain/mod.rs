//! The pure core: no tokio, no sockets, no SQL. Which LSN may be confirmed (`progress`),
//! where a message comes from and when the stream's tail may be trusted (`source`), how a
//! row becomes a message or a dead letter (`outbox`), what each message is chained to and
//! what JetStream's answer means (`publishing`), when pgoutbox is stalled (`stall`), the
//! pace of a seed or a replay (`throughput`), a message's W3C trace context (`trace_context`) and how long to wait before retrying
//! (`retry`). Named `domain` because `core` is Rust's.

pub mod delivery;
pub mod horizon;
pub mod outbox;
pub mod progress;
pub mod publishing;
pub mod retry;
pub mod row;
pub mod seed;
pub mod source;
pub mod stall;
pub mod throttle;
pub mod throughput;
pub mod trace_context;
pub mod transaction;
