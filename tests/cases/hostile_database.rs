//! pgoutbox runs no one else's code (issue 55). pgoutbox usually holds more privilege than
//! the roles that write to its database, so a database those roles prepared must not make
//! it run their code: every name it sends resolves in `pg_catalog`, and it plans no query
//! on a table whose owner it does not trust. Each test plants traps that record any call
//! (a warning in the server's log) and make role `mallory` a superuser when they run as
//! one, runs pgoutbox's commands as a superuser, and asserts that no trap ran.

use std::process::Output;
use std::time::Duration;

use super::several_tables::per_tenant;
use super::several_tables::{tenant_rows, tenant_table};
use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{count, jetstream, read_all};
use crate::support::{
    Nats, Postgres, eventually, metric, stop_and_wait_released, wait_until_streaming,
};

/// Whether role `mallory` is a superuser, as `t` or `f`.
pub(super) const MALLORY_IS_SUPERUSER: &str =
    "SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'";

/// Role `mallory` and the trap (`tests/fixtures/hostile/trap.sql`).
pub(super) const TRAP: &str = include_str!("../fixtures/hostile/trap.sql");

/// The plain outbox and a pattern of tenants' tables, one chain.
const TABLES: [&str; 4] = ["--table", "public.outbox", "--table", "tenant_*.outbox"];

/// `pgoutbox <args>`, run to its end.
pub(super) fn pgoutbox(pg: &Postgres, nats: &Nats, args: &[&str]) -> Output {
    command(pg, nats).args(args).output().expect("pgoutbox runs")
}

pub(super) fn assert_ran(out: &Output, what: &str) {
    assert!(out.status.success(), "{what} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Panics naming the first of `says` that `text` lacks.
pub(super) fn assert_says(text: &str, says: &[&str]) {
    for says in says {
        assert!(text.contains(says), "no {says:?} in {text}");
    }
}

/// The traps that ran, as the server logged them.
pub(super) fn sprung(pg: &Postgres) -> Vec<String> {
    pg.log().lines().filter(|l| l.contains("TRAP SPRUNG")).map(str::to_owned).collect()
}

pub(super) fn assert_no_trap_ran(pg: &Postgres, after: &str) {
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
    pg.psql(TRAP);
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
    // No slot now: --backfill seeds from the table what the stream lacks, then streams.
    let app = Pgoutbox::run(&pg, &nats, &[&TABLES[..], &["--backfill"]].concat());
    wait_until_streaming(&pg, &app).await;
    stop_and_wait_released(&pg, app).await;
    assert_no_trap_ran(&pg, "setup --tenant-trigger, run --recover, teardown and --backfill");
}

/// S1j alone, with the database's search path as PostgreSQL ships it: the one overload
/// `to_jsonb(pg_replication_slots)` in a schema named after pgoutbox's role. `status`,
/// `status --json` and `setup` once the slot exists run none of it.
#[tokio::test(flavor = "multi_thread")]
async fn status_never_calls_a_to_jsonb_of_another_role() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(TRAP);
    pg.psql(
        "SET ROLE mallory; CREATE SCHEMA postgres; GRANT USAGE ON SCHEMA postgres TO PUBLIC; \
         CREATE FUNCTION postgres.to_jsonb(pg_catalog.pg_replication_slots) RETURNS jsonb \
         LANGUAGE sql SET search_path = pg_catalog AS \
           $$ SELECT CASE WHEN mallory_first.trap('to_jsonb') THEN to_jsonb($1) END $$; \
         RESET ROLE;",
    );
    for args in [&["setup"][..], &["setup"], &["status"], &["status", "--json"]] {
        let out = pgoutbox(&pg, &nats, args);
        assert!(out.status.code().is_some(), "{} ended by a signal", args.join(" "));
        assert_no_trap_ran(&pg, &args.join(" "));
    }
}

/// The event trigger of `setup --tenant-trigger` runs as the superuser who made it
/// (`SECURITY DEFINER`) in the session of whoever creates a table. mallory makes a
/// temporary view named `pg_class` (a session's `pg_temp` is searched first for relations
/// unless the path lists it), then a table the pattern matches: the trigger reads the
/// catalog, not mallory's view. Failed before: the function's path was `pg_catalog` alone,
/// and mallory became a superuser at its `CREATE TABLE`.
#[tokio::test(flavor = "multi_thread")]
async fn the_tenant_trigger_never_reads_a_temporary_view_of_the_creating_role() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(TRAP);
    let trigger = pgoutbox(&pg, &nats, &[&TABLES[..], &["setup", "--tenant-trigger"]].concat());
    assert_ran(&trigger, "setup --tenant-trigger");
    // Not `psql` for the trap: this session is mallory's, not the test's.
    pg.psql(&format!(
        "SET application_name = 'mallory'; SET ROLE mallory;          CREATE TEMP VIEW pg_class AS SELECT * FROM pg_catalog.pg_class            WHERE mallory_first.trap('temporary view pg_class');          {} RESET ROLE;",
        tenant_table("tenant_m")
    ));
    let published = "SELECT count(*) FROM pg_publication_tables WHERE schemaname = 'tenant_m'";
    assert_eq!(pg.psql(published), "1", "the trigger still adds the new table");
    assert_no_trap_ran(&pg, "a table made by mallory under the tenant trigger");
}

