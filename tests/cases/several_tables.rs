//! Two outbox tables in one process, one slot, one stream: two sessions write interleaved
//! transactions (a row of A, a row of B, rows of both in one transaction), and every row
//! is stored once, in commit order, on its table's subject, naming its table. The commit
//! order is a second slot's, with test_decoding, made before the writes.

use std::collections::HashMap;
use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{Stored, count, jetstream, read_all};
use crate::support::{Lcg, Nats, Postgres, eventually, http_get, metric, wait_until_streaming};

pub(crate) const TABLES: [&str; 4] = ["--table", "public.outbox", "--table", "billing.outbox"];
const WITNESS: &str = "order_witness";

/// Two outbox tables, the second a copy of the first in another schema, and a
/// test_decoding slot that sees every insert from now on in commit order.
pub(crate) fn two_tables(pg: &Postgres) {
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(
        "CREATE SCHEMA billing; \
         CREATE TABLE billing.outbox (LIKE public.outbox INCLUDING ALL);",
    );
    pg.psql(&format!("SELECT pg_create_logical_replication_slot('{WITNESS}', 'test_decoding')"));
}

/// A row of table A (`public.outbox`, on `outbox.order.created`), of B
/// (`billing.outbox`, on `outbox.invoice.created`), or of B that cannot become a
/// message (a `.` in a subject token: a dead letter).
fn insert(table: char, session: usize, k: usize) -> String {
    let (table, aggregate) = match table {
        'A' => ("public.outbox", "order"),
        'B' => ("billing.outbox", "invoice"),
        _ => ("billing.outbox", "bad.type"),
    };
    format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('{aggregate}', '{session}-{k}', 'created', '{{\"s\": {session}, \"k\": {k}}}');\n"
    )
}

/// `transactions` transactions of one session: A, B, A then B, B then A in one, in turn
/// (shifted by `session`), every 25th of B a dead letter, `pause` seconds after each.
pub(crate) fn session(session: usize, transactions: usize, pause: f64) -> String {
    let mut sql = String::new();
    for k in 0..transactions {
        let b = if k % 25 == 24 { 'X' } else { 'B' };
        let rows: Vec<char> = match (k + session) % 4 {
            0 => vec!['A'],
            1 => vec![b],
            2 => vec!['A', b],
            _ => vec![b, 'A'],
        };
        sql.push_str("BEGIN;\n");
        for table in rows {
            sql.push_str(&insert(table, session, k));
        }
        sql.push_str("COMMIT;\n");
        if pause > 0.0 {
            sql.push_str(&format!("SELECT pg_sleep({pause});\n"));
        }
    }
    sql
}

/// Every insert into either outbox table, in commit order, as `<schema>.<table>:<id>`.
fn commit_order(pg: &Postgres) -> Vec<String> {
    let changes =
        pg.psql(&format!("SELECT data FROM pg_logical_slot_peek_changes('{WITNESS}', NULL, NULL)"));
    changes
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("table ")?;
            let (table, columns) = rest.split_once(": INSERT: ")?;
            let id = columns.strip_prefix("id[uuid]:'")?.split('\'').next()?;
            table.ends_with(".outbox").then(|| format!("{table}:{id}"))
        })
        .collect()
}

