//! Tenant tables are not trusted (issue 45). With `--table` naming tables by a pattern,
//! whoever may create a schema may create a table pgoutbox streams, so nothing in such a
//! table, nor in an emitted event, may act with pgoutbox's privileges or choose for it:
//! adopting a tenant's table never runs the tenant's triggers (it reads the rows, never
//! writes them, even as a superuser); a table of another session or one that cannot be
//! published (temporary, unlogged) is skipped and the other tenants stream on; an emitted
//! event cannot name the tenant it is published as; a scheduled row never replaces
//! another's schedule when ids are reused; and `teardown --only-table` refuses a table a
//! pattern matches, whose history would be published again at the next start.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream;

use super::several_tables::{per_tenant, tenant_rows, tenant_table};
use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{Stored, count, create_scheduled_outbox_stream, jetstream, read_all};
use crate::support::{
    BIGSERIAL_OUTBOX, Nats, Postgres, eventually, stop_and_wait_released, wait_until_streaming,
};

const TENANTS: [&str; 4] =
    ["--table", "tenant_*.outbox", "--subject-template", "tenants.{$schema}.{event_type}"];

/// Reading a table runs its owner's code (`hostile_database`): the tests here trust the
/// tenant's owner for reads, and check that its triggers never run.
const TRUST_EVIL_OWNER: [&str; 2] = ["--trusted-owner", "tenant_evil_owner"];

/// Whether role `mallory` is a superuser, as `t` or `f`.
const MALLORY_IS_SUPERUSER: &str = "SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'";

/// How many temporary tables named `outbox` exist, in any session.
const TEMP_OUTBOXES: &str =
    "SELECT count(*) FROM pg_class WHERE relname = 'outbox' AND relpersistence = 't'";

fn counts(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
    pairs.iter().map(|(schema, n)| ((*schema).to_owned(), *n)).collect()
}

/// Waits until the stream holds at least `n` messages, then reads them all.
async fn stored_at_least(js: &jetstream::Context, n: u64) -> Vec<Stored> {
    let what = format!("{n} messages in stream OUTBOX");
    eventually(Duration::from_secs(40), &what, || async {
        (count(js, "OUTBOX").await >= n).then_some(())
    })
    .await;
    read_all(js, "OUTBOX").await
}

/// How many rounds of the liveness check (every 10 s) the log shows: its debug line, the
/// only one with the slot's holder.
fn liveness_rounds(log: &str) -> usize {
    log.lines().filter(|l| l.contains("liveness check") && l.contains("holder")).count()
}