/// A pattern of tenants' tables, each on its tenant's subjects.
pub(super) const TENANTS: [&str; 4] =
    ["--table", "tenant_*.outbox", "--subject-template", "tenants.{$schema}.{event_type}"];

/// Waits until the stream holds `n` messages, then counts them by tenant.
pub(super) async fn stored_per_tenant(
    nats: &Nats,
    n: u64,
    log: &dyn Fn() -> String,
) -> Vec<(String, usize)> {
    let js = jetstream(&nats.url()).await;
    let what = format!("{n} messages stored");
    eventually(Duration::from_secs(40), &what, || async {
        (count(&js, "OUTBOX").await >= n).then_some(())
    })
    .await;
    let mut tenants: Vec<_> = per_tenant(&read_all(&js, "OUTBOX").await).into_iter().collect();
    tenants.sort();
    assert_eq!(tenants.iter().map(|(_, n)| *n as u64).sum::<u64>(), n, "log:\n{}", log());
    tenants
}

pub(super) fn tenants(pairs: &[(&str, usize)]) -> Vec<(String, usize)> {
    pairs.iter().map(|(schema, n)| ((*schema).to_owned(), *n)).collect()
}

/// S2 and S2s: mallory makes `tenant_evil.outbox` (`tests/fixtures/hostile/table_traps.sql`:
/// an index and a statistics object on expressions the planner folds, a policy, a rule)
/// with 5 rows, out of the publication. pgoutbox, a superuser, adds it without planning a
/// query on it: its new rows stream from the WAL, the 5 it held are named as not read in
/// one line with the owner and the setting, and counted; the other tenant streams on;
/// `verify` and `replay` refuse it in one line; a recovery after the slot was lost reads the
/// other tenant and not this one. No trap runs, no role gains a privilege.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_of_an_untrusted_owner_streams_and_is_never_read() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(TRAP);
    pg.psql(&tenant_table("tenant_a"));
    assert_ran(&pgoutbox(&pg, &nats, &[&TENANTS[..], &["setup"]].concat()), "setup");
    pg.psql(include_str!("../fixtures/hostile/table_traps.sql"));
    pg.psql(&tenant_rows("tenant_a", 0, 3));
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    let joined = "SELECT count(*) FROM pg_publication_tables WHERE schemaname = 'tenant_evil'";
    eventually(Duration::from_secs(25), "tenant_evil.outbox in the publication", || async {
        (pg.psql(joined) == "1").then_some(())
    })
    .await;
    assert_no_trap_ran(&pg, "run adopted tenant_evil.outbox");
    let line = eventually(Duration::from_secs(5), "a warning naming tenant_evil", || async {
        let log = app.log();
        Some(log.lines().find(|l| l.contains("were not read"))?.to_owned())
    })
    .await;
    assert_says(&line, &["tenant_evil.outbox", "\"mallory\"", "--trusted-owner mallory"]);
    pg.psql(&format!("SET ROLE mallory;\n{}", tenant_rows("tenant_evil", 10, 12)));
    pg.psql(&tenant_rows("tenant_a", 3, 5));
    let stored = stored_per_tenant(&nats, 7, &|| app.log()).await;
    assert_eq!(stored, tenants(&[("tenant_a", 5), ("tenant_evil", 2)]), "{}", app.log());
    let unread = metric(app.http_port(), "pgoutbox_tables_unread_total ");
    assert_eq!(unread, Some(1.0), "log:\n{}", app.log());
    assert_no_trap_ran(&pg, "run adopted tenant_evil.outbox");

    let evil = ["--from-table", "tenant_evil.outbox"];
    for command in [&["verify"][..], &["replay", "--created-from", "2000-01-01"]] {
        let out = pgoutbox(&pg, &nats, &[&TENANTS[..], command, &evil].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{} read tenant_evil: {stderr}", command[0]);
        let said = stderr.lines().last().unwrap_or_default();
        for says in ["does not read table tenant_evil.outbox", "--trusted-owner mallory"] {
            assert!(said.contains(says), "{}: no {says:?} in {said}", command[0]);
        }
    }
    assert_no_trap_ran(&pg, "verify and replay of tenant_evil.outbox");

    // The slot is lost while pgoutbox is stopped; --recover reads every table it may.
    stop_and_wait_released(&pg, app).await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql(&tenant_rows("tenant_a", 5, 6));
    let app = Pgoutbox::run(&pg, &nats, &[&TENANTS[..], &["--recover"]].concat());
    wait_until_streaming(&pg, &app).await;
    let stored = stored_per_tenant(&nats, 8, &|| app.log()).await;
    assert_eq!(stored, tenants(&[("tenant_a", 6), ("tenant_evil", 2)]), "{}", app.log());
    assert!(
        app.log().contains("the seed reads the other tables but not this one"),
        "{}",
        app.log()
    );
    assert_no_trap_ran(&pg, "run --recover");
}

