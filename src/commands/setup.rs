//! `pgoutbox setup`: publication, slot and stream, each created only when missing.

use anyhow::Context;
use tracing::{info, warn};

use crate::domain::source::Source;
use crate::nats::claim::{Claim, Claims};
use crate::nats::large_payloads;
use crate::nats::publisher::Publisher;
use crate::postgres::ReplicationConnection;
use crate::postgres::acknowledged;
use crate::postgres::admin;
use crate::postgres::adoption::{self, Adopted};
use crate::postgres::own_schema;
use crate::postgres::replay_table::{self as replays, public_may_emit_warning};
use crate::postgres::tenant_tables;
use crate::service::error::PipelineError;
use crate::service::seed::SeedKind;
use crate::settings::cli::{SetupArgs, SlotArgs};
use crate::settings::config::Config;

mod durability;
mod slot;
mod slot_plan;
use durability::{
    say_if_the_stream_was_made_again, say_what_the_stream_can_lose,
    say_whether_the_horizon_covers_the_servers,
};

pub async fn run(config: &Config, args: &SetupArgs) -> anyhow::Result<()> {
    let mut client = prepare_database(config, args.slot.from_standby).await?;
    adopt_pattern_tables(config, &mut client).await?;
    if args.tenant_trigger {
        tenant_trigger(config, &client).await?;
    }
    let nats = crate::nats::connect::connect_nats(&config.nats).await?;
    let publisher = Publisher::new(nats, &config.stream, crate::nats::connect::ACK_TIMEOUT);
    ensure_stream_and_slot(config, &client, &publisher, &args.slot, None).await?;
    if !args.slot.message_prefix.is_empty() {
        warn_if_public_may_emit(&client).await;
    }
    say!(
        "ready: publication {}, slot {}, stream {}",
        config.publication,
        config.slot,
        config.stream
    );
    Ok(())
}

/// Connects, checks prerequisites and makes sure the publication exists. On a standby
/// (`--from-standby`) nothing can be created: the publication must come from the primary.
pub async fn prepare_database(
    config: &Config,
    from_standby: bool,
) -> anyhow::Result<tokio_postgres::Client> {
    let client = admin::connect(&config.database, &config.pg_tls).await?;
    if config.messages_only {
        admin::check_server(&client).await?;
    } else {
        admin::check_server(&client).await?;
        // A table of a pattern that does not fit has its rows dead-lettered, not refused.
        for entry in config.pipeline.tables.iter().filter(|e| e.pattern.is_none()) {
            let columns = Config::required_columns(entry);
            admin::check_prerequisites(&client, &entry.table, &columns).await?;
        }
    }
    let in_recovery = admin::in_recovery(&client).await?;
    if in_recovery {
        if !from_standby {
            anyhow::bail!(
                "Postgres is in recovery (a standby): set up against the primary, once this \
                 server is promoted, or give --from-standby to decode on this standby (16+)"
            );
        }
        prepare_standby(&client, config).await?;
    }
    if config.messages_only {
        if admin::ensure_publication_for_messages(&client, &config.publication).await? {
            info!(publication = %config.publication, "publication created (messages only)");
        }
    } else {
        let publication = &config.publication;
        let exists = admin::publication_exists(&client, publication).await?;
        let exact = config.pipeline.tables.iter().filter(|e| e.pattern.is_none());
        let mut tables: Vec<_> = exact.map(|e| e.table.clone()).collect();
        for entry in &config.pipeline.tables {
            let Some(pattern) = &entry.pattern else { continue };
            // A new publication names the exact tables only; a pattern's tables then join one
            // at a time (`join_pattern_tables`, or adoption), so that one that cannot
            // (unlogged, another's) fails alone.
            for matched in tenant_tables::matched(&client, pattern, publication).await? {
                if !(matched.published && exists) {
                    continue;
                }
                // One tenant's table that cannot stream whole never stops setup or run.
                match adoption::inheritance_children(&client, &matched.table).await? {
                    Some(children) => warn!(table = %matched.table, %pattern, "a table of the \
                        pattern is left out: {}", adoption::left_out(&children)),
                    None => tables.push(matched.table),
                }
            }
        }
        if admin::ensure_publication(&client, publication, &tables).await? {
            let tables = tables.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            info!(%publication, %tables, "publication created");
        }
        if !config.pipeline.tables.is_empty() {
            ensure_replay_table(config, &client).await;
        }
    }
    if !in_recovery {
        ensure_acknowledged_table(config, &client).await?;
    }
    Ok(client)
}

