//! `pgoutbox teardown --yes`: drops the slot and the publication; the stream is kept.

use crate::postgres::admin;
use crate::settings::config::Config;

pub async fn run(config: &Config, yes: bool) -> anyhow::Result<()> {
    if !yes {
        anyhow::bail!(
            "teardown drops slot {} and publication {}: pass --yes to confirm",
            config.slot,
            config.publication
        );
    }
    let client = admin::connect(&config.database, &config.pg_tls).await?;
    admin::teardown(&client, &config.slot, &config.publication).await?;
    println!("dropped slot {} and publication {}", config.slot, config.publication);
    Ok(())
}