/// The trap of an ownership handed over: a tenant's table with a `BEFORE DELETE` trigger
/// is given to pgoutbox's role (as operators were once advised). `--retention` deletes from
/// a table pgoutbox owns, but never runs a trigger function of an owner it does not trust:
/// the rows stay, one line names the trigger, and the trap never runs.
#[tokio::test(flavor = "multi_thread")]
async fn retention_never_runs_a_trigger_function_of_an_untrusted_owner() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(TRAP);
    pg.psql(
        "SET ROLE mallory; \
         CREATE FUNCTION mallory_first.on_delete() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN PERFORM mallory_first.trap('delete trigger'); RETURN OLD; END $$; \
         RESET ROLE;",
    );
    pg.psql(&tenant_table("tenant_given"));
    pg.psql(
        "GRANT USAGE ON SCHEMA tenant_given TO mallory; \
         ALTER TABLE tenant_given.outbox OWNER TO mallory; SET ROLE mallory; \
         CREATE TRIGGER on_delete BEFORE DELETE ON tenant_given.outbox \
           FOR EACH ROW EXECUTE FUNCTION mallory_first.on_delete(); \
         RESET ROLE; ALTER TABLE tenant_given.outbox OWNER TO postgres;",
    );
    let table = ["--table", "tenant_given.outbox"];
    assert_ran(&pgoutbox(&pg, &nats, &[&table[..], &["setup"]].concat()), "setup");
    let app = Pgoutbox::run(
        &pg,
        &nats,
        &[&table[..], &["--retention", "1s", "--durability-horizon", "0s"]].concat(),
    );
    wait_until_streaming(&pg, &app).await;
    // Rows a day old, published: old enough for retention at once.
    pg.psql(&tenant_rows("tenant_given", 0, 3).replace(
        "(aggregate_type, aggregate_id, event_type, payload) VALUES (",
        "(created_at, aggregate_type, aggregate_id, event_type, payload) VALUES \
         (now() - interval '1 day', ",
    ));
    let skipped =
        |log: &str| log.lines().find(|l| l.contains("retention skips")).map(str::to_owned);
    eventually(Duration::from_secs(30), "retention's pass over the table", || async {
        (skipped(&app.log()).is_some() || !sprung(&pg).is_empty()).then_some(())
    })
    .await;
    assert_no_trap_ran(&pg, "retention");
    let line = skipped(&app.log()).unwrap_or_default();
    assert_says(
        &line,
        &["tenant_given.outbox", "trigger on_delete", "\"mallory\"", "--trusted-owner"],
    );
    assert_eq!(pg.psql("SELECT count(*) FROM tenant_given.outbox"), "3", "rows were deleted");
}

