//! Who publishes a replay's rows: this command into a stream no pgoutbox owns, or the
//! pgoutbox that owns it, handed the rows through the WAL.

use crate::domain::outbox::TableEntry;
use crate::nats::claim::{Claim, Claims};
use crate::nats::publisher::Publisher;
use crate::postgres::{admin, replay_table};
use crate::settings::config::Config;

use super::handover;

/// Who publishes the replayed rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// This command, into a stream no pgoutbox owns.
    Direct,
    /// The pgoutbox that owns the stream, handed the rows through the WAL; `live` when it
    /// streams from its slot now (the replay then waits until they are published).
    Handover { live: bool },
}

/// The pgoutbox that owns this stream, from this database's slot, publishes the rows,
/// running or not: nothing is written into its stream beside it; another database's
/// pgoutbox owns the stream's order, so that is refused.
pub(super) async fn route(
    config: &Config,
    client: &tokio_postgres::Client,
    publisher: &Publisher,
) -> anyhow::Result<Route> {
    let source = crate::commands::setup::identify_source(config).await?;
    let claims = Claims::open(publisher.context(), config.stream_replicas).await?;
    match claims.holder(&config.stream, &source).await? {
        Claim::Free => Ok(Route::Direct),
        Claim::Theirs(holder) => anyhow::bail!(
            "stream {} is written by another pgoutbox ({holder}), and its order \
             would refuse messages written beside it: replay into a stream of its own \
             (--stream with --subject-template and --dead-letter-subject it alone covers)",
            config.stream
        ),
        Claim::Ours { .. } => {
            let seed = format!("{}_seed", config.slot);
            if admin::slot_state(client, &seed).await?.is_some_and(|s| s.active) {
                anyhow::bail!(
                    "pgoutbox is seeding stream {} from the table (slot {seed}): replay once \
                     the seed has finished (pgoutbox status shows it)",
                    config.stream
                );
            }
            let Some(slot) = admin::slot_state(client, &config.slot).await? else {
                anyhow::bail!(
                    "stream {} belongs to this database's pgoutbox, and its slot {} does not \
                     exist: rows handed over now would be read by no one; start pgoutbox \
                     (with --recover, see docs/runbooks/slot-lost.md) and replay then",
                    config.stream,
                    config.slot
                );
            };
            let live = slot.active || handover::streamed_from(client, &config.slot).await?;
            Ok(Route::Handover { live })
        }
    }
}

/// Whether the pgoutbox the rows are handed to can publish them: the replay table allows
/// it, and a pattern's table is in the publication.
pub(super) async fn check_handover(
    config: &Config,
    client: &tokio_postgres::Client,
    entry: &TableEntry,
) -> anyhow::Result<()> {
    let replays = &config.pipeline.replay_table;
    replay_table::check_may_replay(client, &config.publication, replays).await?;
    // A pattern's table that pgoutbox has not adopted yet: it would not publish its rows.
    if let Some(pattern) = &entry.pattern
        && !admin::publishes(client, &config.publication, &entry.table).await?
    {
        anyhow::bail!(
            "--from-table {}: matches {pattern} but is not in publication {} (it does not \
             exist, or pgoutbox has not adopted it yet): run `pgoutbox setup` or start \
             pgoutbox, which adds it",
            entry.table,
            config.publication
        );
    }
    Ok(())
}
