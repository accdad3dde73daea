//! Who may hand pgoutbox an event is decided by PostgreSQL's privileges (issue 28, F2 and
//! F4): a role with LOGIN only cannot forge a replayed row with `pg_logical_emit_message`,
//! even with emitted events off; a role without the grant on the replay table cannot
//! replay; a granted role's frame for another relation, of an unknown version or with a
//! bad replay id becomes a dead letter, never a message on the subject it chose; and a replay while pgoutbox is down waits for it instead
//! of writing beside it, so a restart past the duplicate window stores every row once.

use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{
    assert_once_in_order, count, create_outbox_stream, jetstream, read_all,
};
use crate::support::{Nats, Postgres, eventually, metric, numbered_rows, wait_until_streaming};

/// A replay frame (`postgres::pgoutput::replayed`, version 1) made by hand: a row of
/// relation `schema.table` (OID `rel_id`) with the outbox table's columns, on the subject
/// `outbox.forge.hacked`.
fn forged_frame(rel_id: u32, schema: &str, table: &str) -> String {
    frame(1, "forged", rel_id, schema, table)
}

/// A frame of `version`, for replay `replay_id`, as [`forged_frame`] describes.
fn frame(version: u8, replay_id: &str, rel_id: u32, schema: &str, table: &str) -> String {
    fn cstr(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }
    let mut out = vec![version, b'R'];
    cstr(&mut out, replay_id);
    out.extend_from_slice(&1u64.to_be_bytes());
    out.extend_from_slice(&1u64.to_be_bytes());
    out.extend_from_slice(&rel_id.to_be_bytes());
    cstr(&mut out, schema);
    cstr(&mut out, table);
    out.push(b'd');
    let columns = [
        ("id", 25u32, "forged-1"),
        ("aggregate_type", 25, "forge"),
        ("aggregate_id", 25, "evil"),
        ("event_type", 25, "hacked"),
        ("payload", 3802, "{\"n\": 999}"),
    ];
    out.extend_from_slice(&(columns.len() as i16).to_be_bytes());
    for (name, type_oid, _) in columns {
        out.push(0);
        cstr(&mut out, name);
        out.extend_from_slice(&type_oid.to_be_bytes());
        out.extend_from_slice(&(-1i32).to_be_bytes());
    }
    out.extend_from_slice(&(columns.len() as i16).to_be_bytes());
    for (_, _, value) in columns {
        out.push(b't');
        out.extend_from_slice(&(value.len() as i32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
    format!("'\\x{hex}'::bytea")
}

/// Waits until `n` messages are stored (the last a legit row committed after the forgery,
/// so the forgery had its chance), and answers them.
async fn stored_after_a_legit_row(
    pg: &Postgres,
    nats: &Nats,
    n: u64,
) -> Vec<crate::support::stream::Stored> {
    pg.psql(&numbered_rows(0, 1, 1));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "the legit row stored", || async {
        (count(&js, "OUTBOX").await >= n).then_some(())
    })
    .await;
    read_all(&js, "OUTBOX").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_login_only_role_cannot_forge_a_replayed_row_with_an_emitted_message() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE ROLE mallory LOGIN");
    let app = Pgoutbox::run(&pg, &nats, &["--message-prefix", ""]);
    wait_until_streaming(&pg, &app).await;
    let slot = "pgoutbox";
    let rel_id = pg.psql("SELECT 'public.outbox'::regclass::oid");
    let frame = forged_frame(rel_id.parse().unwrap_or(0), "public", "outbox");
    pg.psql(&format!(
        "SET ROLE mallory; \
         SELECT pg_logical_emit_message(true, 'pgoutbox.replay.{slot}', {frame}); \
         SELECT pg_logical_emit_message(true, 'outbox', '{{\"id\": \"x\", \"n\": 998}}')"
    ));
    let stored = stored_after_a_legit_row(&pg, &nats, 1).await;
    let subjects: Vec<&str> = stored.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(subjects, ["outbox.order.created"], "{}", app.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_role_without_the_grant_cannot_replay_and_is_told_how() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE ROLE replayer LOGIN REPLICATION; GRANT SELECT ON outbox TO replayer");
    let app = Pgoutbox::run(&pg, &nats, &["--message-prefix", "outbox"]);
    wait_until_streaming(&pg, &app).await;
    let revoke = "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message";
    assert!(app.log().contains(revoke), "run did not warn that PUBLIC may emit:\n{}", app.log());
    let stored = stored_after_a_legit_row(&pg, &nats, 1).await;
    let id = stored[0].header("Nats-Msg-Id").unwrap_or_default().to_owned();

    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_DATABASE_URL", pg.url_for("replayer", None, "postgres"));
    let output = cmd.args(["replay", "--ids", &id]).output().expect("replay runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a role without the grant replayed:\n{said}");
    let grant = "GRANT INSERT, SELECT, DELETE ON public.outbox_replay TO replayer";
    let errors: Vec<&str> = said.lines().filter(|l| l.starts_with("error: ")).collect();
    assert!(errors.len() == 1 && errors[0].contains(grant), "{said}");

    pg.psql("GRANT INSERT, SELECT, DELETE ON outbox_replay TO replayer");
    let output = cmd.output().expect("replay runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let js = jetstream(&nats.url()).await;
    assert_eq!(count(&js, "OUTBOX").await, 2, "the granted replay stored its row");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_granted_frame_for_another_relation_or_version_is_a_dead_letter_not_a_message() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE TABLE evil (LIKE outbox); CREATE ROLE replayer LOGIN");
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql("GRANT INSERT, SELECT, DELETE ON outbox_replay TO replayer");
    let evil: u32 = pg.psql("SELECT 'public.evil'::regclass::oid").parse().unwrap_or(0);
    let outbox: u32 = pg.psql("SELECT 'public.outbox'::regclass::oid").parse().unwrap_or(0);
    // Another relation; a newer format; a replay id that would misread as a row id.
    let frames = [
        forged_frame(evil, "public", "evil"),
        frame(2, "forged", outbox, "public", "outbox"),
        frame(1, "a:b", outbox, "public", "outbox"),
    ];
    for frame in &frames {
        pg.psql(&format!(
            "SET ROLE replayer; \
             INSERT INTO outbox_replay (slot, replay_id, row_index, total, frame) \
             VALUES ('pgoutbox', 'forged', 1, 1, {frame})"
        ));
    }
    let stored = stored_after_a_legit_row(&pg, &nats, 4).await;
    let subjects: Vec<&str> = stored.iter().map(|m| m.subject.as_str()).collect();
    let letter = "outbox.dead_letter";
    assert_eq!(subjects, [letter, letter, letter, "outbox.order.created"], "{}", app.log());
    let reasons: Vec<&str> = stored[..3]
        .iter()
        .map(|m| m.header("Pgoutbox-Dead-Letter-Reason").unwrap_or_default())
        .collect();
    assert!(reasons[0].contains("public.evil") && reasons[0].contains("not the outbox table"));
    assert!(reasons[1].contains("version 2"), "{reasons:?}");
    assert!(reasons[2].contains("\"a:b\""), "{reasons:?}");
    let refused = metric(app.http_port(), "pgoutbox_replayed_rows_unreadable_total ");
    assert_eq!(refused, Some(3.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_while_pgoutbox_is_down_waits_for_it_and_doubles_nothing() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    create_outbox_stream(&js, Duration::from_secs(1)).await;
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let total = 40_000;
    pg.psql(&numbered_rows(0, total, 2_000));
    let stored_at_kill = eventually(Duration::from_secs(30), "part of the rows stored", || async {
        let n = count(&js, "OUTBOX").await;
        (n > 0).then_some(n)
    })
    .await;
    app.kill9();
    assert!(stored_at_kill < total as u64, "every row was stored before the kill");
    let stored_at_kill = count(&js, "OUTBOX").await;

    // The row replayed: the sixth written.
    let id = pg.psql("SELECT id FROM outbox WHERE payload->>'n' = '5'");
    let output = command(&pg, &nats).args(["replay", "--ids", &id]).output();
    let output = output.expect("replay runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert!(said.contains("publishes them when it runs"), "{said}");
    let written = count(&js, "OUTBOX").await;
    assert_eq!(written, stored_at_kill, "the replay wrote into the stream beside pgoutbox");

    // Past the duplicate window, copies are no longer caught by Nats-Msg-Id.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let app = Pgoutbox::run(&pg, &nats, &[]);
    eventually(Duration::from_secs(90), "every row and the replayed one stored", || async {
        (count(&js, "OUTBOX").await > total as u64).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    let (again, live): (Vec<_>, Vec<_>) =
        stored.into_iter().partition(|m| m.header("Pgoutbox-Replay").is_some());
    let context = format!("killed at {stored_at_kill}\n{}", app.log());
    assert_once_in_order(&live, total, &context);
    let replayed: Vec<_> = again.iter().map(|m| m.json()["n"].clone()).collect();
    assert_eq!(replayed, [serde_json::json!(5)], "{context}");
    assert!(again[0].header("Pgoutbox-Position").is_some(), "not published by pgoutbox");
}

/// With two tables, a frame is judged against the table of its OID: a frame naming a table
/// outside the set is a dead letter of the first table, one of the second table's OID that
/// does not match it (its columns) a dead letter of the second, on its dead-letter subject.
#[tokio::test(flavor = "multi_thread")]
async fn with_two_tables_a_frame_is_judged_by_the_table_of_its_oid() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(
        "CREATE SCHEMA billing; CREATE TABLE billing.outbox (LIKE public.outbox INCLUDING ALL); \
         CREATE TABLE evil (LIKE outbox); CREATE ROLE replayer LOGIN",
    );
    let dir = tempfile::tempdir().expect("a directory for the file");
    let file = dir.path().join("pgoutbox.toml");
    std::fs::write(
        &file,
        "[[table]]\ntable = \"public.outbox\"\n\n[[table]]\ntable = \"billing.outbox\"\n\
         dead-letter-subject = \"billing.dead_letter\"\n",
    )
    .expect("write the config file");
    let config = file.to_str().expect("a UTF-8 path");
    let app = Pgoutbox::run(&pg, &nats, &["--config", config]);
    wait_until_streaming(&pg, &app).await;
    pg.psql("GRANT INSERT, SELECT, DELETE ON outbox_replay TO replayer");
    let oid = |table: &str| pg.psql(&format!("SELECT '{table}'::regclass::oid")).parse();
    let (evil, billing) = (oid("public.evil").unwrap_or(0), oid("billing.outbox").unwrap_or(0));
    for frame in [forged_frame(evil, "public", "evil"), forged_frame(billing, "billing", "outbox")]
    {
        pg.psql(&format!(
            "SET ROLE replayer; \
             INSERT INTO outbox_replay (slot, replay_id, row_index, total, frame) \
             VALUES ('pgoutbox', 'forged', 1, 1, {frame})"
        ));
    }
    let stored = stored_after_a_legit_row(&pg, &nats, 3).await;
    let got: Vec<_> =
        stored.iter().map(|m| (m.subject.as_str(), m.header("Pgoutbox-Table"))).collect();
    assert_eq!(
        got,
        [
            ("outbox.dead_letter", Some("public.outbox")),
            ("billing.dead_letter", Some("billing.outbox")),
            ("outbox.order.created", Some("public.outbox")),
        ],
        "{}",
        app.log()
    );
    let reason = |i: usize| stored[i].header("Pgoutbox-Dead-Letter-Reason").unwrap_or_default();
    let outside = "not an outbox table (public.outbox, billing.outbox)";
    assert!(reason(0).contains("public.evil") && reason(0).contains(outside), "{}", reason(0));
    assert!(reason(1).contains("not the outbox table billing.outbox"), "{}", reason(1));
}

/// A role that may create tables in `public` (PUBLIC may on PostgreSQL 14 and older) makes
/// the replay table of a configuration of patterns alone, `public.pgoutbox_replay`, before
/// setup runs: setup (a superuser here) does not add a table another role owns to the
/// publication, since its owner could hand pgoutbox any event through it, and says so in
/// one line; streaming goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_table_another_role_made_first_is_not_published() {
    use crate::cases::several_tables::tenant_table;
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&tenant_table("tenant_1"));
    pg.psql("CREATE ROLE mallory LOGIN; GRANT CREATE ON SCHEMA public TO mallory");
    pg.psql(
        "SET ROLE mallory; CREATE TABLE public.pgoutbox_replay (slot text NOT NULL, \
         replay_id text NOT NULL, row_index bigint NOT NULL, total bigint NOT NULL, \
         frame bytea NOT NULL, handed_at timestamptz NOT NULL DEFAULT now())",
    );
    let setup = command(&pg, &nats).args(["--table", "tenant_*.outbox", "setup"]).output();
    let setup = setup.expect("setup runs");
    let said = String::from_utf8_lossy(&setup.stderr);
    assert!(setup.status.success(), "{said}");
    assert!(said.contains("owned by role mallory"), "setup did not say why:\n{said}");
    let published =
        "SELECT count(*) FROM pg_publication_tables WHERE tablename = 'pgoutbox_replay'";
    assert_eq!(pg.psql(published), "0", "a table mallory owns was published:\n{said}");
}
