//! `pgoutbox setup`: publication, slot and stream, each created only when missing.

use anyhow::Context;
use tracing::{info, warn};

use crate::cli::SlotArgs;
use crate::config::Config;
use crate::error::PipelineError;
use crate::publisher::Publisher;
use crate::slot;

pub async fn run(config: &Config, args: &SlotArgs) -> anyhow::Result<()> {
    let client = prepare_database(config).await?;
    let nats = super::connect_nats(config).await?;
    let publisher = Publisher::new(nats, &config.stream, super::ACK_TIMEOUT);
    ensure_stream_and_slot(config, &client, &publisher, args.recreate_slot).await?;
    println!(
        "ready: publication {}, slot {}, stream {}",
        config.publication, config.slot, config.stream
    );
    Ok(())
}

/// Connects, checks prerequisites and makes sure the publication exists.
pub async fn prepare_database(config: &Config) -> anyhow::Result<tokio_postgres::Client> {
    let client = slot::connect(&config.database, &config.pg_tls).await?;
    slot::check_prerequisites(&client, &config.table, &config.required_columns()).await?;
    if slot::ensure_publication(&client, &config.publication, &config.table).await? {
        info!(publication = %config.publication, table = %config.table, "publication created");
    }
    Ok(client)
}

/// Creates the stream and the slot when missing. A missing slot is created only when the
/// stream shows no sign of an earlier run, or when the operator asked for it: a slot that
/// vanished means events may have been skipped, and that must not pass silently.
pub async fn ensure_stream_and_slot(
    config: &Config,
    client: &tokio_postgres::Client,
    publisher: &Publisher,
    recreate: bool,
) -> anyhow::Result<()> {
    publisher
        .ensure_stream(&config.stream_subjects(), config.stream_replicas)
        .await
        .with_context(|| format!("preparing stream {}", config.stream))?;
    let name = &config.slot;
    match slot::slot_state(client, name).await? {
        Some(state) if state.wal_status.as_deref() == Some("lost") => {
            if !recreate {
                return Err(PipelineError::SlotInvalidated {
                    slot: name.clone(),
                    detail: "wal_status = lost".into(),
                }
                .into());
            }
            warn!(slot = %name, "dropping the lost slot and creating it again, as asked");
            slot::teardown_slot(client, name).await?;
            create_slot(client, name).await?;
        }
        Some(state) if state.plugin.as_deref() != Some("pgoutput") => {
            anyhow::bail!(
                "slot {name} exists but uses plugin {:?}, not pgoutput: choose another --slot",
                state.plugin.unwrap_or_default()
            );
        }
        Some(_) => {}
        None => {
            let tail = publisher.tail().await?;
            if tail.last_position.is_some() && !recreate {
                return Err(PipelineError::SlotMissing { slot: name.clone() }.into());
            }
            if tail.last_position.is_some() {
                warn!(slot = %name, "creating a new slot, as asked; events committed while \
                    no slot existed are not streamed");
            }
            create_slot(client, name).await?;
        }
    }
    Ok(())
}

async fn create_slot(client: &tokio_postgres::Client, name: &str) -> anyhow::Result<()> {
    if slot::create_slot(client, name).await.with_context(|| format!("creating slot {name}"))? {
        info!(slot = %name, "replication slot created");
    }
    Ok(())
}