/// A pattern's tables out of the publication, as the first slot of a stream is made (or
/// made again for a `--backfill`): they join now, as a new publication's tables do, so that
/// the rows they hold are history (a backfill's seed reads them from its snapshot) and
/// those committed after are decoded. Never for a recovery: its seed reads the rows from
/// the stream's last message on, and a table that never joined holds older rows the stream
/// never had, which adoption hands over whole once the seed's slot exists. One that cannot
/// join is named and the others go on.
async fn join_pattern_tables(config: &Config) -> anyhow::Result<()> {
    let publication = &config.publication;
    let patterns = config.pipeline.tables.iter().filter_map(|e| Some((e.pattern.as_ref()?, e)));
    let mut client: Option<tokio_postgres::Client> = None;
    for (pattern, entry) in patterns {
        let client = match &mut client {
            Some(client) => client,
            None => client.insert(admin::connect(&config.database, &config.pg_tls).await?),
        };
        for matched in tenant_tables::matched(client, pattern, publication).await? {
            if matched.published {
                continue;
            }
            let (table, pattern) = (&matched.table, &entry.table);
            match adoption::join_before_slot(client, table, publication).await {
                Ok(adoption::Joined::LeftOut(why)) => {
                    warn!(%table, %pattern, "table left out: {why}")
                }
                Ok(_) => info!(%table, %pattern, %publication, "table added to the publication"),
                Err(err) => warn!(%table, %pattern, reason = %admin::server_said(&err),
                    "table not added to the publication: pgoutbox run tries again"),
            }
        }
    }
    Ok(())
}

/// `setup` with a slot: a pattern's tables out of the publication are adopted
/// (`postgres::adoption`: the rows handed over are decoded by that slot) with this role's
/// privileges. A table `run`'s role may not add, `setup` run as the role that set pgoutbox
/// up adopts, without handing the table to `run`'s role.
async fn adopt_pattern_tables(
    config: &Config,
    client: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    if admin::slot_state(client, &config.slot).await?.is_none() {
        return Ok(());
    }
    let (publication, to) = (&config.publication, config.adoption());
    for entry in &config.pipeline.tables {
        let Some(pattern) = &entry.pattern else { continue };
        for matched in tenant_tables::matched(client, pattern, publication).await? {
            let table = &matched.table;
            if matched.published {
                continue;
            }
            match adoption::adopt(client, (table, &entry.roles), &to, &mut |_| {}).await {
                Ok(Adopted::Read(rows)) => info!(%table, %pattern, %publication, rows,
                    "table adopted: added to the publication, its rows handed over"),
                Ok(Adopted::AlreadyPublished) => {}
                Ok(Adopted::Unread(why) | Adopted::Refused(why)) => {
                    warn!(%table, %pattern, "table not adopted in full: {why}")
                }
                Ok(Adopted::LeftOut(why)) => warn!(%table, %pattern, "table left out: {why}"),
                Err(err) => warn!(%table, %pattern, reason = %admin::server_said(&err),
                    "table not adopted: pgoutbox run tries again"),
            }
        }
    }
    Ok(())
}

/// The record of what JetStream acknowledged (`postgres::acknowledged`): without it, a
/// restart of both pgoutbox and nats-server cannot tell a stream that lost events.
async fn ensure_acknowledged_table(
    config: &Config,
    client: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let table = acknowledged::table_in(&config.own_schema);
    let kept = async {
        // What the server refused is a warning below; what pgoutbox refuses stops setup.
        own_schema::ensure(client, &config.own_schema).await.map_err(|err| match err {
            own_schema::OwnSchemaError::Sql(sql) => anyhow::Error::from(sql),
            refused => refused.into(),
        })?;
        let earlier = acknowledged::earlier_table(&config.pipeline.replay_table);
        if acknowledged::move_earlier(client, &earlier, &table).await? {
            info!(from = %earlier, to = %table, "record of what JetStream acknowledged moved \
                into pgoutbox's own schema");
        }
        acknowledged::ensure(client, &table).await.map_err(|err| match err {
            acknowledged::RecordError::Sql(sql) => anyhow::Error::from(sql),
            refused => refused.into(),
        })
    };
    match kept.await {
        Ok(()) => Ok(()),
        Err(err) => match err.downcast_ref::<tokio_postgres::Error>() {
            Some(sql) => {
                warn!(%table, reason = %admin::server_said(sql),
                    "cannot keep a record of what JetStream acknowledged: a restart of both \
                     pgoutbox and nats-server will not see a stream that lost events; let \
                     pgoutbox's role create its schema (GRANT CREATE ON DATABASE), or make it \
                     for that role (CREATE SCHEMA {} AUTHORIZATION <role>)", config.own_schema);
                Ok(())
            }
            None => Err(err),
        },
    }
}

