//! Tables named by a pattern across schemas (schema-per-tenant): `--table
//! 'tenant_*.outbox'`. A tenant's table created while pgoutbox runs is not in a `FOR
//! TABLE` publication, and rows committed before it joins are never decoded. Each way it
//! can join is tried here: the event trigger of `setup --tenant-trigger` (in the creating
//! transaction), pgoutbox adopting it (the table added and its rows read and handed over,
//! in one transaction), and, when pgoutbox's role may not add it, a warning with the
//! statement that fixes it while the other tenants stream on, after which every row is
//! published once.

use std::collections::HashMap;
use std::time::Duration;

use super::several_tables::{per_tenant, tenant_rows, tenant_table};
use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, wait_until_streaming};

const TENANTS: [&str; 4] =
    ["--table", "tenant_*.outbox", "--subject-template", "tenants.{$schema}.{event_type}"];

/// Waits until the stream holds `n` messages, then returns each tenant's count.
async fn stored_per_tenant(
    nats: &Nats,
    n: u64,
    log: &dyn Fn() -> String,
) -> HashMap<String, usize> {
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(40), "every tenant row stored", || async {
        (count(&js, "OUTBOX").await >= n).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(stored.len() as u64, n, "log:\n{}", log());
    per_tenant(&stored)
}

fn counts(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
    pairs.iter().map(|(schema, n)| ((*schema).to_owned(), *n)).collect()
}

/// With the event trigger, a tenant created, filled and committed in one transaction while
/// pgoutbox runs is streamed from its first row, beside another tenant writing, and
/// nothing is adopted.
#[tokio::test(flavor = "multi_thread")]
async fn the_trigger_publishes_a_new_tenant_table_in_its_creating_transaction() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&tenant_table("tenant_1"));
    let setup = command(&pg, &nats).args(TENANTS).args(["setup", "--tenant-trigger"]).output();
    let setup = setup.expect("pgoutbox setup runs");
    let stderr = String::from_utf8_lossy(&setup.stderr);
    assert!(setup.status.success(), "setup --tenant-trigger failed: {stderr}");
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    let writer = pg.psql_in_background(tenant_rows("tenant_1", 0, 100));
    pg.psql(&format!(
        "BEGIN;\n{}\n{}COMMIT;",
        tenant_table("tenant_2"),
        tenant_rows("tenant_2", 0, 3)
    ));
    pg.psql(&tenant_rows("tenant_2", 3, 100));
    writer.join().expect("writer").expect("inserts");
    let tenants = stored_per_tenant(&nats, 200, &|| app.log()).await;
    assert_eq!(tenants, counts(&[("tenant_1", 100), ("tenant_2", 100)]), "{}", app.log());
    assert!(!app.log().contains("joined the publication"), "adopted:\n{}", app.log());
    // A table out of the pattern is left alone: not published, nothing stops.
    pg.psql(&tenant_table("other_1"));
    let published =
        pg.psql("SELECT count(*) FROM pg_publication_tables WHERE schemaname = 'other_1'");
    assert_eq!(published, "0");
    // teardown drops the trigger with the publication: a trigger left behind would fail
    // every new tenant's CREATE TABLE.
    crate::support::stop_and_wait_released(&pg, app).await;
    let teardown = command(&pg, &nats).args(TENANTS).args(["teardown", "--yes"]).output();
    let teardown = teardown.expect("pgoutbox teardown runs");
    let stdout = String::from_utf8_lossy(&teardown.stdout);
    assert!(teardown.status.success(), "{}", String::from_utf8_lossy(&teardown.stderr));
    assert!(stdout.contains("dropped event trigger pgoutbox_pgoutbox_tables"), "{stdout}");
    pg.psql(&tenant_table("tenant_3"));
}

/// Without the trigger, a tenant's table created and written while pgoutbox runs is found
/// by the liveness check and adopted while a writer goes on inserting into it (the lock
/// holds it off for the adoption's transaction): every row once, those committed before
/// the table joined the publication included, and those written during and after.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_tenant_table_is_adopted_with_every_row() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&tenant_table("tenant_1"));
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_table("tenant_2"));
    pg.psql(&tenant_rows("tenant_2", 0, 50));
    pg.psql(&tenant_rows("tenant_1", 0, 10));
    // One row every 20 ms or so, for longer than the liveness check takes to come round.
    let paced = tenant_rows("tenant_2", 50, 1050).replace(";\n", "; SELECT pg_sleep(0.02);\n");
    let writer = pg.psql_in_background(paced);
    eventually(Duration::from_secs(25), "the new table adopted", || async {
        app.log().contains("joined the publication").then_some(())
    })
    .await;
    assert!(!writer.is_finished(), "the writer stopped before the adoption; make it longer");
    writer.join().expect("writer").expect("inserts");
    pg.psql(&tenant_rows("tenant_2", 1050, 1060));
    let tenants = stored_per_tenant(&nats, 1070, &|| app.log()).await;
    assert_eq!(tenants, counts(&[("tenant_1", 10), ("tenant_2", 1060)]), "{}", app.log());
}

