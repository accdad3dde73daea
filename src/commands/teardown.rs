//! `pgoutbox teardown --yes`: drops the slot and the publication, and the tenant tables'
//! event trigger first when there is one (it would fail every new tenant's `CREATE TABLE`
//! once the publication is gone); the stream is kept.

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
    let trigger = crate::postgres::tenant_tables::trigger_name(&config.publication);
    let triggered = client
        .query_opt("SELECT 1 FROM pg_event_trigger WHERE evtname = $1", &[&trigger])
        .await?
        .is_some();
    if triggered {
        let sql = crate::postgres::tenant_tables::drop_trigger_sql(&config.publication);
        client.batch_execute(&sql).await.map_err(|err| {
            anyhow::anyhow!(
                "dropping event trigger {trigger} (from setup --tenant-trigger) failed: {err}; \
                 run teardown as a superuser"
            )
        })?;
        println!("dropped event trigger {trigger}");
    }
    admin::teardown(&client, &config.slot, &config.publication).await?;
    println!("dropped slot {} and publication {}", config.slot, config.publication);
    Ok(())
}
