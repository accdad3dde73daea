//! `pgoutbox replay`: chosen rows of the outbox table published again. Killed at a random
//! moment and resumed with its id, a replay stores every row once, in order, both into a
//! stream of its own and through the pgoutbox streaming into the live stream (among the
//! live rows, shown in `status`); a dead letter fixed in the table goes out again on its own
//! subject.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{assert_once_in_order, count, jetstream, read_all};
use crate::support::{
    Lcg, Nats, Postgres, eventually, metric, numbered_rows, wait_until_streaming,
};

/// `pgoutbox replay <args>` into a stream of its own, `REPLAY`.
fn replay(pg: &Postgres, nats: &Nats, args: &[&str]) -> Pgoutbox {
    let mut cmd = command(pg, nats);
    cmd.args(["--stream", "REPLAY", "--subject-template", "replay.{aggregate_type}.{event_type}"])
        .args(["--dead-letter-subject", "replay.dead_letter", "replay"])
        .args(args);
    Pgoutbox::spawn(cmd)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_killed_at_a_random_moment_resumes_and_stores_each_row_once() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(&numbered_rows(0, 100_000, 5_000));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let id = format!("r{now}");
    let args = ["--created-from", "-infinity", "--replay-id", id.as_str()];
    let mut first = replay(&pg, &nats, &args);
    let js = jetstream(&nats.url()).await;
    // status, pointed at the replay's stream, shows it running.
    let replay_status = || {
        let output = command(&pg, &nats).args(["--stream", "REPLAY", "status", "--json"]).output();
        let report: serde_json::Value =
            serde_json::from_slice(&output.expect("status runs").stdout).unwrap_or_default();
        report["replay"].clone()
    };
    let running = eventually(Duration::from_secs(60), "status shows the replay", || async {
        let replay = replay_status();
        (replay["state"] == "running").then_some(replay)
    })
    .await;
    assert_eq!(running["rows"], 100_000, "{running}");
    assert!(running["rows_left"].as_u64().unwrap_or(0) > 0, "{running}");
    let kill_at = Lcg::from_time().between(1_000, 60_000);
    eventually(Duration::from_secs(60), "part of the replay stored", || async {
        (count(&js, "REPLAY").await >= kill_at).then_some(())
    })
    .await;
    first.kill9();
    let stored_when_killed = count(&js, "REPLAY").await;
    assert!(stored_when_killed < 100_000, "killed too late:\n{}", first.log());

    let mut resumed = replay(&pg, &nats, &args);
    let status = resumed.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "{}", resumed.log());
    assert!(resumed.log().contains("stored by this replay before"), "{}", resumed.log());
    let finished = replay_status();
    assert_eq!((&finished["state"], &finished["rows_left"]), (&"finished".into(), &0.into()));
    let context = format!("killed at {stored_when_killed}");
    assert_once_in_order(&read_all(&js, "REPLAY").await, 100_000, &context);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_fixed_in_the_table_is_replayed_through_the_live_pgoutbox() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 5, 5));
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('bad type', '5', 'created', '{\"n\": 5}')",
    );
    pg.psql(&numbered_rows(6, 10, 4));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "9 rows and a dead letter stored", || async {
        (count(&js, "OUTBOX").await == 10).then_some(())
    })
    .await;

    pg.psql("UPDATE outbox SET aggregate_type = 'order' WHERE aggregate_type = 'bad type'");
    let dry = command(&pg, &nats).args(["replay", "--dead-letters", "--dry-run"]).output();
    let dry = dry.expect("replay runs");
    assert!(String::from_utf8_lossy(&dry.stdout).contains("would publish up to 1 rows"));
    assert_eq!(count(&js, "OUTBOX").await, 10, "a dry run stored something");
    // pgoutbox keeps running: the replay hands the row to it.
    let fixed = command(&pg, &nats).args(["replay", "--dead-letters"]).output();
    let fixed = fixed.expect("replay runs");
    let said = String::from_utf8_lossy(&fixed.stderr);
    assert!(fixed.status.success(), "{said}");
    assert!(said.contains("handed to the pgoutbox"), "{said}");
    assert!(String::from_utf8_lossy(&fixed.stdout).contains(": 1 stored"), "{fixed:?}");
    assert_eq!(count(&js, "OUTBOX").await, 11, "the replay ended before its row was stored");

    pg.psql(&numbered_rows(10, 20, 5));
    eventually(Duration::from_secs(30), "the new rows stored", || async {
        (count(&js, "OUTBOX").await == 21).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    let fixed: Vec<_> = stored.iter().filter(|m| m.subject == "outbox.order.created").collect();
    let fives: Vec<_> = fixed.iter().filter(|m| m.json()["n"] == 5).collect();
    assert_eq!(fives.len(), 1, "the fixed row once on its subject");
    assert!(fives[0].header("Pgoutbox-Replay").is_some());
    assert!(fives[0].header("Pgoutbox-Position").is_some(), "not published by pgoutbox");
    let order: Vec<u64> = fixed.iter().filter_map(|m| m.json()["n"].as_u64()).collect();
    let expected: Vec<u64> = (0..5).chain(6..10).chain([5]).chain(10..20).collect();
    assert_eq!(order, expected, "the fixed row goes out where the replay ran, in commit order");
    assert_eq!(metric(app.http_port(), "pgoutbox_replay_rows_done "), Some(1.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_into_the_live_stream_survives_kill9_of_itself_and_of_pgoutbox() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let replayed = 20_000;
    pg.psql(&numbered_rows(0, replayed, 5_000));
    eventually(Duration::from_secs(60), "the rows to replay stored", || async {
        (count(&js, "OUTBOX").await == replayed as u64).then_some(())
    })
    .await;
    // The rows so far, still in the stream's duplicate window, are replayed while a writer
    // commits more, numbered on: a replayed row is a message of its own.
    let created_to = pg.psql("SELECT clock_timestamp()");
    let writer = pg.start_writer(replayed, 0.005);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let id = format!("r{now}");
    let selection = ["--created-from", "-infinity", "--created-to", created_to.as_str()];
    let run = |extra: &[&str]| {
        let mut cmd = command(&pg, &nats);
        cmd.arg("replay").args(selection).args(["--replay-id", id.as_str()]).args(extra);
        Pgoutbox::spawn(cmd)
    };
    let mut first = run(&["--rate", "3000"]);
    // status shows it in progress: rows done, rows left, the pace.
    let status = |port: u16| {
        let http_addr = format!("127.0.0.1:{port}");
        let mut cmd = command(&pg, &nats);
        let output = cmd.args(["status", "--json", "--http-addr", &http_addr]).output();
        let output = output.expect("status runs");
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap_or_default()
    };
    let kill_at = Lcg::from_time().between(2_000, 12_000);
    let port = app.http_port();
    let shown =
        eventually(Duration::from_secs(60), "status shows the replay under way", || async {
            let report = status(port);
            let process = &report["pgoutbox"];
            let done = process["replay_rows_done"].as_u64().unwrap_or(0);
            (done >= kill_at && process["replay_rows_per_second"].as_u64().unwrap_or(0) > 0)
                .then(|| process.clone())
        })
        .await;
    first.kill9();
    assert!(shown["replay_rows_left"].as_u64().unwrap_or(0) > 0, "{shown}\n{}", first.log());

    // pgoutbox itself is killed while the resumed replay hands rows over, and started again.
    let mut resumed = run(&["--rate", "5000"]);
    let port = app.http_port();
    eventually(Duration::from_secs(60), "the resumed replay under way", || async {
        let done = metric(port, "pgoutbox_replay_rows_done ").unwrap_or(0.0) as u64;
        (done >= kill_at + 2_000).then_some(())
    })
    .await;
    assert!(resumed.is_running(), "the replay ended before pgoutbox was killed");
    app.kill9();
    let app = Pgoutbox::run(&pg, &nats, &[]);
    let status = resumed.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "{}", resumed.log());
    let written = writer.finish();
    eventually(Duration::from_secs(60), "every row stored", || async {
        (count(&js, "OUTBOX").await >= (written + replayed) as u64).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    let (again, live): (Vec<_>, Vec<_>) =
        stored.into_iter().partition(|m| m.header("Pgoutbox-Replay").is_some());
    let context = format!("killed at {kill_at} rows done\n{}", resumed.log());
    assert_once_in_order(&live, written, &context);
    assert_once_in_order(&again, replayed, &context);
    assert!(again.iter().all(|m| m.header("Pgoutbox-Position").is_some()), "not via pgoutbox");
    // `replay:<replay id>/<index in the selection>:<row id>`
    let msg_id = again[7].header("Nats-Msg-Id").unwrap_or_default();
    let row_id = live[7].header("Nats-Msg-Id").unwrap_or("?");
    assert_eq!(msg_id, format!("replay:{id}/8:{row_id}"));
    let port = app.http_port();
    assert_eq!(metric(port, "pgoutbox_replay_rows_done "), metric(port, "pgoutbox_replay_rows "));
    assert_eq!(metric(port, "pgoutbox_replay_rows_left "), Some(0.0));
}

/// Two outbox tables streamed by one pgoutbox: a replay of the second table's rows
/// (`--from-table`, needed with several), handed over while both tables are written, stores
/// every selected row once, in the replay's order, on the second table's subject and naming
/// it in `Pgoutbox-Table`; the live rows of both tables are stored once each. Its dead
/// letters are replayed by the same flag: only that table's, on the shared subject.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_of_one_of_two_tables_goes_out_once_on_its_subject() {
    const TABLES: [&str; 4] = ["--table", "public.outbox", "--table", "billing.outbox"];
    const REPLAYED: usize = 2_000;
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(
        "CREATE SCHEMA billing; CREATE TABLE billing.outbox (LIKE public.outbox INCLUDING ALL)",
    );
    let app = Pgoutbox::run(&pg, &nats, &TABLES);
    wait_until_streaming(&pg, &app).await;
    let rows = |table: &str, aggregate: &str, from: usize, to: usize| {
        format!(
            "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) \
             SELECT '{aggregate}', g::text, 'created', jsonb_build_object('n', g) \
             FROM generate_series({from}, {} ) g;\n",
            to - 1
        )
    };
    pg.psql(&rows("billing.outbox", "invoice", 0, REPLAYED));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "the rows to replay stored", || async {
        (count(&js, "OUTBOX").await == REPLAYED as u64).then_some(())
    })
    .await;
    let created_to = pg.psql("SELECT clock_timestamp()");

    let refused = command(&pg, &nats).args(TABLES).args(["replay", "--ids", "1"]).output();
    let refused = refused.expect("replay runs");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("--from-table names one of: public.outbox, billing.outbox"), "{said}");
    let unknown = command(&pg, &nats)
        .args(TABLES)
        .args(["replay", "--from-table", "sales.outbox", "--ids", "1"])
        .output()
        .expect("replay runs");
    let said = String::from_utf8_lossy(&unknown.stderr);
    assert!(!unknown.status.success() && said.contains("not a configured table"), "{said}");

    // Both tables written while the replay hands its rows over.
    let mut writes = String::new();
    for k in 0..300 {
        writes.push_str("BEGIN;\n");
        writes.push_str(&rows("public.outbox", "order", 10_000 + k, 10_001 + k));
        writes.push_str(&rows("billing.outbox", "invoice", 10_000 + k, 10_001 + k));
        writes.push_str("COMMIT;\nSELECT pg_sleep(0.005);\n");
    }
    let writer = pg.psql_in_background(writes);
    let replay = command(&pg, &nats)
        .args(TABLES)
        .args(["replay", "--from-table", "billing.outbox", "--created-from", "-infinity"])
        .args(["--created-to", created_to.as_str(), "--rate", "2000"])
        .output()
        .expect("replay runs");
    assert!(replay.status.success(), "{}", String::from_utf8_lossy(&replay.stderr));
    writer.join().expect("writer").expect("inserts");
    let total = (REPLAYED * 2 + 600) as u64;
    eventually(Duration::from_secs(60), "every row stored", || async {
        (count(&js, "OUTBOX").await >= total).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(stored.len() as u64, total, "{}", app.log());
    let (again, live): (Vec<_>, Vec<_>) =
        stored.iter().partition(|m| m.header("Pgoutbox-Replay").is_some());
    assert_eq!(again.len(), REPLAYED);
    let mut indexes = Vec::new();
    let mut replayed_rows = std::collections::HashSet::new();
    for message in &again {
        assert_eq!(message.subject, "outbox.invoice.created", "on B's subject");
        assert_eq!(message.header("Pgoutbox-Table"), Some("billing.outbox"));
        assert!(message.header("Pgoutbox-Position").is_some(), "published by pgoutbox");
        let id = message.header("Nats-Msg-Id").unwrap_or_default();
        let (index, row) = id
            .strip_prefix("replay:")
            .and_then(|rest| rest.split_once('/'))
            .and_then(|(_, rest)| rest.split_once(':'))
            .unwrap_or_else(|| panic!("a replayed row's id: {id}"));
        indexes.push(index.parse::<usize>().unwrap_or(0));
        assert!(row.starts_with("billing.outbox:"), "{id}");
        replayed_rows.insert(row.to_owned());
    }
    assert_eq!(indexes, (1..=REPLAYED).collect::<Vec<_>>(), "once each, in the replay's order");
    let first_rows: std::collections::HashSet<String> = live[..REPLAYED]
        .iter()
        .map(|m| m.header("Nats-Msg-Id").unwrap_or_default().to_owned())
        .collect();
    assert_eq!(replayed_rows, first_rows, "every selected row of B, and only those");
    let live_ids: std::collections::HashSet<_> =
        live.iter().map(|m| m.header("Nats-Msg-Id").unwrap_or_default()).collect();
    assert_eq!(live_ids.len(), live.len(), "each live row once");

    // A bad row in each table; B's fixed and replayed from the shared dead-letter subject.
    let bad = |table: &str| {
        format!(
            "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('bad type', 'x', 'created', '{{\"n\": -1}}');"
        )
    };
    pg.psql(&format!("{}{}", bad("public.outbox"), bad("billing.outbox")));
    eventually(Duration::from_secs(30), "two dead letters", || async {
        (count(&js, "OUTBOX").await == total + 2).then_some(())
    })
    .await;
    pg.psql("UPDATE billing.outbox SET aggregate_type = 'invoice' WHERE aggregate_id = 'x'");
    let fixed = command(&pg, &nats)
        .args(TABLES)
        .args(["replay", "--from-table", "billing.outbox", "--dead-letters"])
        .output()
        .expect("replay runs");
    let said = String::from_utf8_lossy(&fixed.stderr);
    assert!(fixed.status.success(), "{said}");
    assert!(said.contains("1 rows selected"), "{said}");
    let stored = read_all(&js, "OUTBOX").await;
    let last = stored.last().expect("the fixed row");
    assert_eq!(stored.len() as u64, total + 3);
    assert_eq!(last.subject, "outbox.invoice.created");
    assert_eq!(last.json()["n"], -1);
    assert_eq!(last.header("Pgoutbox-Table"), Some("billing.outbox"));
}

/// `--table 'tenant_*.outbox'` (patterns alone): a replay names one tenant's table
/// (`--from-table`, needed with a pattern) and hands its rows over through the replay table
/// of such a configuration, `public.pgoutbox_replay`: that tenant's rows are stored again
/// once each, on its subject and naming its table, published by the running pgoutbox; the
/// other tenant's are not. A table the pattern matches but not in the publication is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_of_one_tenants_table_goes_out_once_on_its_subject() {
    use crate::cases::several_tables::{tenant_rows, tenant_table};
    const TENANTS: [&str; 4] =
        ["--table", "tenant_*.outbox", "--subject-template", "tenants.{$schema}.{event_type}"];
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(&(tenant_table("tenant_1") + &tenant_table("tenant_2")));
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&(tenant_rows("tenant_1", 0, 20) + &tenant_rows("tenant_2", 0, 30)));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "both tenants' rows stored", || async {
        (count(&js, "OUTBOX").await == 50).then_some(())
    })
    .await;
    let replay = |args: &[&str]| {
        let output = command(&pg, &nats).args(TENANTS).arg("replay").args(args).output();
        let output = output.expect("replay runs");
        (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (ok, said) = replay(&["--ids", "1"]);
    assert!(!ok && said.contains("--from-table <schema.table> names the one"), "{said}");
    let (ok, said) = replay(&["--from-table", "other.outbox", "--ids", "1"]);
    assert!(!ok && said.contains("matched by no configured pattern"), "{said}");
    // Matched by the pattern, not in the publication (here: no such table).
    let (ok, said) = replay(&["--from-table", "tenant_9.outbox", "--ids", "1"]);
    assert!(!ok && said.contains("is not in publication pgoutbox"), "{said}");

    let (ok, said) = replay(&["--from-table", "tenant_2.outbox", "--created-from", "-infinity"]);
    assert!(ok, "{said}");
    eventually(Duration::from_secs(30), "tenant_2's rows stored again", || async {
        (count(&js, "OUTBOX").await >= 80).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(stored.len(), 80, "{}", app.log());
    let again: Vec<_> = stored.iter().filter(|m| m.header("Pgoutbox-Replay").is_some()).collect();
    assert_eq!(again.len(), 30, "{}", app.log());
    for message in &again {
        assert_eq!(message.subject, "tenants.tenant_2.created", "on tenant_2's subject");
        assert_eq!(message.header("Pgoutbox-Table"), Some("tenant_2.outbox"));
        assert!(message.header("Pgoutbox-Position").is_some(), "published by pgoutbox");
    }
    let replay_table = "SELECT to_regclass('public.pgoutbox_replay') IS NOT NULL";
    assert_eq!(pg.psql(replay_table), "t", "the replay table of patterns alone");
}

/// `--replay-table`: where setup may not write in the outbox table's schema, the operator
/// chooses where a replay hands its rows over; setup makes and publishes that table
/// instead of the default one, and a replay through the running pgoutbox goes through it.
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_goes_through_the_replay_table_the_operator_chose() {
    const CHOSEN: [&str; 2] = ["--replay-table", "ops.handover"];
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE SCHEMA ops");
    let app = Pgoutbox::run(&pg, &nats, &CHOSEN);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 20, 20));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "the rows stored", || async {
        (count(&js, "OUTBOX").await == 20).then_some(())
    })
    .await;
    let published = "SELECT string_agg(schemaname || '.' || tablename, ',' ORDER BY tablename) \
                     FROM pg_publication_tables WHERE pubname = 'pgoutbox'";
    assert_eq!(pg.psql(published), "ops.handover,public.outbox");
    let default_made = "SELECT to_regclass('public.outbox_replay') IS NOT NULL";
    assert_eq!(pg.psql(default_made), "f", "the default replay table is not made");

    let output = command(&pg, &nats)
        .args(CHOSEN)
        .args(["replay", "--created-from", "-infinity"])
        .output()
        .expect("replay runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    eventually(Duration::from_secs(30), "the rows stored again", || async {
        (count(&js, "OUTBOX").await >= 40).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(stored.len(), 40, "{}", app.log());
    let again: Vec<_> = stored.iter().filter(|m| m.header("Pgoutbox-Replay").is_some()).collect();
    assert_eq!(again.len(), 20, "{}", app.log());
    for message in &again {
        assert!(message.header("Pgoutbox-Position").is_some(), "published by the running pgoutbox");
    }
}
