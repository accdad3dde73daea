//! pgoutbox runs no one else's code (issue 55). pgoutbox usually holds more privilege than
//! the roles that write to its database, so a database those roles prepared must not make
//! it run their code: every name it sends resolves in `pg_catalog`, and it plans no query
//! on a table whose owner it does not trust. Each test plants traps that record any call
//! (a warning in the server's log) and make role `mallory` a superuser when they run as
//! one, runs pgoutbox's commands as a superuser, and asserts that no trap ran.

use std::process::Output;
use std::time::Duration;

use super::several_tables::{tenant_rows, tenant_table};
use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, stop_and_wait_released, wait_until_streaming};

/// Whether role `mallory` is a superuser, as `t` or `f`.
const MALLORY_IS_SUPERUSER: &str = "SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'";

/// The plain outbox and a pattern of tenants' tables, one chain.
const TABLES: [&str; 4] = ["--table", "public.outbox", "--table", "tenant_*.outbox"];

/// `pgoutbox <args>`, run to its end.
fn pgoutbox(pg: &Postgres, nats: &Nats, args: &[&str]) -> Output {
    command(pg, nats).args(args).output().expect("pgoutbox runs")
}

fn assert_ran(out: &Output, what: &str) {
    assert!(out.status.success(), "{what} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The traps that ran, as the server logged them.
fn sprung(pg: &Postgres) -> Vec<String> {
    pg.log().lines().filter(|l| l.contains("TRAP SPRUNG")).map(str::to_owned).collect()
}

fn assert_no_trap_ran(pg: &Postgres, after: &str) {
    assert_eq!(sprung(pg), Vec::<String>::new(), "after {after}, traps ran as pgoutbox");
    assert_eq!(pg.psql(MALLORY_IS_SUPERUSER), "f", "after {after}, mallory is a superuser");
}

/// S1 and S1j: mallory, with only CREATE on the database, puts overloads that match
/// pgoutbox's calls better than `pg_catalog`'s (`string_agg(name, text)`,
/// `to_jsonb(pg_replication_slots)`) in a schema named after pgoutbox's login role; and the
/// database's `search_path` lists a schema of copies of every catalog function, table and
/// view before `pg_catalog`. Every command, over every kind of session pgoutbox opens
/// (SQL, replication, the liveness check, adoption, retention), runs none of them.
#[tokio::test(flavor = "multi_thread")]
async fn every_command_resolves_names_in_pg_catalog_only() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(&tenant_table("tenant_a"));
    pg.psql(include_str!("../fixtures/hostile/name_traps.sql"));
    let before = pgoutbox(&pg, &nats, &[&TABLES[..], &["status", "--json"]].concat());
    assert!(before.status.code().is_some(), "status before setup ended by a signal");
    assert_ran(&pgoutbox(&pg, &nats, &[&TABLES[..], &["setup"]].concat()), "setup");
    assert_no_trap_ran(&pg, "setup");

    let app = Pgoutbox::run(&pg, &nats, &[&TABLES[..], &["--retention", "1h"]].concat());
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!(
        "{}{}{}",
        tenant_rows("public", 0, 3),
        tenant_rows("tenant_a", 0, 3),
        tenant_table("tenant_b") + &tenant_rows("tenant_b", 0, 2)
    ));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(40), "8 rows stored, tenant_b's adopted", || async {
        (count(&js, "OUTBOX").await >= 8).then_some(())
    })
    .await;
    // The liveness check asks again every 10 s: wait for a round after the adoption.
    let rounds = |log: &str| log.lines().filter(|l| l.contains("liveness check")).count();
    let seen = rounds(&app.log());
    eventually(Duration::from_secs(25), "another round of the liveness check", || async {
        (rounds(&app.log()) > seen).then_some(())
    })
    .await;
    assert_no_trap_ran(&pg, "run");
    let verify = ["verify", "--from-table", "public.outbox"];
    let replay = ["replay", "--from-table", "public.outbox", "--created-from", "2000-01-01"];
    for args in [&["status"][..], &["status", "--json"], &verify, &replay] {
        let out = pgoutbox(&pg, &nats, &[&TABLES[..], args].concat());
        assert_ran(&out, &args.join(" "));
        assert_no_trap_ran(&pg, &args.join(" "));
    }
    stop_and_wait_released(&pg, app).await;

    let trigger = pgoutbox(&pg, &nats, &[&TABLES[..], &["setup", "--tenant-trigger"]].concat());
    assert_ran(&trigger, "setup --tenant-trigger");
    pg.psql(&(tenant_table("tenant_c") + &tenant_rows("tenant_c", 0, 1)));
    let app = Pgoutbox::run(&pg, &nats, &[&TABLES[..], &["--recover"]].concat());
    wait_until_streaming(&pg, &app).await;
    eventually(Duration::from_secs(40), "tenant_c's row stored", || async {
        (count(&js, "OUTBOX").await >= 12).then_some(())
    })
    .await;
    stop_and_wait_released(&pg, app).await;
    assert_ran(&pgoutbox(&pg, &nats, &[&TABLES[..], &["teardown", "--yes"]].concat()), "teardown");
    assert_no_trap_ran(&pg, "setup --tenant-trigger, run --recover and teardown");
}