/// pgoutbox's own tables are its own: a role that may create tables in `public` (every
/// login's right on PostgreSQL 14) makes `public.pgoutbox_replay` first, with a trigger.
/// `setup` refuses to use it (one line: drop it), and adopting a tenant's table never
/// writes to it: the table is skipped with one line, and the other tenant streams on.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_table_made_first_by_another_role_is_never_written() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(TRAP);
    pg.psql(&format!(
        "GRANT CREATE ON SCHEMA public TO mallory; SET ROLE mallory; \
         CREATE TABLE public.pgoutbox_replay ({}); \
         CREATE FUNCTION public.on_handover() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN PERFORM mallory_first.trap('replay table trigger'); RETURN NEW; END $$; \
         CREATE TRIGGER on_handover BEFORE INSERT ON public.pgoutbox_replay \
           FOR EACH ROW EXECUTE FUNCTION public.on_handover(); \
         RESET ROLE;",
        "slot text NOT NULL, replay_id text NOT NULL, row_index bigint NOT NULL, \
         total bigint NOT NULL, frame bytea NOT NULL, handed_at timestamptz NOT NULL DEFAULT now()"
    ));
    pg.psql(&tenant_table("tenant_a"));
    let setup = pgoutbox(&pg, &nats, &[&TENANTS[..], &["setup"]].concat());
    assert_ran(&setup, "setup");
    let said = String::from_utf8_lossy(&setup.stderr);
    assert!(said.contains("owned by role mallory") && said.contains("drop it"), "{said}");
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&(tenant_table("tenant_b") + &tenant_rows("tenant_b", 0, 2)));
    let named = |log: &str| log.lines().find(|l| l.contains("is not adopted")).map(str::to_owned);
    eventually(Duration::from_secs(25), "tenant_b's adoption tried", || async {
        (named(&app.log()).is_some() || !sprung(&pg).is_empty()).then_some(())
    })
    .await;
    assert_no_trap_ran(&pg, "adopting tenant_b.outbox");
    let line = named(&app.log()).unwrap_or_default();
    assert_says(&line, &["tenant_b.outbox", "public.pgoutbox_replay", "\"mallory\""]);
    pg.psql(&tenant_rows("tenant_a", 0, 2));
    let stored = stored_per_tenant(&nats, 2, &|| app.log()).await;
    assert_eq!(stored, tenants(&[("tenant_a", 2)]), "{}", app.log());
}

