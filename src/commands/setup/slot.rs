//! The slot as `setup` finds it and leaves it: what it shows (`find`), and what
//! `slot_plan::plan` decided, done and said (`carry_out`).

use tracing::{info, warn};

use super::durability::forgotten_past_the_slot;
use super::slot_plan::{Dropped, Found, Refusal, SlotFound, SlotPlan};
use super::{create_slot, join_pattern_tables};
use crate::domain::horizon::Forgotten;
use crate::domain::source::Source;
use crate::nats::claim::{Claim, Claims};
use crate::nats::publisher::Publisher;
use crate::postgres::admin::{self, WalStatus};
use crate::service::error::PipelineError;
use crate::service::seed::{SeedKind, seed_slot};
use crate::service::telemetry::names;
use crate::settings::cli::SlotArgs;
use crate::settings::config::Config;

/// What `find` saw beyond what the plan needs, for the lines that say why.
pub(super) struct Seen {
    slot: Option<admin::SlotState>,
    /// For a `--recover`: what the stream forgot that the slot confirmed past.
    forgotten: Option<Forgotten>,
}

/// What the slot, the seed's slot, the stream and its claim show, for `slot_plan::plan`.
pub(super) async fn find(
    config: &Config,
    (client, publisher, claims): (&tokio_postgres::Client, &Publisher, &Claims),
    source: &Source,
    args: &SlotArgs,
    seed: Option<SeedKind>,
) -> anyhow::Result<(Found, Seen)> {
    let name = &config.slot;
    let state = admin::slot_state(client, name).await?;
    if let Some(state) = &state
        && !state.in_this_database
    {
        anyhow::bail!(
            "slot {name} belongs to another database of this cluster (slots are cluster-wide): \
             give each database its own --slot"
        );
    }
    let forgotten = match (&state, seed) {
        (Some(state), Some(SeedKind::Recover)) if !state.active => {
            forgotten_past_the_slot(config, client, publisher, state).await?
        }
        _ => None,
    };
    let holder = claims.holder(&config.stream, source).await?;
    let seed_slot_left = admin::slot_state(client, &seed_slot(name)?).await?.is_some();
    // The stream's tail is read only where the plan looks at it: a backfill behind an idle
    // slot, or a slot missing with nothing to seed.
    let tail_needed = match &state {
        Some(state) => seed == Some(SeedKind::Backfill) && !state.active,
        None => seed.is_none() && !seed_slot_left,
    };
    let (stream_empty, written_before) = match tail_needed {
        false => (false, false),
        true => stream_facts(publisher, holder).await?,
    };
    let found = Found {
        slot: state.as_ref().map(|state| SlotFound {
            lost: state.wal_status == Some(WalStatus::Lost),
            pgoutput: state.plugin.as_deref() == Some("pgoutput"),
            active: state.active,
        }),
        seed,
        recreate: args.recreate_slot,
        forgotten: forgotten.is_some(),
        seed_slot_left,
        stream_empty,
        written_before,
    };
    Ok((found, Seen { slot: state, forgotten }))
}

/// Does what `plan` says to the slot, saying why; the seed the run must make, if any.
pub(super) async fn carry_out(
    plan: SlotPlan,
    config: &Config,
    client: &tokio_postgres::Client,
    args: &SlotArgs,
    seen: Seen,
) -> anyhow::Result<Option<SeedKind>> {
    let name = &config.slot;
    let seed_slot = seed_slot(name)?;
    match plan {
        SlotPlan::Keep { drop_seed_slot, nothing_to_seed } => {
            if drop_seed_slot {
                warn!(slot = %seed_slot, "dropping the slot of a finished seed");
                admin::teardown_slot(client, &seed_slot).await?;
            }
            if nothing_to_seed {
                info!(slot = %name, "the slot exists: nothing to seed from the table");
            }
            Ok(None)
        }
        SlotPlan::Create { anew } => {
            if anew {
                warn!(slot = %name, "creating a new slot, as asked; events committed while \
                    no slot existed are not streamed");
            }
            // Made before the claim is checked, so that a source refused for sharing a
            // stream keeps its rows in its own slot until the operator gives it a stream.
            if args.from_standby && admin::in_recovery(client).await? {
                info!(slot = %name, "creating the slot on a standby waits for the primary's \
                    next running-transactions record (up to 15 s; `SELECT \
                    pg_catalog.pg_log_standby_snapshot()` on the primary hurries it)");
            }
            join_pattern_tables(config).await?;
            create_slot(client, name, args.failover).await?;
            Ok(None)
        }
        SlotPlan::DropLostAndCreate => {
            warn!(slot = %name, "dropping the lost slot and creating it again, as asked");
            admin::teardown_slot(client, name).await?;
            create_slot(client, name, args.failover).await?;
            Ok(None)
        }
        SlotPlan::Seed(seed, dropped) => {
            say_why_seeded(config, dropped, seen.forgotten.as_ref(), &seed_slot);
            if !matches!(dropped, Dropped::Nothing | Dropped::NothingSeedUnderWay) {
                admin::teardown_slot(client, name).await?;
            }
            Ok(Some(seed))
        }
        SlotPlan::Refuse(refusal) => Err(refused(name, seen.slot, refusal)),
    }
}

