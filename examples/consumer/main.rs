//! A consumer of pgoutbox's stream that applies events to its own database, as a service
//! would: `cargo run --example consumer`. What it shows:
//!
//! - **Parallel, each key in order.** pgoutbox runs with `--partitions N --subject-template
//!   'outbox.{$partition}.{aggregate_type}.{event_type}'`: each aggregate's events are on
//!   one partition, in commit order.
//! - **Whole transactions.** `Pgoutbox-Position` (`<commit LSN>:<index>`) names an event's
//!   transaction; its last event says `Pgoutbox-Transaction-Last: true` and how many events
//!   the transaction has (`Pgoutbox-Transaction-Rows`). One reader reads the stream in
//!   order and puts each event on its partition's lane; a transaction is applied in one
//!   transaction of the consumer's database once all its events arrived and it is the
//!   oldest waiting on every partition it touches. Dead letters are read too: they count.
//!   A transaction still without its last when a seeded row arrives was cut by a lost slot:
//!   everything stored before the seeded row has arrived, so it is applied as it is.
//!   The marks cannot tell a message still to come from one removed before it was read (a
//!   TTL, the stream's limits): a transaction that waits `REPORT_WAITING_AFTER` seconds
//!   (60) for its other events is reported on stderr, and waits on.
//! - **Or one process per partition.** With `PARTITION=<p>`, the process reads partition
//!   `p` alone, with the transactions' ends (pgoutbox's `--transaction-subject`, read from
//!   `TRANSACTION_SUBJECT`, `<root>.transactions` by default) in one ordered consumer: a
//!   transaction's part on `p` is the events of its commit LSN before its end, and the end
//!   says how many (`partitions[p]`). Each part is applied in one transaction when its end
//!   arrives; a part short of its count (a message removed before it was read) is reported
//!   and applied as it is. Dead letters are counted by the end, not read: a reader of the
//!   dead-letter subject of its own handles them. A scheduled row's delivery and a seeded
//!   row are each applied alone, when they arrive.
//! - **Payloads of any size.** A payload pgoutbox stored in the Object Store
//!   (`--object-store`) arrives as a pointer (`Pgoutbox-Object-Bucket`, `-Name`, `-Size`,
//!   `-Sha256`) with no payload: the object is fetched and checked against its digest.
//! - **Once, through any crash.** The events, and how far each partition was applied, are
//!   written in that same transaction; a restart (kill -9 included) reads again after the
//!   last message before the oldest event still waiting (each partition after the last
//!   sequence applied, with `PARTITION`), and an event id (the primary key) or a
//!   transaction applied before turns whatever is read twice into nothing. The event id is
//!   `Pgoutbox-Event-Id` where a message has it (a scheduled row's delivery, which
//!   nats-server sends without `Nats-Msg-Id`), else `Nats-Msg-Id` without the
//!   `replay:<replay id>/<n>:` a `pgoutbox replay` puts before it: a replayed row is the
//!   same event. A seeded row (`--recover`, `--backfill`: no transaction marks) is a
//!   transaction of its own, named by its id, since every seed numbers its positions from
//!   `0/0:0`.
//! - **Any payload.** Stored as bytes (`bytea` payloads are not text); a message pgoutbox's
//!   headers do not describe is reported on stderr and skipped; a payload that cannot be
//!   fetched stops the consumer, whose restart reads it again.
//!
//! Settings: `NATS_URL`, `PGOUTBOX_STREAM` (OUTBOX), `PARTITIONS` (4) and
//! `REPORT_WAITING_AFTER` (60), or `PARTITION` and `TRANSACTION_SUBJECT`, `SUBJECT_ROOT`
//! (`outbox`: the template's first token, and `<root>.dead_letter` the dead letters'), and
//! `CONSUMER_DATABASE_URL`, a libpq connection string for the consumer's own database.
//!
//! Where: `message.rs` reads a message (its event id, its payload or object), `whole.rs`
//! reads every partition at once, in one reader, `partition.rs` one partition with the ends, and
//! `store.rs` writes what was applied and says where each reader resumes.

// An example, printing what it applies: println! is fine here (clippy.toml forbids it in src/).
#![allow(clippy::disallowed_macros)]

mod message;
mod partition;
mod store;
mod whole;

use std::time::Duration;

use async_nats::jetstream;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A setting from the environment, or its default.
fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut db =
        store::connect(&setting("CONSUMER_DATABASE_URL", "host=127.0.0.1 user=postgres")).await?;
    let js = jetstream::new(connect_nats(&setting("NATS_URL", "nats://127.0.0.1:4222")).await?);
    let stream = js.get_stream(setting("PGOUTBOX_STREAM", "OUTBOX")).await?;
    let root = setting("SUBJECT_ROOT", "outbox");
    match std::env::var("PARTITION") {
        Ok(partition) => partition::consume(&mut db, &js, stream, (&root, &partition)).await,
        Err(_) => {
            let partitions = setting("PARTITIONS", "4").parse()?;
            let report_after = Duration::from_secs(setting("REPORT_WAITING_AFTER", "60").parse()?);
            whole::consume(&mut db, &js, stream, (&root, partitions, report_after)).await
        }
    }
}

/// Connects to NATS. A server that went away may come back without its unsynced tail: the
/// consumer exits (75) to start again from its database, which then finds out
/// (`store::resume_point`).
async fn connect_nats(url: &str) -> Result<async_nats::Client, Error> {
    let client = async_nats::ConnectOptions::new()
        .event_callback(|event| async move {
            if matches!(event, async_nats::Event::Disconnected) {
                eprintln!("consumer: NATS disconnected: exiting, to resume from the database");
                std::process::exit(75);
            }
        })
        .connect(url)
        .await?;
    Ok(client)
}