/// `pgoutbox setup` with `args`, which must succeed.
fn setup(pg: &Postgres, nats: &Nats, args: &[&str]) {
    let out = command(pg, nats).args(args).arg("setup").output().expect("pgoutbox setup runs");
    assert!(out.status.success(), "setup failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// SQL making, as role `tenant_evil_owner` (objects it creates are its own), tenant
/// `schema`'s outbox with a trap: a plain (not `SECURITY DEFINER`) `BEFORE <event>` row
/// trigger that makes `mallory` a superuser whenever a superuser writes; then `rows`,
/// written by the owner, which the trap lets pass.
fn trapped_tenant(schema: &str, event: &str, rows: &str) -> String {
    let returned = if event == "DELETE" { "OLD" } else { "NEW" };
    format!(
        "SET ROLE tenant_evil_owner;\n{table}\n\
         CREATE FUNCTION {schema}.trap() RETURNS trigger LANGUAGE plpgsql AS $trap$ \
         BEGIN \
           IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN \
             ALTER ROLE mallory SUPERUSER; \
           END IF; \
           RETURN {returned}; \
         END $trap$;\n\
         CREATE TRIGGER trap BEFORE {event} ON {schema}.outbox \
           FOR EACH ROW EXECUTE FUNCTION {schema}.trap();\n\
         {rows}RESET ROLE;\n",
        table = tenant_table(schema),
    )
}

/// The roles the traps need (`mallory`, and `tenant_evil_owner`, who may create schemas),
/// tenant_a's table, then the publication and slot: a tenant's table made after is one to
/// adopt (with no publication yet, setup would create it with the table already in).
fn roles_tenant_a_and_setup(pg: &Postgres, nats: &Nats) {
    pg.psql(
        "CREATE ROLE mallory LOGIN; CREATE ROLE tenant_evil_owner LOGIN; \
         GRANT CREATE ON DATABASE postgres TO tenant_evil_owner;",
    );
    pg.psql(&tenant_table("tenant_a"));
    setup(pg, nats, &TENANTS);
}

/// A tenant whose insert trigger is the trap, with one row.
fn evil_tenant(schema: &str) -> String {
    trapped_tenant(schema, "INSERT", &tenant_rows(schema, 0, 1))
}

/// R1: pgoutbox runs as a superuser. A tenant's table out of the publication, owned by
/// the tenant, with an insert trigger that would make `mallory` a superuser if it ever ran
/// as one, is adopted at the start and while running: its row is published once, and the
/// trigger never ran with pgoutbox's privileges.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_trigger_never_runs_as_pgoutbox() {
    let pg = Postgres::start();
    let nats = Nats::start();
    roles_tenant_a_and_setup(&pg, &nats);
    pg.psql(&evil_tenant("tenant_evil"));
    assert_eq!(pg.psql(MALLORY_IS_SUPERUSER), "f", "the owner's own insert sprang the trap");
    pg.psql(&tenant_rows("tenant_a", 0, 3));
    // Its owner is trusted to run code as pgoutbox when read: what is tested here is
    // that pgoutbox never writes the table, which would run its trigger.
    let app = Pgoutbox::run(&pg, &nats, &[&TENANTS[..], &TRUST_EVIL_OWNER].concat());
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    let stored = stored_at_least(&js, 4).await;
    assert_eq!(
        pg.psql(MALLORY_IS_SUPERUSER),
        "f",
        "adopting tenant_evil.outbox ran its trigger as a superuser; log:\n{}",
        app.log()
    );
    assert_eq!(stored.len(), 4, "{stored:?}\nlog:\n{}", app.log());
    let want = counts(&[("tenant_a", 3), ("tenant_evil", 1)]);
    assert_eq!(per_tenant(&stored), want, "log:\n{}", app.log());

    // The same tenant again, created while pgoutbox runs: adopted by the liveness check.
    pg.psql(&evil_tenant("tenant_evil2"));
    let stored = stored_at_least(&js, 5).await;
    assert_eq!(
        pg.psql(MALLORY_IS_SUPERUSER),
        "f",
        "adopting tenant_evil2.outbox ran its trigger as a superuser; log:\n{}",
        app.log()
    );
    assert_eq!(stored.len(), 5, "{stored:?}\nlog:\n{}", app.log());
    let want = counts(&[("tenant_a", 3), ("tenant_evil", 1), ("tenant_evil2", 1)]);
    assert_eq!(per_tenant(&stored), want, "log:\n{}", app.log());

    // The trap is armed: a superuser's insert does spring it (rolled back, nothing decoded).
    let sprung = pg.psql(&format!(
        "BEGIN;\n{}{};\nROLLBACK;",
        tenant_rows("tenant_evil", 1, 2),
        MALLORY_IS_SUPERUSER
    ));
    assert_eq!(sprung, "t", "the trigger is not the trap this test means");
}

/// R8: `--table '*.outbox'` also matches another session's temporary table named
/// `outbox` and an unlogged tenant's table, neither of which a publication may hold:
/// pgoutbox skips them (naming the unlogged one) over more than one liveness round, keeps
/// running, and tenant_a's rows are each stored once.
#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_temp_table_never_stops_the_tenants() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&tenant_table("tenant_a"));
    let args = ["--table", "*.outbox", "--subject-template", "tenants.{$schema}.{event_type}"];
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_rows("tenant_a", 0, 5));
    let js = jetstream(&nats.url()).await;
    stored_at_least(&js, 5).await;

    // Another session's temporary table, kept for longer than this test needs it.
    let holder =
        pg.psql_in_background("CREATE TEMP TABLE outbox (id int);\nSELECT pg_sleep(60);\n".into());
    eventually(Duration::from_secs(10), "the temporary table created", || async {
        (pg.psql(TEMP_OUTBOXES) == "1").then_some(())
    })
    .await;
    // An unlogged tenant's table: its rows are never in the WAL, it cannot be published.
    let unlogged = tenant_table("tenant_u")
        .replace("CREATE TABLE tenant_u.outbox", "CREATE UNLOGGED TABLE tenant_u.outbox");
    pg.psql(&unlogged);
    pg.psql(&tenant_rows("tenant_u", 0, 1));

    let rounds = liveness_rounds(&app.log());
    pg.psql(&tenant_rows("tenant_a", 5, 10));
    // Two more rounds begun: the first of them ran whole with both tables there.
    let deadline = Instant::now() + Duration::from_secs(45);
    while app.is_running() && liveness_rounds(&app.log()) < rounds + 2 {
        assert!(Instant::now() < deadline, "no liveness check came round; log:\n{}", app.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        app.is_running(),
        "pgoutbox stopped over a table it cannot stream; log:\n{}",
        app.log()
    );
    assert_eq!(pg.psql(TEMP_OUTBOXES), "1", "the temporary table was there all along");
    pg.psql(&tenant_rows("tenant_a", 10, 11));
    let stored = stored_at_least(&js, 11).await;
    assert!(app.is_running(), "pgoutbox stopped; log:\n{}", app.log());
    assert_eq!(stored.len(), 11, "{stored:?}\nlog:\n{}", app.log());
    assert_eq!(per_tenant(&stored), counts(&[("tenant_a", 11)]), "log:\n{}", app.log());
    assert!(
        app.log().contains("tenant_u.outbox"),
        "no warning naming the unlogged table; log:\n{}",
        app.log()
    );

    pg.psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE query LIKE '%pg_sleep(60)%' AND pid <> pg_backend_pid()",
    );
    let _ = holder.join(); // ended by the terminate: an error, as expected
}