/// Every insert into either outbox table as `<schema>.<table>:<id>`, grouped by
/// transaction, transactions in commit order.
pub(crate) fn committed_transactions(pg: &Postgres) -> Vec<Vec<String>> {
    let changes =
        pg.psql(&format!("SELECT data FROM pg_logical_slot_peek_changes('{WITNESS}', NULL, NULL)"));
    let mut transactions = Vec::new();
    let mut current = Vec::new();
    for line in changes.lines() {
        if line.starts_with("COMMIT") {
            if !current.is_empty() {
                transactions.push(std::mem::take(&mut current));
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("table ") else { continue };
        let Some((table, columns)) = rest.split_once(": INSERT: ") else { continue };
        let id = columns.strip_prefix("id[uuid]:'").and_then(|c| c.split('\'').next());
        if let Some(id) = id.filter(|_| table.ends_with(".outbox")) {
            current.push(format!("{table}:{id}"));
        }
    }
    transactions
}

/// Each stored message as `<schema>.<table>:<id>` (a dead letter's row id), after checking
/// that it is on its table's subject and names its table.
pub(crate) fn stored_order(stored: &[Stored]) -> Vec<String> {
    stored
        .iter()
        .map(|message| {
            let table = message.header("Pgoutbox-Table").expect("Pgoutbox-Table on every row");
            let key = match message.subject.as_str() {
                "outbox.dead_letter" => {
                    assert_eq!(table, "billing.outbox", "only B has bad rows");
                    message.json()["id"].as_str().expect("a dead letter names its row").to_owned()
                }
                subject => {
                    let want = match table {
                        "public.outbox" => "outbox.order.created",
                        _ => "outbox.invoice.created",
                    };
                    assert_eq!(subject, want, "a row of {table} on its own subject");
                    message.header("Nats-Msg-Id").expect("an id").to_owned()
                }
            };
            assert!(key.starts_with(&format!("{table}:")), "{key} is qualified by {table}");
            key
        })
        .collect()
}

/// The stream holds exactly the witness's inserts, in its order.
async fn assert_commit_order(pg: &Postgres, nats: &Nats, app: &Pgoutbox) -> usize {
    let expected = commit_order(pg);
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), "every row of both tables stored", || async {
        (count(&js, "OUTBOX").await >= expected.len() as u64).then_some(())
    })
    .await;
    let stored = stored_order(&read_all(&js, "OUTBOX").await);
    let both = |table: &str| expected.iter().filter(|k| k.starts_with(table)).count();
    assert!(both("public.") > 100 && both("billing.") > 100, "both tables written");
    if stored != expected {
        let first = stored.iter().zip(&expected).position(|(s, e)| s != e);
        panic!(
            "{} stored, {} committed; first difference at {first:?}\nlog:\n{}",
            stored.len(),
            expected.len(),
            app.log()
        );
    }
    expected.len()
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_of_two_tables_are_stored_once_in_commit_order() {
    let pg = Postgres::start();
    let nats = Nats::start();
    two_tables(&pg);
    let app = Pgoutbox::run(&pg, &nats, &TABLES);
    wait_until_streaming(&pg, &app).await;
    let writers =
        [pg.psql_in_background(session(0, 200, 0.0)), pg.psql_in_background(session(1, 200, 0.0))];
    for writer in writers {
        writer.join().expect("writer").expect("inserts");
    }
    let rows = assert_commit_order(&pg, &nats, &app).await;
    eprintln!("{rows} rows of two tables in commit order");
    assert!(!app.log().contains("panicked"), "{}", app.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_while_two_tables_stream_loses_and_duplicates_nothing() {
    let pg = Postgres::start();
    let nats = Nats::start();
    two_tables(&pg);
    let first = Pgoutbox::run(&pg, &nats, &TABLES);
    wait_until_streaming(&pg, &first).await;
    drop(first);

    let writers = [
        pg.psql_in_background(session(0, 500, 0.02)),
        pg.psql_in_background(session(1, 500, 0.02)),
    ];
    let js = jetstream(&nats.url()).await;
    let mut random = Lcg::from_time();
    let mut kills = Vec::new();
    for _ in 0..10 {
        let mut app = Pgoutbox::run(&pg, &nats, &TABLES);
        tokio::time::sleep(Duration::from_millis(random.between(300, 1_500))).await;
        app.kill9();
        kills.push(count(&js, "OUTBOX").await);
    }
    for writer in writers {
        writer.join().expect("writer").expect("inserts");
    }
    let app = Pgoutbox::run(&pg, &nats, &TABLES);
    let rows = assert_commit_order(&pg, &nats, &app).await;
    eprintln!("{rows} rows; stored after each kill: {kills:?}");
    assert!(kills.windows(2).any(|w| w[0] < w[1]), "no kill happened mid-stream: {kills:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_id_in_two_tables_is_two_messages() {
    let pg = Postgres::start();
    let nats = Nats::start();
    two_tables(&pg);
    let app = Pgoutbox::run(&pg, &nats, &TABLES);
    wait_until_streaming(&pg, &app).await;
    let id = "00000000-0000-4000-8000-000000000001";
    for table in ["public.outbox", "billing.outbox"] {
        pg.psql(&format!(
            "INSERT INTO {table} (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('{id}', 'order', '1', 'created', '{{}}')"
        ));
    }
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "both rows stored", || async {
        (count(&js, "OUTBOX").await >= 2).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    let ids: Vec<_> =
        stored.iter().map(|m| (m.subject.as_str(), m.header("Nats-Msg-Id"))).collect();
    let public = format!("public.outbox:{id}");
    let billing = format!("billing.outbox:{id}");
    assert_eq!(
        ids,
        [
            ("outbox.order.created", Some(public.as_str())),
            ("outbox.order.created", Some(billing.as_str()))
        ],
        "{}",
        app.log()
    );
    assert!(!app.log().contains("dead-letter"), "{}", app.log());
}

/// The second table dropped from the publication while streaming: its rows are no longer
/// decoded, so pgoutbox stops within the liveness check, saying how to add it back.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_table_unpublished_while_streaming_stops_pgoutbox() {
    let pg = Postgres::start();
    let nats = Nats::start();
    two_tables(&pg);
    let mut app = Pgoutbox::run(&pg, &nats, &TABLES);
    wait_until_streaming(&pg, &app).await;
    pg.psql("ALTER PUBLICATION pgoutbox DROP TABLE billing.outbox");
    let status = app.wait_exit(Duration::from_secs(40));
    assert!(!status.success(), "exit status {status:?}; log:\n{}", app.log());
    let says = "ALTER PUBLICATION pgoutbox ADD TABLE billing.outbox";
    assert!(app.log().contains(says), "no {says:?} in:\n{}", app.log());
    let mut again = Pgoutbox::run(&pg, &nats, &TABLES);
    let status = again.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "restarted, it added the table back: {}", again.log());
    assert!(again.log().contains(says), "no {says:?} in:\n{}", again.log());
}

/// `--config`: two tables with their own subject templates and dead-letter subjects, a
/// top-level default for the second, and a flag that wins over the file's top level.
#[tokio::test(flavor = "multi_thread")]
async fn a_config_file_gives_each_table_its_own_subjects() {
    let pg = Postgres::start();
    let nats = Nats::start();
    two_tables(&pg);
    let dir = tempfile::tempdir().expect("a directory for the file");
    let file = dir.path().join("pgoutbox.toml");
    std::fs::write(
        &file,
        r#"
stream = "FROM_FILE"                           # the --stream flag below wins
dead-letter-subject = "events.dead_letter"

[[table]]
table = "public.outbox"
subject-template = "orders.{event_type}"
dead-letter-subject = "orders.dead_letter"

[[table]]
table = "billing.outbox"
subject-template = "billing.{aggregate_type}.{event_type}"
"#,
    )
    .expect("write the config file");
    let config = file.to_str().expect("a UTF-8 path");
    let app = Pgoutbox::run(&pg, &nats, &["--config", config, "--stream", "EVENTS"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!(
        "BEGIN; {}{}COMMIT; BEGIN; {}{}COMMIT;",
        insert('A', 0, 0),
        insert('B', 0, 1),
        insert('X', 0, 2),
        insert('A', 0, 3).replace("'created'", "'bad.type'"),
    ));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "four messages in EVENTS", || async {
        (count(&js, "EVENTS").await >= 4).then_some(())
    })
    .await;
    let stored = read_all(&js, "EVENTS").await;
    let got: Vec<_> =
        stored.iter().map(|m| (m.subject.as_str(), m.header("Pgoutbox-Table"))).collect();
    assert_eq!(
        got,
        [
            ("orders.created", Some("public.outbox")),
            ("billing.invoice.created", Some("billing.outbox")),
            ("events.dead_letter", Some("billing.outbox")),
            ("orders.dead_letter", Some("public.outbox")),
        ],
        "{}",
        app.log()
    );
    assert_eq!(count(&js, "FROM_FILE").await, 0, "the flag won over the file");
}

/// The per-row counters of `/metrics`, each with a `table` label.
const PER_TABLE: [&str; 4] = [
    "pgoutbox_rows_published_total",
    "pgoutbox_bytes_published_total",
    "pgoutbox_dead_letters_total",
    "pgoutbox_duplicates_total",
];

/// `name{table="<table>"}`, as `/metrics` writes the series.
fn series(name: &str, table: &str) -> String {
    format!("{name}{{table=\"{table}\"}}")
}

/// `/metrics` and `status` per table: each table's series (and, turned on, the emitted
/// messages') at 0 from the start, then 5 rows of A and 3 of B, one of them a dead letter, each counted
/// under its own table; lag and in-flight stay one, unlabelled.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_and_status_count_each_table() {
    let pg = Postgres::start();
    let nats = Nats::start();
    two_tables(&pg);
    let app = Pgoutbox::run(&pg, &nats, &[&TABLES[..], &["--message-prefix", "outbox"]].concat());
    wait_until_streaming(&pg, &app).await;
    let port = app.http_port();
    let text = eventually(Duration::from_secs(10), "/metrics answers", || async {
        http_get(port, "/metrics").filter(|(code, _)| *code == 200).map(|(_, text)| text)
    })
    .await;
    for table in ["public.outbox", "billing.outbox", "(emitted)"] {
        for name in PER_TABLE {
            let line = format!("{} 0", series(name, table));
            assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
        }
    }
    for name in PER_TABLE {
        let unlabelled = format!("{name} ");
        assert!(!text.lines().any(|l| l.starts_with(&unlabelled)), "{name} unlabelled:\n{text}");
    }
    assert!(text.lines().any(|l| l.starts_with("pgoutbox_messages_in_flight ")), "{text}");

    let mut sql: String = (0..5).map(|k| insert('A', 0, k)).collect();
    sql.push_str(&insert('B', 0, 5));
    sql.push_str(&insert('X', 0, 6));
    sql.push_str(&insert('B', 0, 7));
    pg.psql(&sql);
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "eight messages stored", || async {
        (count(&js, "OUTBOX").await >= 8).then_some(())
    })
    .await;
    let rows = |table: &str| metric(port, &series(PER_TABLE[0], table));
    eventually(Duration::from_secs(10), "/metrics counts 5 and 3", || async {
        (rows("public.outbox")? == 5.0 && rows("billing.outbox")? == 3.0).then_some(())
    })
    .await;
    let dead_letters = |table: &str| metric(port, &series(PER_TABLE[2], table));
    assert_eq!(dead_letters("public.outbox"), Some(0.0));
    assert_eq!(dead_letters("billing.outbox"), Some(1.0));
    assert_eq!(rows("(emitted)"), Some(0.0));

    let status = || {
        let mut status = crate::support::pgoutbox::command(&pg, &nats);
        status.env("PGOUTBOX_HTTP_ADDR", format!("127.0.0.1:{port}")).args(TABLES);
        status
    };
    let output = status().args(["status", "--json"]).output().expect("status runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let tables = report["tables"].as_array().unwrap_or_else(|| panic!("no tables: {report}"));
    let table = |name: &str| {
        tables.iter().find(|t| t["table"] == name).unwrap_or_else(|| panic!("{name}: {report}"))
    };
    let figures = |name: &str| {
        let t = table(name);
        (
            t["rows_published"].clone(),
            t["dead_letters"].clone(),
            t["dead_letters_in_stream"].clone(),
        )
    };
    use serde_json::json;
    // Both tables' letters go to outbox.dead_letter: the stream's count is not split.
    assert_eq!(figures("public.outbox"), (json!(5), json!(0), json!(null)), "{report}");
    assert_eq!(figures("billing.outbox"), (json!(3), json!(1), json!(null)), "{report}");
    assert_eq!(table("(emitted)")["rows_published"], 0, "{report}");
    assert_eq!(report["stream"]["dead_letters"], 1, "{report}");
    assert!(report["lag_bytes"].as_i64().is_some(), "lag is the slot's, shared: {report}");

    let output = status().arg("status").output().expect("status runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let line = |name: &str| {
        let prefix = format!("table {name} ");
        text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{name}: {text}"))
    };
    assert!(line("public.outbox").contains("rows_published=5"), "{text}");
    let billing = line("billing.outbox");
    assert!(billing.contains("rows_published=3") && billing.contains(" dead_letters=1"), "{text}");
}

/// A table with a dead-letter subject of its own has its letters in the stream counted by
/// `status`, by subject.
#[tokio::test(flavor = "multi_thread")]
async fn status_counts_a_tables_own_dead_letter_subject() {
    let pg = Postgres::start();
    let nats = Nats::start();
    two_tables(&pg);
    let dir = tempfile::tempdir().expect("a directory for the file");
    let file = dir.path().join("pgoutbox.toml");
    std::fs::write(
        &file,
        r#"
[[table]]
table = "public.outbox"
dead-letter-subject = "orders.dead_letter"

[[table]]
table = "billing.outbox"
subject-template = "billing.{aggregate_type}.{event_type}"
dead-letter-subject = "billing.dead_letter"
"#,
    )
    .expect("write the config file");
    let config = file.to_str().expect("a UTF-8 path");
    let app = Pgoutbox::run(&pg, &nats, &["--config", config]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!("{}{}{}", insert('X', 0, 0), insert('X', 0, 1), insert('A', 0, 2)));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "three messages stored", || async {
        (count(&js, "OUTBOX").await >= 3).then_some(())
    })
    .await;
    let output = crate::support::pgoutbox::command(&pg, &nats)
        .args(["--config", config, "status", "--json"])
        .output()
        .expect("status runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let in_stream: Vec<_> = report["tables"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| (t["table"].clone(), t["dead_letters_in_stream"].clone()))
        .collect();
    use serde_json::json;
    let want = [(json!("public.outbox"), json!(0)), (json!("billing.outbox"), json!(2))];
    assert_eq!(in_stream[..2], want, "{report}");
    assert_eq!(report["stream"]["dead_letters"], 2, "{report}");
}

/// The outbox table of `schema`, as sql/outbox.sql makes it, created in `schema`.
pub fn tenant_table(schema: &str) -> String {
    let table = include_str!("../../sql/outbox.sql")
        .replace("IF NOT EXISTS outbox", &format!("{schema}.outbox"));
    format!("CREATE SCHEMA {schema};\n{table}")
}

/// Rows `from..to` of `schema`'s outbox, each its own insert.
pub fn tenant_rows(schema: &str, from: usize, to: usize) -> String {
    (from..to)
        .map(|k| {
            format!(
                "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('order', '{k}', 'created', '{{\"k\": {k}}}');\n"
            )
        })
        .collect()
}

/// How many messages each tenant has in the stream, after checking that each is on its
/// tenant's subject, names its table, carries an id qualified by it, and is there once.
pub fn per_tenant(stored: &[Stored]) -> HashMap<String, usize> {
    let mut seen = std::collections::HashSet::new();
    let mut tenants = HashMap::new();
    for message in stored {
        let table = message.header("Pgoutbox-Table").expect("Pgoutbox-Table on every row");
        let schema = table.strip_suffix(".outbox").expect("a tenant's outbox");
        assert_eq!(message.subject, format!("tenants.{schema}.created"), "{table}'s subject");
        let id = message.header("Nats-Msg-Id").expect("an id");
        assert!(id.starts_with(&format!("{table}:")), "{id} is qualified by {table}");
        assert!(seen.insert(id.to_owned()), "{id} stored twice");
        *tenants.entry(schema.to_owned()).or_insert(0) += 1;
    }
    tenants
}

/// `--table 'tenant_*.outbox'`: the tables of three tenant schemas there at the start are
/// published by setup and streamed, each tenant's rows on `tenants.<schema>.…`; a fourth
/// tenant's table that lacks a column the subject needs has its rows made dead letters
/// naming the column, and the others stream on. `tenantX1.outbox` is not `tenant_*`.
#[tokio::test(flavor = "multi_thread")]
async fn tables_of_a_pattern_stream_each_on_its_tenants_subjects() {
    let pg = Postgres::start();
    let nats = Nats::start();
    for schema in ["tenant_1", "tenant_2", "tenant_3", "tenantX1"] {
        pg.psql(&tenant_table(schema));
    }
    pg.psql(
        "CREATE SCHEMA tenant_4; \
         CREATE TABLE tenant_4.outbox (id bigserial PRIMARY KEY, aggregate_type text, \
           aggregate_id text, payload jsonb NOT NULL);",
    );
    let args =
        ["--table", "tenant_*.outbox", "--subject-template", "tenants.{$schema}.{event_type}"];
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let mut sql = String::new();
    for (k, schema) in ["tenant_1", "tenant_2", "tenant_3"].iter().enumerate() {
        sql.push_str(&tenant_rows(schema, 0, 10 + k));
    }
    sql.push_str(&tenant_rows("tenantX1", 0, 5));
    sql.push_str("INSERT INTO tenant_4.outbox (aggregate_type, aggregate_id, payload) VALUES ('o', '1', '{}');\n");
    sql.push_str(&tenant_rows("tenant_1", 10, 12));
    pg.psql(&sql);
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "every tenant's rows stored", || async {
        (count(&js, "OUTBOX").await >= 36).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    let (letters, rows): (Vec<_>, Vec<_>) =
        stored.into_iter().partition(|m| m.subject == "outbox.dead_letter");
    let tenants = per_tenant(&rows);
    let want = [("tenant_1", 12), ("tenant_2", 11), ("tenant_3", 12)];
    let want = want.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect();
    assert_eq!(tenants, want, "{}", app.log());
    assert_eq!(letters.len(), 1, "{}", app.log());
    assert_eq!(letters[0].header("Pgoutbox-Table"), Some("tenant_4.outbox"));
    let reason = letters[0].header("Pgoutbox-Dead-Letter-Reason").unwrap_or_default();
    assert!(reason.contains("no column \"event_type\""), "{reason}");
    let published = pg.psql(
        "SELECT string_agg(schemaname, ',' ORDER BY schemaname) FROM pg_publication_tables \
         WHERE pubname = 'pgoutbox' AND tablename = 'outbox'",
    );
    assert_eq!(published, "tenant_1,tenant_2,tenant_3,tenant_4", "tenantX1 is not tenant_*");
}

/// `teardown --only-table billing.outbox`: only that table leaves the publication; the slot,
/// the other table and the stream stay, and pgoutbox configured with the other table alone
/// streams on from the slot.
#[tokio::test(flavor = "multi_thread")]
async fn teardown_of_one_table_drops_only_it_from_the_publication() {
    let pg = Postgres::start();
    let nats = Nats::start();
    two_tables(&pg);
    let app = Pgoutbox::run(&pg, &nats, &TABLES);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!("{}{}", insert('A', 0, 0), insert('B', 0, 1)));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "both rows stored", || async {
        (count(&js, "OUTBOX").await >= 2).then_some(())
    })
    .await;
    app.sigterm();
    drop(app);
    let active = "SELECT active FROM pg_replication_slots WHERE slot_name = 'pgoutbox'";
    eventually(Duration::from_secs(10), "slot released", || async {
        (pg.psql(active) == "f").then_some(())
    })
    .await;

    let teardown = |yes: bool| {
        let mut cmd = crate::support::pgoutbox::command(&pg, &nats);
        cmd.args(TABLES).args(["teardown", "--only-table", "billing.outbox"]);
        if yes {
            cmd.arg("--yes");
        }
        cmd.output().expect("teardown runs")
    };
    let refused = teardown(false);
    assert!(!refused.status.success(), "dropped without --yes");
    let published = "SELECT string_agg(schemaname || '.' || tablename, ',' ORDER BY tablename, \
                     schemaname) FROM pg_publication_tables WHERE pubname = 'pgoutbox' \
                     AND tablename = 'outbox'";
    assert_eq!(pg.psql(published), "billing.outbox,public.outbox", "without --yes");
    let done = teardown(true);
    let said = String::from_utf8_lossy(&done.stdout).into_owned();
    assert!(done.status.success(), "{said}{}", String::from_utf8_lossy(&done.stderr));
    assert!(said.contains("dropped billing.outbox from publication pgoutbox"), "{said}");
    assert_eq!(pg.psql(published), "public.outbox");
    assert_eq!(pg.psql(active), "f", "the slot is kept");
    assert_eq!(count(&js, "OUTBOX").await, 2, "the stream is kept");
    let again = teardown(true);
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing dropped"));

    let mut app = Pgoutbox::run(&pg, &nats, &["--table", "public.outbox"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!("{}{}", insert('A', 0, 2), insert('B', 0, 3)));
    eventually(Duration::from_secs(30), "the row of the table kept stored", || async {
        (count(&js, "OUTBOX").await >= 3).then_some(())
    })
    .await;
    assert!(app.is_running(), "{}", app.log());
}