/// A type's owner may `CREATE CAST` from it: an outbox table pgoutbox trusts, whose id
/// column is of mallory's enum with a cast to text that springs the trap, streams (pgoutput
/// writes the value with the type's own output function); `verify` refuses to read it in
/// one line naming the column and the type's owner, and no cast runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_column_of_an_untrusted_type_is_never_cast() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(TRAP);
    pg.psql(
        "SET ROLE mallory; CREATE SCHEMA mallory_types; \
         GRANT USAGE ON SCHEMA mallory_types TO PUBLIC; \
         CREATE TYPE mallory_types.evil_id AS ENUM ('a', 'b'); \
         CREATE FUNCTION mallory_types.to_text(mallory_types.evil_id) RETURNS text \
           LANGUAGE plpgsql AS $$ BEGIN PERFORM mallory_first.trap('cast'); RETURN 'x'; END $$; \
         CREATE CAST (mallory_types.evil_id AS text) \
           WITH FUNCTION mallory_types.to_text(mallory_types.evil_id); \
         RESET ROLE;",
    );
    pg.psql(&include_str!("../../sql/outbox.sql").replace(
        "id uuid PRIMARY KEY DEFAULT gen_random_uuid()",
        "id mallory_types.evil_id PRIMARY KEY",
    ));
    assert_ran(&pgoutbox(&pg, &nats, &["setup"]), "setup");
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES \
         ('a', 'order', '1', 'created', '{}'), ('b', 'order', '2', 'created', '{}')",
    );
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "both rows stored", || async {
        (count(&js, "OUTBOX").await >= 2).then_some(())
    })
    .await;
    let out = pgoutbox(&pg, &nats, &["verify"]);
    assert_no_trap_ran(&pg, "verify");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "verify read the table: {said}");
    assert_says(
        &said,
        &["does not read table public.outbox", "column id", "--trusted-owner mallory"],
    );
}

/// A table handed to pgoutbox's own role (`ALTER TABLE … OWNER TO`) keeps the expressions
/// its former owner made: its indexes and statistics still call mallory's functions. So a
/// table is trusted only when the functions its indexes, statistics, policies and
/// constraints call are too: `verify` refuses it, naming the function, and no trap runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_handed_over_keeps_no_expression_of_its_former_owner_running() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(TRAP);
    pg.psql(include_str!("../fixtures/hostile/table_traps.sql"));
    pg.psql("ALTER TABLE tenant_evil.outbox OWNER TO postgres; ALTER SCHEMA tenant_evil OWNER TO postgres");
    let table = ["--table", "tenant_evil.outbox"];
    assert_ran(&pgoutbox(&pg, &nats, &[&table[..], &["setup"]].concat()), "setup");
    let out = pgoutbox(&pg, &nats, &[&table[..], &["verify"]].concat());
    assert_no_trap_ran(&pg, "verify of a table handed over");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "verify read the table: {said}");
    assert_says(&said, &["calls function tenant_evil.", "\"mallory\"", "--trusted-owner mallory"]);
}

/// A schema's owner may rename it and put a view in a table's place between two of
/// pgoutbox's statements: a table pgoutbox trusts, in a schema mallory owns, is not read.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_in_a_schema_of_an_untrusted_owner_is_never_read() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(TRAP);
    pg.psql("SET ROLE mallory; CREATE SCHEMA tenant_s; RESET ROLE;");
    pg.psql(&tenant_table("tenant_s").replace("CREATE SCHEMA tenant_s;", ""));
    let table = ["--table", "tenant_s.outbox"];
    assert_ran(&pgoutbox(&pg, &nats, &[&table[..], &["setup"]].concat()), "setup");
    let out = pgoutbox(&pg, &nats, &[&table[..], &["verify"]].concat());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "verify read the table: {said}");
    assert_says(&said, &["its schema tenant_s is owned by role \"mallory\"", "--trusted-owner"]);
}

/// Row-level security hides rows in silence from a reader it applies to: a read of
/// pgoutbox's turns it off, so a policy that applies fails the read, saying so, instead of
/// `verify` finding nothing missing in a table it could not see.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_never_hides_rows_from_a_read_in_silence() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(
        "CREATE ROLE relay LOGIN REPLICATION; GRANT SELECT ON public.outbox TO relay; \
         ALTER TABLE public.outbox ENABLE ROW LEVEL SECURITY; \
         CREATE POLICY only_mine ON public.outbox FOR SELECT TO relay \
           USING (aggregate_type = 'mine');",
    );
    assert_ran(&pgoutbox(&pg, &nats, &["setup"]), "setup");
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_rows("public", 0, 2));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "both rows stored", || async {
        (count(&js, "OUTBOX").await >= 2).then_some(())
    })
    .await;
    let mut verify = command(&pg, &nats);
    verify.env("PGOUTBOX_DATABASE_URL", pg.url_for("relay", None, "postgres")).arg("verify");
    let out = verify.output().expect("verify runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "verify saw no row and said all is well: {said}");
    assert_says(&said, &["row-level security"]);
}