/// `setup --tenant-trigger`: the event trigger that publishes a new table of a pattern in
/// its creating transaction (`tenant_tables::trigger_sql`); only a superuser may.
async fn tenant_trigger(config: &Config, client: &tokio_postgres::Client) -> anyhow::Result<()> {
    let patterns: Vec<_> =
        config.pipeline.tables.iter().filter_map(|e| e.pattern.clone()).collect();
    if patterns.is_empty() {
        anyhow::bail!(
            "--tenant-trigger publishes new tables a --table pattern matches, and no --table \
             holds a pattern (such as tenant_*.outbox)"
        );
    }
    let superuser: bool = client
        .query_one("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user", &[])
        .await?
        .get(0);
    if !superuser {
        anyhow::bail!(
            "--tenant-trigger creates an event trigger, which only a superuser may: run \
             'pgoutbox setup --tenant-trigger' with a superuser's --database-url (once; \
             pgoutbox itself keeps its own role)"
        );
    }
    let (publication, schema) = (&config.publication, &config.own_schema);
    let sql = tenant_tables::trigger_sql(publication, &patterns, schema);
    // Its function lives in pgoutbox's own schema, judged first. The function's owner is
    // judged before and after the `CREATE OR REPLACE`, in one transaction: a function of
    // that name another role made stays that role's, and SECURITY DEFINER would then run
    // that role's body under the superuser's event trigger.
    own_schema::ensure(client, schema).await?;
    tenant_tables::refuse_a_foreign_trigger_function(client, publication, schema).await?;
    client.batch_execute("BEGIN").await?;
    let made = async {
        client.batch_execute(&sql).await.context("creating the tenant tables' event trigger")?;
        tenant_tables::refuse_a_foreign_trigger_function(client, publication, schema).await?;
        // An upgrade: the trigger now runs the function in the own schema.
        Ok(tenant_tables::drop_the_earlier_function(client, publication).await?)
    };
    match made.await {
        Ok(_) => client.batch_execute("COMMIT").await?,
        Err(err) => {
            client.batch_execute("ROLLBACK").await?;
            return Err(err);
        }
    }
    let patterns = patterns.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    info!(trigger = %tenant_tables::trigger_name(&config.publication), %patterns,
        publication = %config.publication, "event trigger created: new tables of the \
        patterns join the publication in the transaction that creates them");
    Ok(())
}

/// The replay table, created and added to the publication when missing (an upgrade from a
/// version without it included). When this role may not, replays into the live stream are
/// off, said once; streaming goes on.
async fn ensure_replay_table(config: &Config, client: &tokio_postgres::Client) {
    let replay_table = &config.pipeline.replay_table;
    match replays::ensure(client, &config.publication, replay_table).await {
        Ok(true) => info!(table = %replay_table, publication = %config.publication,
            "replay table created and published"),
        Ok(false) => {}
        Err(err) => warn!("{err}"),
    }
}

/// Where emitted events are streamed: one warning when any role may emit one.
pub async fn warn_if_public_may_emit(client: &tokio_postgres::Client) {
    match replays::public_may_emit(client).await {
        Ok(Some(revoke)) => warn!("{}", public_may_emit_warning(&revoke)),
        Ok(None) => {}
        Err(err) => warn!(error = %err, "could not read who may run pg_logical_emit_message"),
    }
}

/// Creates the stream and the slot when missing, after claiming the stream for this
/// source (`crate::nats::claim`). A missing slot is created only when this source never wrote the
/// stream, or when the operator asked for it: a slot that vanished means events may have
/// been skipped, and that must not pass silently (`slot_plan`).
///
/// `seed` (`run --recover` or `--backfill`): when the slot is missing or lost, it is not
/// created here; the returned kind says the run must seed the stream from the table first
/// (`service::seed`), which creates it.
pub async fn ensure_stream_and_slot(
    config: &Config,
    client: &tokio_postgres::Client,
    publisher: &Publisher,
    args: &SlotArgs,
    seed: Option<SeedKind>,
) -> anyhow::Result<(Claims, Option<SeedKind>)> {
    if args.failover {
        check_failover_slots(client).await?;
    }
    prepare_stream(config, client, publisher).await?;
    let source = identify_source(config).await?;
    let claims = Claims::open(publisher.context(), config.stream_replicas)
        .await
        .with_context(|| format!("reading the claim on stream {}", config.stream))?;
    let (found, seen) =
        slot::find(config, (client, publisher, &claims), &source, args, seed).await?;
    let seeding = slot::carry_out(slot_plan::plan(&found), config, client, args, seen).await?;
    if seeding == Some(SeedKind::Backfill) {
        join_pattern_tables(config).await?;
    }
    claim_stream(config, &claims, &source, args.recreate_slot).await?;
    Ok((claims, seeding))
}

