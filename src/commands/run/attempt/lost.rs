//! What the stream lost of what JetStream acknowledged, judged as an attempt starts: by
//! what this process saw acknowledged, else by the record the previous one kept in
//! Postgres (`postgres::acknowledged`), against the stream's tail and the slot's position.

use tracing::{error, warn};

use super::Target;
use crate::domain::horizon::{Forgotten, Horizon, Stored};
use crate::nats::publisher::{Publisher, StreamTail};
use crate::postgres::ReplicationConnection;
use crate::postgres::acknowledged;
use crate::service::acknowledgements::stream_identity;
use crate::service::error::{NatsFailure, NatsFailureKind, PipelineError};
use crate::service::pipeline::{Memory, acknowledged_through};
use crate::service::telemetry::names;
use crate::settings::config::Config;

/// Judges what the stream lost before this attempt, from the slot's position `start`: the
/// loss is named once and counted; what the slot still holds is published again; what only
/// the table holds (a recovery's rows, behind a horizon) is seeded again; a seed under way
/// begins again. `Err`: the attempt ends for that.
pub(super) async fn judge_what_the_stream_lost(
    target: &Target<'_>,
    conn: &mut ReplicationConnection,
    memory: &mut Memory,
    tail: &StreamTail,
    start: u64,
) -> Result<(), PipelineError> {
    let Target { config, publisher, .. } = target;
    // Kept across an attempt that gets no acknowledgement: a later one still judges by it.
    let stored = match memory.stored {
        Some(stored) => Some(stored),
        None if !memory.recorded_read => {
            memory.recorded_read = true;
            recorded_acknowledgement(conn, publisher, config).await
        }
        None => None,
    };
    if let Some(stored) = stored {
        acknowledged_through(&mut memory.acknowledged_through, stored.position);
    }
    let tail_position = tail.origin.position;
    let Some(forgotten) =
        stored.and_then(|s| Forgotten::judge(s, tail.last_sequence, tail_position, start))
    else {
        return Ok(());
    };
    metrics::counter!(names::STREAM_LOST_EVENTS).increment(forgotten.lost());
    let pinned = memory.horizon.as_ref().and_then(Horizon::pinned);
    // What waited rested on acknowledgements the stream no longer holds; the loss is named
    // once, and the stream's tail is where the next judgement starts.
    memory.horizon = None;
    memory.stored = None;
    memory.acknowledged_through = None;
    // The pointers the stream kept still wait for their objects to be looked at.
    memory.pointers.retain(|(pointer, _)| pointer.sequence <= tail.last_sequence);
    let horizon = target.pipeline.durability_horizon;
    let only_in_the_table = match pinned.filter(|_| memory.seed.is_none()) {
        // A recovery's rows the stream lost within the horizon: only the table has them.
        // Otherwise the slot, held at the seed's end, gives back the rest, and the seed's
        // last row still waits to be vouched for.
        Some((seed_last, _, _)) if tail.last_sequence < seed_last.sequence => true,
        Some((seed_last, acked_at, end)) => {
            let mut kept = Horizon::new(horizon, start);
            kept.pin(seed_last, acked_at, end);
            memory.horizon = Some(kept);
            false
        }
        // A process started after the loss knows no pin: behind a horizon the slot confirms
        // nothing decoded before the stream kept it, so a loss past the slot is of what the
        // WAL never held, a recovery's rows (soak seed 29: a power loss 3 s after a seed,
        // with pgoutbox killed beside nats-server).
        None => memory.seed.is_none() && !forgotten.refilled() && !horizon.is_zero(),
    };
    if only_in_the_table {
        return Err(seed_again(conn, &config.slot, &forgotten, memory).await);
    }
    match forgotten.refilled() {
        true => warn!(stream = %config.stream, "{forgotten}"),
        false => error!(stream = %config.stream, "{forgotten}"),
    }
    // A seed under way knows which rows the stream held before it lost some: it begins
    // again, from a new snapshot and what the stream holds now.
    if memory.seed.is_some() {
        memory.seed = None;
        let why = "the stream lost acknowledged events while seeding: seeding again";
        return Err(NatsFailure::new(NatsFailureKind::Request, why).into());
    }
    Ok(())
}

/// What the previous process recorded as acknowledged (`postgres::acknowledged`), read at
/// the first attempt: the memory a start after a restart of both pgoutbox and nats-server
/// has. `None` when there is no record, or it is of another stream.
async fn recorded_acknowledgement(
    conn: &mut ReplicationConnection,
    publisher: &Publisher,
    config: &Config,
) -> Option<Stored> {
    let table = acknowledged::table_in(&config.own_schema);
    let exists = conn.simple_query(&acknowledged::exists_sql(&table)).await.ok()?;
    if exists.first()?.first()?.as_deref() != Some("t") {
        return None;
    }
    let rows = conn.simple_query(&acknowledged::read_sql(&table, &config.slot)).await.ok()?;
    let stream = stream_identity(publisher, &config.stream).await?;
    acknowledged::parse_recorded(&rows, &stream)
}

/// The stream lost what a recovery (or backfill) seeded, within the durability horizon
/// after the seed ended: the WAL cannot give those rows back, and the slot was confirmed no
/// further than the seed's end (`Horizon::pin`), so nothing decoded since is lost with it.
/// The slot is dropped, and the next attempt seeds the stream from the table again, from a
/// new snapshot and what the stream holds then, as `run --recover` would.
async fn seed_again(
    conn: &mut ReplicationConnection,
    slot: &str,
    forgotten: &Forgotten,
    memory: &mut Memory,
) -> PipelineError {
    let loss = forgotten.loss();
    warn!(%slot, "{loss}; past the slot, within the durability horizon: rows a recovery \
        seeded, which only the table has: seeding again from the table, as `run --recover` \
        does (emitted events among them cannot come back)");
    let drop =
        format!("DROP_REPLICATION_SLOT {}", postgres_protocol::escape::escape_identifier(slot));
    if let Err(err) = conn.simple_query(&drop).await {
        return PipelineError::from_start_replication(slot, err);
    }
    memory.seed_wanted = Some(crate::service::seed::SeedKind::Recover);
    let why = "the stream lost rows a recovery seeded within the durability horizon: seeding again";
    NatsFailure::new(NatsFailureKind::Request, why).into()
}