/// T1 and T3 (issue 69): mallory, who may create in `public` (every role may on 14), makes
/// the objects earlier versions kept there first, under their names: the record of what
/// JetStream acknowledged, with index expressions that spring the trap when planned or
/// written, and the tenant trigger's function. pgoutbox's own objects live in its own
/// schema: hers are never planned, altered or replaced, and every command goes on. A
/// schema she made under the name pgoutbox is told to use, or one she may create in,
/// stops setup with one line.
#[tokio::test(flavor = "multi_thread")]
async fn pgoutbox_s_own_names_made_first_by_another_role_are_never_touched() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(&tenant_table("tenant_a"));
    pg.psql(TRAP);
    pg.psql(include_str!("../fixtures/hostile/own_names.sql"));
    let columns = "SELECT count(*) FROM pg_attribute WHERE attrelid = \
                   'public.pgoutbox_acknowledged'::regclass AND attnum > 0";
    let columns_before = pg.psql(columns);
    assert_ran(&pgoutbox(&pg, &nats, &[&TABLES[..], &["setup"]].concat()), "setup");
    let trigger = pgoutbox(&pg, &nats, &[&TABLES[..], &["setup", "--tenant-trigger"]].concat());
    assert_ran(&trigger, "setup --tenant-trigger");
    let app = Pgoutbox::run(&pg, &nats, &TABLES);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_table("tenant_b"));
    pg.psql(&tenant_rows("tenant_b", 0, 3));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "tenant_b's rows stored", || async {
        (count(&js, "OUTBOX").await >= 3).then_some(())
    })
    .await;
    let status = pgoutbox(&pg, &nats, &[&TABLES[..], &["status", "--json"]].concat());
    assert!(status.status.code().is_some(), "status ended by a signal");
    drop(app);
    assert_no_trap_ran(&pg, "setup, the tenant trigger, run and status beside her objects");
    assert_eq!(pg.psql(columns), columns_before, "mallory's table was altered");
    let function = "SELECT pg_get_userbyid(proowner) || ' ' || prosecdef FROM pg_proc \
                    WHERE oid = 'public.pgoutbox_pgoutbox_tables()'::regprocedure";
    assert_eq!(pg.psql(function), "mallory false", "her function was replaced");
    let runs = "SELECT evtfoid::regprocedure FROM pg_event_trigger";
    assert_eq!(pg.psql(runs), "pgoutbox.pgoutbox_pgoutbox_tables()");
    let record = "SELECT pg_get_userbyid(relowner) FROM pg_class \
                  WHERE oid = 'pgoutbox.acknowledged'::regclass";
    assert_eq!(pg.psql(record), "postgres", "the record is not in pgoutbox's own schema");

    // Her schema under the name pgoutbox is told to use, then pgoutbox's own opened to all.
    pg.psql("SET ROLE mallory; CREATE SCHEMA mallory_own; RESET ROLE");
    pg.psql("GRANT CREATE ON SCHEMA pgoutbox TO PUBLIC");
    for (args, says) in [
        (&["setup", "--own-schema", "mallory_own"][..], &["schema mallory_own", "\"mallory\""][..]),
        (&["setup"], &["REVOKE CREATE ON SCHEMA \"pgoutbox\" FROM PUBLIC"]),
    ] {
        let out = pgoutbox(&pg, &nats, args);
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} used the schema: {said}");
        let line = said.lines().rfind(|l| l.starts_with("error:")).unwrap_or_default();
        assert_says(line, says);
    }
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_class WHERE relnamespace = 'mallory_own'::regnamespace"),
        "0"
    );
    assert_no_trap_ran(&pg, "setup beside her schema");
}