/// The reason a dead letter gives: its header, else its body's `reason`.
fn reason_of(letter: &Stored) -> String {
    match letter.header("Pgoutbox-Dead-Letter-Reason") {
        Some(reason) => reason.to_owned(),
        None => letter.json()["reason"].as_str().unwrap_or_default().to_owned(),
    }
}

/// R6: an emitted event whose content holds `$schema` cannot choose the tenant it is
/// published as: it is a dead letter saying why, and nothing lands on tenant_b's subjects
/// but tenant_b's own row.
#[tokio::test(flavor = "multi_thread")]
async fn an_emitted_event_never_chooses_its_tenant() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&tenant_table("tenant_a"));
    pg.psql(&tenant_table("tenant_b"));
    pg.psql("CREATE ROLE someone LOGIN");
    let app = Pgoutbox::run(&pg, &nats, &[&TENANTS[..], &["--message-prefix", "outbox"]].concat());
    wait_until_streaming(&pg, &app).await;
    let event = r#"{"id":"x1","$schema":"tenant_b","aggregate_type":"order","aggregate_id":"1","event_type":"order_paid","payload":{"a":1}}"#;
    // A role with no grant at all: PUBLIC may execute pg_logical_emit_message by default.
    pg.psql(&format!(
        "SET ROLE someone;\nSELECT pg_logical_emit_message(true, 'outbox', '{event}');\n"
    ));
    let js = jetstream(&nats.url()).await;
    let stored = stored_at_least(&js, 1).await;
    let on_b: Vec<&str> = stored
        .iter()
        .map(|m| m.subject.as_str())
        .filter(|s| s.starts_with("tenants.tenant_b."))
        .collect();
    assert!(on_b.is_empty(), "the event chose tenant_b: {on_b:?}\nlog:\n{}", app.log());
    assert_eq!(stored.len(), 1, "{stored:?}\nlog:\n{}", app.log());
    assert_eq!(stored[0].subject, "outbox.dead_letter", "{stored:?}\nlog:\n{}", app.log());
    let reason = reason_of(&stored[0]);
    assert!(reason.contains("$schema"), "reason {reason:?}\nlog:\n{}", app.log());

    // tenant_b's own rows still land on its subjects.
    pg.psql(&tenant_rows("tenant_b", 0, 1));
    let stored = stored_at_least(&js, 2).await;
    assert_eq!(stored.len(), 2, "{stored:?}\nlog:\n{}", app.log());
    assert_eq!(stored[1].subject, "tenants.tenant_b.created", "log:\n{}", app.log());
    assert_eq!(stored[1].header("Pgoutbox-Table"), Some("tenant_b.outbox"), "{}", app.log());
    let on_b = stored.iter().filter(|m| m.subject.starts_with("tenants.tenant_b.")).count();
    assert_eq!(on_b, 1, "{stored:?}\nlog:\n{}", app.log());
}

