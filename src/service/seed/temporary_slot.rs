//! The seed's temporary slot, `<slot>_seed`: its name, its promotion to the slot when the
//! seed finishes, and its drop when the seed will not finish in this process.

use std::time::Duration;

use tracing::{info, warn};

use super::SeedError;
use crate::postgres::admin::SetupError;

/// The temporary slot's name.
pub fn seed_slot(slot: &str) -> Result<String, SeedError> {
    let name = format!("{slot}_seed");
    if name.len() > 63 {
        return Err(SeedError::SlotNameTooLong(slot.to_owned()));
    }
    Ok(name)
}

/// Makes the finished seed's slot the slot: copied to `slot` (position and snapshot state
/// with it), then dropped once its walsender has let it go (within 10 s).
pub(super) async fn promote_seed_slot(
    client: &tokio_postgres::Client,
    seed: &str,
    slot: &str,
) -> Result<(), SetupError> {
    // Copied already if an earlier try was cut off between the copy and the drop.
    client
        .execute(
            "SELECT pg_catalog.pg_copy_logical_replication_slot($1, $2) WHERE NOT EXISTS \
             (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $2)",
            &[&seed, &slot],
        )
        .await?;
    drop_when_released(client, seed, None).await.map(|_| ())
}

/// How long dropping an unfinished seed's slot may take, connecting included: it must not
/// hold up an exit or the next attempt behind a Postgres that stopped answering.
pub(super) const DROP_LIMIT: Duration = Duration::from_secs(15);

/// What is logged when an unfinished seed's slot could not be dropped.
pub(super) const NOT_DROPPED: &str = "could not drop the unfinished seed's slot; the next \
    --recover or --backfill drops it, or teardown";

/// Drops the temporary slot of a seed that will not finish, if it is still the one made at
/// `consistent_point` (one another pgoutbox made again starts elsewhere: it is not ours to
/// drop), within [`DROP_LIMIT`]. `None`: the making was given up before its answer came,
/// so any slot of that name is taken for ours once its walsender let it go (one in use by
/// another pgoutbox is never let go within the limit). A failure is logged: the next
/// `--recover`, `--backfill` or `teardown` drops it.
pub(super) async fn drop_slot_of(
    client: &tokio_postgres::Client,
    slot: &str,
    consistent_point: Option<u64>,
) {
    let dropped = drop_when_released(client, slot, consistent_point);
    match tokio::time::timeout(DROP_LIMIT, dropped).await {
        Ok(Ok(true)) => info!(%slot, "dropped the unfinished seed's slot"),
        Ok(Ok(false)) => {
            info!(%slot, "the unfinished seed's slot is gone or another's: not dropped")
        }
        Ok(Err(err)) => warn!(%slot, %err, "{NOT_DROPPED}"),
        Err(_) => warn!(%slot, limit = ?DROP_LIMIT, "Postgres did not answer: {NOT_DROPPED}"),
    }
}

/// Drops `slot` (only if it starts at `from`, when given) once its walsender has let it go,
/// which follows the closing of its connection within moments; waits up to 10 s. `false`:
/// no such slot.
async fn drop_when_released(
    client: &tokio_postgres::Client,
    slot: &str,
    from: Option<u64>,
) -> Result<bool, SetupError> {
    let from = from.map(tokio_postgres::types::PgLsn::from);
    let mut tries = 0;
    loop {
        let dropped = client
            .execute(
                "SELECT pg_catalog.pg_drop_replication_slot(slot_name) \
                 FROM pg_catalog.pg_replication_slots \
                 WHERE slot_name = $1 \
                   AND ($2::pg_catalog.pg_lsn IS NULL OR confirmed_flush_lsn = $2)",
                &[&slot, &from],
            )
            .await;
        match dropped {
            Err(err)
                if err.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE)
                    && tries < 100 =>
            {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            other => return other.map(|dropped| dropped > 0).map_err(SetupError::from),
        }
    }
}
