//! `pgoutbox teardown --yes`: drops the slot (and the temporary `<slot>_seed` of a seed that
//! did not finish) and the publication, and the tenant tables' event trigger first when
//! there is one (it would fail every new tenant's `CREATE TABLE` once the publication is
//! gone); the stream is kept. `--only-table <schema.table>`: drops
//! only that table from the publication (a table no longer streamed), keeping the slot,
//! the other tables and the stream; refused for a table a `--table` pattern matches, which
//! pgoutbox would adopt again.

use crate::postgres::acknowledged;
use crate::postgres::admin::{self, TableName};
use crate::postgres::tenant_tables;
use crate::settings::config::Config;

pub async fn run(config: &Config, yes: bool, only_table: Option<&str>) -> anyhow::Result<()> {
    if let Some(table) = only_table {
        let table: TableName =
            table.parse().map_err(|err| anyhow::anyhow!("--only-table: {err}"))?;
        return drop_table(config, yes, &table).await;
    }
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
        .query_opt("SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = $1", &[&trigger])
        .await?
        .is_some();
    if triggered {
        let sql = tenant_tables::drop_trigger_sql(&config.publication, &config.own_schema);
        let dropped = async {
            client.batch_execute(&sql).await?;
            tenant_tables::drop_the_earlier_function(&client, &config.publication).await
        };
        dropped.await.map_err(|err| {
            anyhow::anyhow!(
                "dropping event trigger {trigger} (from setup --tenant-trigger) failed: {err}; \
                 run teardown as the role that ran setup --tenant-trigger, which owns it"
            )
        })?;
        say!("dropped event trigger {trigger}");
    }
    admin::teardown(&client, &config.slot, &config.publication).await?;
    say!("dropped slot {} and publication {}", config.slot, config.publication);
    // What the slot's streaming had acknowledged: a new slot of that name starts afresh.
    let record = acknowledged::table_in(&config.own_schema);
    if acknowledged::owner(&client, &record).await? == acknowledged::Owner::Ours {
        acknowledged::forget(&client, &record, &config.slot).await?;
    }
    // A seed killed halfway leaves its temporary slot; nothing else would drop it.
    if let Ok(seed) = crate::service::seed::seed_slot(&config.slot)
        && admin::slot_state(&client, &seed).await?.is_some()
    {
        admin::teardown_slot(&client, &seed).await?;
        say!("dropped slot {seed}, left by a seed from the table that did not finish");
    }
    Ok(())
}

/// `--only-table`: the table out of the publication, nothing else changed.
async fn drop_table(config: &Config, yes: bool, table: &TableName) -> anyhow::Result<()> {
    let publication = &config.publication;
    if !yes {
        anyhow::bail!(
            "teardown --only-table drops {table} from publication {publication} (slot and \
             stream kept): pass --yes to confirm"
        );
    }
    let patterns = config.pipeline.tables.iter().filter_map(|e| e.pattern.as_ref());
    if let Some(pattern) = patterns.into_iter().find(|p| p.matches(&table.schema, &table.name)) {
        // pgoutbox adopts a table of its pattern that is out of the publication, and would
        // publish every row in it again (issue 45, R3).
        anyhow::bail!(
            "{table} matches --table {pattern}: taken out of publication {publication}, \
             pgoutbox would adopt it again and publish all its rows a second time; to stop \
             streaming it, rename or drop the table, or give a --table pattern it does not \
             match, then run this again"
        );
    }
    let client = admin::connect(&config.database, &config.pg_tls).await?;
    if admin::drop_from_publication(&client, publication, table).await? {
        say!(
            "dropped {table} from publication {publication}; slot {} and the stream are kept; \
             remove {table} from --table or --config before pgoutbox runs again, or it stops \
             saying the table is not published",
            config.slot
        );
    } else {
        say!("{table} is not in publication {publication}: nothing dropped");
    }
    Ok(())
}
