//! The consumer's own database: the events it applied, each transaction applied, and how
//! far each lane (a partition, or the dead letters) was read, all written together.

use std::collections::BTreeMap;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::stream::Stream;

use crate::Error;
use crate::message::Event;

/// The consumer's tables: what it applied, and how far it read each lane.
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS consumer_events (
        id text PRIMARY KEY, -- the event id (see message.rs)
        transaction text NOT NULL,
        index int NOT NULL,
        subject text NOT NULL,
        payload bytea NOT NULL,
        stream_sequence bigint NOT NULL,
        applied_in bigint NOT NULL DEFAULT txid_current(),
        applied_order bigserial);
    CREATE TABLE IF NOT EXISTS consumer_transactions (transaction text PRIMARY KEY);
    CREATE TABLE IF NOT EXISTS consumer_lanes (lane int PRIMARY KEY, applied_through bigint);
    -- When the stream stored the message at applied_through (ns): whether it still does.
    ALTER TABLE consumer_lanes ADD COLUMN IF NOT EXISTS applied_at bigint;";

/// How far back a lane reads again when the stream no longer holds the last message it
/// applied: pgoutbox's durability horizon (150 s by default) and nats-server's sync
/// interval (2 min), with room.
const REWIND: std::time::Duration = std::time::Duration::from_secs(300);

/// Connects to the consumer's database (a libpq connection string) and makes its tables.
pub async fn connect(database: &str) -> Result<tokio_postgres::Client, Error> {
    let (db, connection) = tokio_postgres::connect(database, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            eprintln!("consumer: the database connection ended: {err}");
            std::process::exit(1);
        }
    });
    // One process per partition may start at once: one of them makes the tables.
    db.batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock(5481); {SCHEMA} COMMIT;"))
        .await?;
    Ok(db)
}

/// Where `lane` resumes: after the last message it applied, while the stream still holds
/// that message. A server that lost its unsynced tail (a power loss) no longer does, and
/// pgoutbox publishes again into it, so the sequences past its new end name other
/// messages: then the lane reads again from [`REWIND`] before that message, by time, and
/// the event ids and transactions applied make what is read twice nothing.
pub async fn resume_point(
    db: &tokio_postgres::Client,
    stream: &Stream,
    lane: usize,
) -> Result<DeliverPolicy, Error> {
    let query = "SELECT applied_through, applied_at FROM consumer_lanes WHERE lane = $1";
    let Some(row) = db.query_opt(query, &[&(lane as i32)]).await? else {
        return Ok(DeliverPolicy::All);
    };
    let (through, at): (i64, Option<i64>) = (row.get(0), row.get(1));
    let after = DeliverPolicy::ByStartSequence { start_sequence: through as u64 + 1 };
    let Some(at) = at else { return Ok(after) };
    let held = stream.get_raw_message(through as u64).await.ok();
    if held.is_some_and(|message| message.time.unix_timestamp_nanos() as i64 == at) {
        return Ok(after);
    }
    eprintln!(
        "consumer: lane {lane}: the stream no longer holds the message at sequence {through} \
         applied last (its server lost its tail?): reading again from {REWIND:?} before it"
    );
    let from = at as i128 - REWIND.as_nanos() as i128;
    let start_time = time::OffsetDateTime::from_unix_timestamp_nanos(from)?;
    Ok(DeliverPolicy::ByStartTime { start_time })
}

/// Whether the event `id` was applied before.
pub async fn event_applied(db: &tokio_postgres::Client, id: &str) -> Result<bool, Error> {
    let query = "SELECT EXISTS (SELECT FROM consumer_events WHERE id = $1)";
    Ok(db.query_one(query, &[&id]).await?.get(0))
}

/// Whether the transaction `name` was applied before.
pub async fn applied_before(db: &tokio_postgres::Client, name: &str) -> Result<bool, Error> {
    let query = "SELECT EXISTS (SELECT FROM consumer_transactions WHERE transaction = $1)";
    Ok(db.query_one(query, &[&name]).await?.get(0))
}

/// Applies `events` as the transaction `name`, once, in one transaction of the database
/// that also records how far each lane is applied (`through`: the last message's sequence
/// and when the stream stored it). Whether it was new (not applied before).
pub async fn record(
    db: &mut tokio_postgres::Client,
    name: &str,
    events: &[Event],
    through: BTreeMap<usize, (u64, i64)>,
) -> Result<bool, Error> {
    let tx = db.transaction().await?;
    let new = tx
        .execute("INSERT INTO consumer_transactions VALUES ($1) ON CONFLICT DO NOTHING", &[&name])
        .await?;
    for event in events {
        if new == 1 {
            tx.execute(
                "INSERT INTO consumer_events \
                 (id, transaction, index, subject, payload, stream_sequence) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
                &[
                    &event.id,
                    &event.transaction,
                    &(event.index as i32),
                    &event.subject,
                    &event.payload,
                    &(event.sequence as i64),
                ],
            )
            .await?;
        }
    }
    for (lane, (sequence, at)) in through {
        tx.execute(
            "INSERT INTO consumer_lanes (lane, applied_through, applied_at) VALUES ($1, $2, $3) \
             ON CONFLICT (lane) DO UPDATE SET applied_through = $2, applied_at = $3 \
             WHERE consumer_lanes.applied_through <= $2",
            &[&(lane as i32), &(sequence as i64), &at],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(new == 1)
}