/// Row `id`'s next insert (the outbox's sequence), payload `{"v": which}`, to be delivered
/// `seconds` from now.
fn scheduled(which: &str, seconds: u32) -> String {
    format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, deliver_at) \
         VALUES ('order', '{which}', 'created', '{{\"v\": \"{which}\"}}', \
         now() + interval '{seconds} seconds');\n"
    )
}

/// A message's payload `v`, if it has one.
fn value_of(message: &Stored) -> Option<String> {
    let body: serde_json::Value = serde_json::from_slice(&message.payload).ok()?;
    body["v"].as_str().map(str::to_owned)
}

/// The subject the schedule of the row with payload `which` is held on.
async fn held_subject(js: &jetstream::Context, which: &str) -> String {
    let what = format!("the row {which:?} held for its time");
    eventually(Duration::from_secs(5), &what, || async {
        let stored = read_all(js, "OUTBOX").await;
        let held = stored
            .iter()
            .find(|m| m.subject.starts_with("schedules.") && value_of(m).as_deref() == Some(which));
        held.map(|m| m.subject.clone())
    })
    .await
}

/// R2: ids reused after `TRUNCATE … RESTART IDENTITY`, past a 1 s duplicate window: the new
/// row 1's schedule is held apart from the old row 1's, and both are delivered.
#[tokio::test(flavor = "multi_thread")]
async fn a_scheduled_row_never_cancels_another() {
    let pg = Postgres::start();
    let nats = Nats::start();
    if nats.release() < (2, 12) {
        return; // message schedules need nats-server 2.12 (scheduled_rows.rs tests the refusal)
    }
    pg.psql(BIGSERIAL_OUTBOX);
    pg.psql("ALTER TABLE outbox ADD COLUMN deliver_at timestamptz;");
    let js = jetstream(&nats.url()).await;
    create_scheduled_outbox_stream(&js).await;
    let app = Pgoutbox::run(&pg, &nats, &["--schedule-column=deliver_at"]);
    wait_until_streaming(&pg, &app).await;

    pg.psql(&scheduled("first", 14));
    let first = held_subject(&js, "first").await;
    // On purpose: let the 1 s duplicate window pass, so JetStream no longer tells the
    // reused id from the old one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.psql(&format!("TRUNCATE outbox RESTART IDENTITY;\n{}", scheduled("second", 6)));
    assert_eq!(pg.psql("SELECT id FROM outbox"), "1", "the id is reused");
    let second = held_subject(&js, "second").await;

    let stored = eventually(Duration::from_secs(40), "no schedule held any more", || async {
        let stored = read_all(&js, "OUTBOX").await;
        let waiting = stored.iter().any(|m| m.subject.starts_with("schedules."));
        let delivered = stored.iter().any(|m| m.subject == "outbox.order.created");
        (!waiting && delivered).then_some(stored)
    })
    .await;
    let mut delivered: Vec<String> = stored
        .iter()
        .filter(|m| m.subject == "outbox.order.created")
        .filter_map(value_of)
        .collect();
    delivered.sort();
    assert_eq!(delivered, ["first", "second"], "{stored:?}\nlog:\n{}", app.log());
    assert_ne!(first, second, "both rows held on one subject; log:\n{}", app.log());
}