/// pgoutbox's role may not add the new table (another role owns it, and the publication):
/// pgoutbox skips it with one line naming the table, the pattern and what fixes it (never a
/// superuser, never an ownership handed to pgoutbox's role, which would make the table's
/// code its own), counts it on `/metrics`, and the other tenant streams on; once the
/// operator runs `setup` as the role that set pgoutbox up, the table is adopted with every
/// row, once.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_table_pgoutbox_may_not_add_is_skipped_saying_what_to_run() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&tenant_table("tenant_1"));
    pg.psql("CREATE ROLE relay LOGIN REPLICATION; GRANT CREATE ON DATABASE postgres TO relay");
    // The superuser sets up (the publication needs the tables' owner); pgoutbox runs as relay.
    let setup = command(&pg, &nats).args(TENANTS).arg("setup").output().expect("setup runs");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));
    let relay = pg.url_for("relay", None, "postgres");
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_DATABASE_URL", &relay).arg("run").args(TENANTS);
    let mut app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_rows("tenant_1", 0, 5));
    pg.psql(&tenant_table("tenant_2"));
    pg.psql(&tenant_rows("tenant_2", 0, 20));
    let line = eventually(Duration::from_secs(25), "a warning naming tenant_2.outbox", || async {
        let log = app.log();
        let line = log.lines().find(|l| l.contains("cannot be streamed"))?;
        Some(line.to_owned())
    })
    .await;
    for says in ["tenant_2.outbox", "tenant_*.outbox", "run `pgoutbox setup`"] {
        assert!(line.contains(says), "no {says:?} in {line}");
    }
    assert!(!line.contains("superuser") && !line.contains("OWNER TO"), "{line}");
    let port = app.http_port();
    let skipped = crate::support::metric(port, "pgoutbox_tables_not_streamed ");
    assert_eq!(skipped, Some(1.0), "log:\n{}", app.log());
    pg.psql(&tenant_rows("tenant_1", 5, 10));
    stored_per_tenant(&nats, 10, &|| app.log()).await;
    assert!(app.is_running(), "pgoutbox stopped:\n{}", app.log());
    // The operator runs setup again as the role that set pgoutbox up: it adopts the table.
    let setup = command(&pg, &nats).args(TENANTS).arg("setup").output().expect("setup runs");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));
    pg.psql(&tenant_rows("tenant_2", 20, 30));
    let tenants = stored_per_tenant(&nats, 40, &|| app.log()).await;
    assert_eq!(tenants, counts(&[("tenant_1", 10), ("tenant_2", 30)]), "{}", app.log());
    eventually(Duration::from_secs(15), "no table counted as not streamed", || async {
        let skipped = crate::support::metric(port, "pgoutbox_tables_not_streamed ");
        (skipped == Some(0.0)).then_some(())
    })
    .await;
}

/// An operator's publication `FOR ALL TABLES` covers a new tenant's table by itself: its
/// rows stream from the first, nothing is adopted, and rows of tables no entry names are
/// ignored.
#[tokio::test(flavor = "multi_thread")]
async fn a_publication_for_all_tables_covers_new_tenants_by_itself() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&tenant_table("tenant_1"));
    pg.psql("CREATE PUBLICATION pgoutbox FOR ALL TABLES WITH (publish = 'insert')");
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!(
        "BEGIN;\n{}\n{}COMMIT;",
        tenant_table("tenant_2"),
        tenant_rows("tenant_2", 0, 3)
    ));
    pg.psql(&tenant_table("other"));
    pg.psql(&tenant_rows("other", 0, 5));
    pg.psql(&tenant_rows("tenant_1", 0, 4));
    let tenants = stored_per_tenant(&nats, 7, &|| app.log()).await;
    assert_eq!(tenants, counts(&[("tenant_1", 4), ("tenant_2", 3)]), "{}", app.log());
    // A liveness round over (the next one has begun), still nothing adopted.
    eventually(Duration::from_secs(30), "a liveness round over", || async {
        (app.log().matches("liveness check").count() >= 2).then_some(())
    })
    .await;
    assert!(!app.log().contains("joined the publication"), "adopted:\n{}", app.log());
}