/// The line that says why the stream is seeded from the table.
fn say_why_seeded(
    config: &Config,
    dropped: Dropped,
    forgotten: Option<&Forgotten>,
    seed_slot: &str,
) {
    let name = &config.slot;
    match (dropped, forgotten) {
        (Dropped::Lost, _) => {
            warn!(slot = %name, "dropping the lost slot; the stream is seeded from the table")
        }
        // The stream forgot acknowledged events the slot confirmed past (its server lost
        // power): only the table brings them back, as after a lost slot.
        (Dropped::Forgotten, Some(forgotten)) => {
            metrics::counter!(names::STREAM_LOST_EVENTS).increment(forgotten.lost());
            warn!(slot = %name, stream = %config.stream, "{forgotten}. --recover: the slot is \
                dropped and the stream seeded from the table, as after a lost slot (the \
                table's rows come back; emitted events cannot)");
        }
        // Every change the slot holds is in the table too, and will be in the seed's snapshot.
        (Dropped::EmptyStream, _) => warn!(slot = %name, stream = %config.stream,
            "the stream is empty: the slot is made again behind a backfill from the table"),
        // A seed under way when its process stopped (a `--recover`, a `--backfill`, or one
        // pgoutbox began by itself when the stream lost what only the table held) is
        // finished as a recovery: from the stream's end on, compared with the table.
        (Dropped::NothingSeedUnderWay, _) => warn!(slot = %seed_slot,
            "a seed from the table was under way when pgoutbox stopped: finishing it, as \
             `run --recover` would"),
        (Dropped::Nothing | Dropped::Forgotten, _) => {}
    }
}

/// The error for `refusal`, with what to do.
fn refused(name: &str, slot: Option<admin::SlotState>, refusal: Refusal) -> anyhow::Error {
    match refusal {
        Refusal::Lost => {
            let reason = slot.as_ref().and_then(|s| s.invalidation_reason.as_deref());
            PipelineError::slot_invalidated(name, reason).into()
        }
        Refusal::NotPgoutput => {
            let plugin = slot.and_then(|s| s.plugin).unwrap_or_default();
            anyhow::anyhow!(
                "slot {name} exists but uses plugin {plugin:?}, not pgoutput: choose another --slot"
            )
        }
        Refusal::Missing => PipelineError::SlotMissing { slot: name.to_owned() }.into(),
    }
}

/// Whether the stream is empty, and whether this source (the claim's `holder`) wrote it.
async fn stream_facts(publisher: &Publisher, holder: Claim) -> anyhow::Result<(bool, bool)> {
    let tail = publisher.tail(None).await?;
    let written_before = match holder {
        // By an earlier run, or by a setup that stopped short of making the slot (then
        // nothing was ever stored).
        Claim::Ours { .. } => tail.last_sequence > 0,
        // Only a pgoutbox older than claims can have written it for this source.
        Claim::Free => tail.origin.position.is_some(),
        // Another source's stream holds nothing of ours: the claim refuses it.
        Claim::Theirs(_) => false,
    };
    Ok((tail.last_sequence == 0, written_before))
}