/// R3: `teardown --only-table` of a table a pattern matches is refused (the next start
/// would adopt it again and publish its whole history once more); after a restart, every
/// row is stored once and nothing is a dead letter.
#[tokio::test(flavor = "multi_thread")]
async fn a_teardown_of_a_patterns_table_never_republishes_its_history() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&tenant_table("tenant_a"));
    pg.psql(&tenant_table("tenant_b"));
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_rows("tenant_a", 0, 200));
    pg.psql(&tenant_rows("tenant_b", 0, 10));
    let js = jetstream(&nats.url()).await;
    stored_at_least(&js, 210).await;

    let mut teardown = command(&pg, &nats);
    teardown.env_remove("RUST_LOG").args(TENANTS);
    teardown.args(["teardown", "--only-table", "tenant_a.outbox", "--yes"]);
    let teardown = teardown.output().expect("teardown runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&teardown.stdout).into_owned(),
        String::from_utf8_lossy(&teardown.stderr).into_owned(),
    );
    assert!(
        !teardown.status.success(),
        "teardown dropped a table of the pattern: {stdout}{stderr}\nlog:\n{}",
        app.log()
    );
    assert!(stderr.contains("tenant_*.outbox"), "no word of the pattern: {stderr}");
    let published = "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'pgoutbox' \
                     AND schemaname = 'tenant_a' AND tablename = 'outbox'";
    assert_eq!(pg.psql(published), "1", "tenant_a.outbox left the publication");

    stop_and_wait_released(&pg, app).await;
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    // Committed last: once it is stored, anything the start published is too.
    pg.psql(&tenant_rows("tenant_b", 10, 11));
    let stored = stored_at_least(&js, 211).await;
    let letters: Vec<&Stored> =
        stored.iter().filter(|m| m.subject == "outbox.dead_letter").collect();
    assert!(letters.is_empty(), "dead letters: {letters:?}\nlog:\n{}", app.log());
    assert_eq!(stored.len(), 211, "history published again; log:\n{}", app.log());
    let want = counts(&[("tenant_a", 200), ("tenant_b", 11)]);
    assert_eq!(per_tenant(&stored), want, "log:\n{}", app.log());
}

/// `--retention` deletes published rows, and a delete runs the table's delete triggers as
/// pgoutbox: a tenant's table pgoutbox does not own is never written, not even by
/// retention, while the tables it owns are served.
#[tokio::test(flavor = "multi_thread")]
async fn retention_never_deletes_from_a_table_pgoutbox_does_not_own() {
    let pg = Postgres::start();
    let nats = Nats::start();
    roles_tenant_a_and_setup(&pg, &nats);
    let old_rows = |schema: &str, from: usize, to: usize| {
        format!(
            "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, \
             created_at) SELECT 'order', n::text, 'created', '{{}}', now() - interval '1 day' \
             FROM generate_series({from}, {to} - 1) n;\n"
        )
    };
    pg.psql(&trapped_tenant("tenant_evil", "DELETE", &old_rows("tenant_evil", 0, 5)));
    pg.psql(&old_rows("tenant_a", 0, 5));
    let args =
        [&TENANTS[..], &TRUST_EVIL_OWNER, &["--retention", "2s", "--durability-horizon", "0s"]]
            .concat();
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    stored_at_least(&js, 10).await;
    let rows_of = |schema: &str| pg.psql(&format!("SELECT count(*) FROM {schema}.outbox"));
    eventually(Duration::from_secs(30), "tenant_a's old rows deleted", || async {
        (rows_of("tenant_a") == "0").then_some(())
    })
    .await;
    // A later pass, when the tenant's adoption is long confirmed: it is servable by age.
    pg.psql(&old_rows("tenant_a", 5, 6));
    stored_at_least(&js, 11).await;
    eventually(Duration::from_secs(30), "tenant_a's newest old row deleted", || async {
        (rows_of("tenant_a") == "0").then_some(())
    })
    .await;
    assert_eq!(rows_of("tenant_evil"), "5", "a table pgoutbox does not own was written");
    assert_eq!(pg.psql(MALLORY_IS_SUPERUSER), "f", "log:\n{}", app.log());
}
