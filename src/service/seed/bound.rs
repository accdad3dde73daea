//! Where a recovery's rows begin: the bound (see `service::seed`), from the stream's newest
//! message whose row the table still has.

use std::sync::Arc;

use super::{ANCHOR_SEARCH, SeedError};
use crate::domain::outbox::{DEAD_LETTER_ID_PREFIX, RowMapping};
use crate::domain::seed::{EventPayload, is_replayed_message, own_row_id};
use crate::nats::publisher::Publisher;
use crate::postgres::table_snapshot::TableSnapshot;

/// The bound of a recovery: the one earlier tries wrote, else the order key of the row of
/// the newest message whose row its table has (the table its `Pgoutbox-Table` names, the
/// first without it; `mappings` are the tables' in the snapshot's order), less `margin`:
/// one bound for every table, since the chain leaves no gap across tables either. `None`
/// when the stream is empty (every row is missing). Only a message of a source, published from its row (not a
/// replay, not a dead letter), anchors, and only on a row whose payload is the message's:
/// after a truncate that restarted the ids, the tail's id names a newer row (issue 28, F3).
pub(super) async fn bound(
    publisher: &Publisher,
    snapshot: &TableSnapshot,
    mappings: &[Arc<RowMapping>],
    margin: f64,
) -> Result<Option<f64>, SeedError> {
    let tail = publisher.tail(None).await?;
    if tail.last_sequence == 0 {
        return Ok(None);
    }
    if let Some(since) = tail.origin.seed_since.and_then(|since| since.parse().ok()) {
        return Ok(Some(since));
    }
    let tail_stored_at = tail.origin.stored_at_millis as f64 / 1e3;
    let oldest = tail.last_sequence.saturating_sub(ANCHOR_SEARCH).max(1);
    for sequence in (oldest..=tail.last_sequence).rev() {
        // A message deleted from the stream has no row to look for.
        let Ok(Some(origin)) = publisher.origin_of(sequence).await else { continue };
        if let Some(since) = origin.seed_since.and_then(|since| since.parse().ok()) {
            return Ok(Some(since));
        }
        let Some(id) = origin.msg_id else { continue };
        if origin.source.is_none()
            || origin.emitted
            || is_replayed_message(&id)
            || id.starts_with(DEAD_LETTER_ID_PREFIX)
            || id.starts_with(crate::domain::transaction::END_ID_PREFIX)
        {
            continue;
        }
        let table = match &origin.table {
            Some(named) => mappings.iter().position(|m| m.source_table() == named),
            None => Some(0),
        };
        // A message of a table the seed does not read has no row to look for.
        let Some((index, mapping)) = table.and_then(|i| Some((i, mappings.get(i)?))) else {
            continue;
        };
        let own = own_row_id(mapping.source_table(), &id);
        for (key, tuple) in snapshot.rows_with_id(index, own).await? {
            let Some(key) = key else { continue };
            let event = mapping.map(&tuple).ok();
            if event.is_some_and(|e| origin.payload.matches(&EventPayload::new(&e.payload))) {
                return Ok(Some(key - margin));
            }
        }
    }
    // No recent message's row is left in the table (emptied, truncated): when every row
    // the table holds is younger than the stream's tail, every one of them is missing.
    let since = tail_stored_at - margin;
    match snapshot.oldest_key().await? {
        Some(oldest) if oldest < since => Err(SeedError::NoAnchor),
        _ => Ok(Some(since)),
    }
}
