//! One table never holds the rest (issue 55): a tenant's table that is large, cannot be
//! published or stops being published is adopted beside the stream, named in one line, or
//! skipped, and every other tenant streams on.

use std::time::Duration;

use super::hostile_database::{TENANTS, assert_ran, pgoutbox, stored_per_tenant, tenants};
use super::several_tables::{tenant_rows, tenant_table};
use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, metric, wait_until_streaming};

/// Rows of the large table of [`a_large_table_adopted_never_holds_the_other_tenants_back`].
const LARGE: u64 = 200_000;

/// S6: a tenant makes a table of many rows with `CREATE TABLE … AS` while pgoutbox is
/// stopped. Adopting it reads every row in one transaction, which takes seconds; it runs
/// beside the stream, so pgoutbox streams at once: another tenant's row committed
/// meanwhile is stored within 2 s, while the adoption is still reading (its progress on
/// `/metrics`); then every row of the large table is stored, once.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_table_adopted_never_holds_the_other_tenants_back() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&tenant_table("tenant_a"));
    assert_ran(&pgoutbox(&pg, &nats, &[&TENANTS[..], &["setup"]].concat()), "setup");
    pg.psql(&format!(
        "CREATE SCHEMA tenant_big; CREATE TABLE tenant_big.outbox AS \
         SELECT gen_random_uuid() AS id, 'order'::text AS aggregate_type, \
                k::text AS aggregate_id, 'created'::text AS event_type, \
                jsonb_build_object('k', k) AS payload, NULL::jsonb AS headers, \
                now() AS created_at \
         FROM generate_series(1, {LARGE}) k"
    ));
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    let adopted = |log: &str| log.contains("its rows handed over");
    eventually(Duration::from_secs(20), "the adoption's progress on /metrics", || async {
        let read = metric(app.http_port(), "pgoutbox_adoption_rows_read ").unwrap_or(0.0);
        (read > 0.0).then_some(())
    })
    .await;
    pg.psql(&tenant_rows("tenant_a", 0, 1));
    let committed = std::time::Instant::now();
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(2), "tenant_a's row stored within 2 s", || async {
        (count(&js, "OUTBOX").await >= 1).then_some(())
    })
    .await;
    let waited = committed.elapsed();
    assert!(!adopted(&app.log()), "the adoption ended before the other row was stored");
    eventually(Duration::from_secs(240), "every row of tenant_big stored", || async {
        (count(&js, "OUTBOX").await > LARGE).then_some(())
    })
    .await;
    assert_eq!(count(&js, "OUTBOX").await, LARGE + 1, "log:\n{}", app.log());
    println!("tenant_a's row stored {waited:?} after its commit, during the adoption");
}

/// Under a publication `FOR ALL TABLES`, a tenant may make its own table `UNLOGGED`, which
/// takes it out of the publication: that tenant's doing never stops the others. pgoutbox
/// names the table and the fix in one line, counts it, and streams the other tenant on.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_table_made_unlogged_never_stops_the_others() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&(tenant_table("tenant_a") + &tenant_table("tenant_b")));
    pg.psql("CREATE PUBLICATION pgoutbox FOR ALL TABLES WITH (publish = 'insert')");
    let mut app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&(tenant_rows("tenant_a", 0, 1) + &tenant_rows("tenant_b", 0, 1)));
    stored_per_tenant(&nats, 2, &|| app.log()).await;
    pg.psql("ALTER TABLE tenant_b.outbox SET UNLOGGED");
    let line = eventually(Duration::from_secs(25), "tenant_b named as unlogged", || async {
        let log = app.log();
        Some(log.lines().find(|l| l.contains("no longer streamed"))?.to_owned())
    })
    .await;
    assert!(line.contains("ALTER TABLE \"tenant_b\".\"outbox\" SET LOGGED"), "{line}");
    pg.psql(&tenant_rows("tenant_a", 1, 3));
    let stored = stored_per_tenant(&nats, 4, &|| app.log()).await;
    assert_eq!(stored, tenants(&[("tenant_a", 3), ("tenant_b", 1)]), "{}", app.log());
    assert!(app.is_running(), "pgoutbox stopped:\n{}", app.log());
    let skipped = metric(app.http_port(), "pgoutbox_tables_not_streamed ");
    assert_eq!(skipped, Some(1.0), "log:\n{}", app.log());
}

/// The first `setup` with a pattern that matches an `UNLOGGED` table among others: the
/// publication is made, the other tables join it, the unlogged one is named in one line,
/// and `run` streams the others (before, one statement named them all, and failed at
/// every start).
#[tokio::test(flavor = "multi_thread")]
async fn one_unpublishable_table_never_fails_the_first_setup() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&(tenant_table("tenant_a") + &tenant_table("tenant_u")));
    pg.psql("ALTER TABLE tenant_u.outbox SET UNLOGGED");
    let setup = pgoutbox(&pg, &nats, &[&TENANTS[..], &["setup"]].concat());
    assert_ran(&setup, "setup");
    let said = String::from_utf8_lossy(&setup.stderr);
    assert!(said.contains("tenant_u.outbox") && said.contains("not added"), "{said}");
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_rows("tenant_a", 0, 2));
    let stored = stored_per_tenant(&nats, 2, &|| app.log()).await;
    assert_eq!(stored, tenants(&[("tenant_a", 2)]), "{}", app.log());
}