/// `--failover` needs PostgreSQL 17's failover slots.
async fn check_failover_slots(client: &tokio_postgres::Client) -> anyhow::Result<()> {
    let (num, shown) = admin::server_version(client).await?;
    if num < admin::FAILOVER_SLOTS_SINCE {
        anyhow::bail!(
            "--failover needs PostgreSQL 17 or later (failover slots); this server is \
             PostgreSQL {shown}: leave --failover off (see \
             docs/runbooks/failover.md#failover-postgresql-17-failover-slots)"
        );
    }
    Ok(())
}

/// The stream (and the bucket of `--object-store`), created when missing, and what it
/// can lose or lost said.
async fn prepare_stream(
    config: &Config,
    client: &tokio_postgres::Client,
    publisher: &Publisher,
) -> anyhow::Result<()> {
    publisher
        .ensure_stream(&config.stream_subjects(), config.stream_replicas, config.stream_features())
        .await
        .with_context(|| format!("preparing stream {}", config.stream))?;
    say_what_the_stream_can_lose(config, publisher).await;
    say_whether_the_horizon_covers_the_servers(config).await;
    say_if_the_stream_was_made_again(config, client, publisher).await;
    if let Some(large) = &config.pipeline.large_payloads {
        let stream = publisher.stream_info().await?.map(|info| info.config).unwrap_or_default();
        large_payloads::ensure_bucket(publisher.context(), large, &stream).await?;
    }
    Ok(())
}

/// Claims the stream for this source; one another source claimed is refused, unless
/// `--recreate-slot` takes it over.
async fn claim_stream(
    config: &Config,
    claims: &Claims,
    source: &Source,
    recreate: bool,
) -> anyhow::Result<()> {
    let Claim::Theirs(writer) = claims.claim(&config.stream, source).await? else { return Ok(()) };
    if !recreate {
        let slot = &config.slot;
        return Err(
            PipelineError::stream_claimed(&config.stream, writer, &source.database, slot).into()
        );
    }
    warn!(stream = %config.stream, previous = %writer, source = %source.writer(),
        "taking the stream over from its previous source, as --recreate-slot asks; \
         that source must be stopped for good");
    claims.take_over(&config.stream, source).await?;
    Ok(())
}

/// What decoding on a standby needs: PostgreSQL 16, the publication (read-only here, so
/// made on the primary), and `hot_standby_feedback` (else the primary may remove catalog
/// rows the slot needs, and Postgres invalidates it).
async fn prepare_standby(client: &tokio_postgres::Client, config: &Config) -> anyhow::Result<()> {
    let (num, shown) = admin::server_version(client).await?;
    if num < admin::STANDBY_DECODING_SINCE {
        anyhow::bail!(
            "--from-standby needs PostgreSQL 16 or later (logical decoding on a standby); \
             this server is PostgreSQL {shown}: point pgoutbox at the primary"
        );
    }
    if !admin::publication_exists(client, &config.publication).await? {
        anyhow::bail!(
            "publication {} does not exist on this standby, which cannot create it: create it \
             on the primary (`pgoutbox setup` there, or sql/outbox.sql's CREATE PUBLICATION)",
            config.publication
        );
    }
    let feedback: String = client.query_one("SHOW hot_standby_feedback", &[]).await?.get(0);
    if feedback != "on" {
        warn!(
            "hot_standby_feedback is off on this standby: the primary may remove catalog \
               rows the slot needs, and Postgres would then invalidate it; turn it on"
        );
    }
    Ok(())
}

/// Who this source is: `IDENTIFY_SYSTEM` over a short replication session.
pub async fn identify_source(config: &Config) -> Result<Source, PipelineError> {
    let mut conn = ReplicationConnection::connect(&config.database, &config.pg_tls).await?;
    let identity = conn.identify_system().await?;
    conn.terminate().await;
    Ok(Source::new(identity.system_id, identity.timeline, &identity.database, &config.slot))
}

async fn create_slot(
    client: &tokio_postgres::Client,
    name: &str,
    failover: bool,
) -> anyhow::Result<()> {
    if admin::create_slot(client, name, failover)
        .await
        .with_context(|| format!("creating slot {name}"))?
    {
        info!(slot = %name, failover, "replication slot created");
    }
    Ok(())
}
