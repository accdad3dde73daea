//! Events without a table: `pg_logical_emit_message(true, 'outbox', '<json>')` streams like an
//! outbox row, interleaved with the rows of the same transactions in commit order, only when
//! committed; content that cannot be published goes to the dead-letter subject in its place;
//! non-transactional messages and other prefixes are never published.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{
    Nats, Postgres, eventually, http_get, stop_and_wait_released, wait_until_streaming,
};

/// Emitted events are off by default: these tests turn them on, as an operator would.
const EMITTED: [&str; 2] = ["--message-prefix", "outbox"];

fn emit(transactional: bool, prefix: &str, content: &str) -> String {
    format!("SELECT pg_logical_emit_message({transactional}, '{prefix}', '{content}');\n")
}

fn row(n: usize) -> String {
    format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'agg-{n}', 'created', '{{\"n\": {n}}}');\n"
    )
}

/// With the defaults, `setup` and `run` neither warn about emitted events nor publish one: a
/// login-only role's `pg_logical_emit_message(true, 'outbox', …)` (PUBLIC may execute it) is
/// not in the stream once a later row is, and one line names the event passed over. Before,
/// the prefix `outbox` was on by default: any login could publish through pgoutbox.
#[tokio::test(flavor = "multi_thread")]
async fn with_the_defaults_no_emitted_event_is_published_and_nothing_warns_of_them() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE ROLE mallory LOGIN");
    let setup = crate::support::pgoutbox::command(&pg, &nats)
        .env_remove("RUST_LOG")
        .arg("setup")
        .output()
        .expect("pgoutbox setup");
    let said = String::from_utf8_lossy(&setup.stderr);
    assert!(setup.status.success() && said.is_empty(), "setup said: {said}");
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let event = r#"{"id":"forged","aggregate_type":"order","aggregate_id":"x","event_type":"paid","payload":{}}"#;
    pg.psql(&format!("SET ROLE mallory;\n{}", emit(true, "outbox", event)));
    pg.psql(&row(0));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "the row stored", || async {
        (count(&js, "OUTBOX").await >= 1).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    let subjects: Vec<&str> = stored.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(subjects, ["outbox.order.created"], "{}", app.log());
    let log = app.log();
    assert!(!log.contains("pg_logical_emit_message FROM PUBLIC"), "warned of emitters:\n{log}");
    assert!(log.contains("emitted events are off by default"), "passed over silently:\n{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn emitted_messages_stream_with_rows_in_commit_order_only_when_committed() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(include_str!("../../sql/emit.sql"));
    let app = Pgoutbox::run(&pg, &nats, &EMITTED);
    wait_until_streaming(&pg, &app).await;

    let rolled_back = r#"{"id":"never","aggregate_type":"order","aggregate_id":"x","event_type":"paid","payload":{"n":-1}}"#;
    pg.psql(&format!("BEGIN;\n{}ROLLBACK;", emit(true, "outbox", rolled_back)));
    // Each transaction: a row, a raw message, another prefix (ignored), a helper's message.
    let mut script = String::new();
    for tx in 0..20 {
        let n = tx * 3;
        let message = format!(
            r#"{{"id":"m-{}","aggregate_type":"order","aggregate_id":"agg-{}","event_type":"paid","payload":{{"n": {}}},"headers":{{"retries":3}}}}"#,
            n + 1,
            n + 1,
            n + 1
        );
        script.push_str("BEGIN;\n");
        script.push_str(&row(n));
        script.push_str(&emit(true, "outbox", &message));
        script.push_str(&emit(true, "other", r#"{"id":"other","payload":{"n":-2}}"#));
        script.push_str(&format!(
            "SELECT outbox_emit('order', 'agg-{}', 'shipped', jsonb_build_object('n', {}));\n",
            n + 2,
            n + 2
        ));
        script.push_str("COMMIT;\n");
    }
    pg.psql(&script);

    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), "60 messages stored", || async {
        (count(&js, "OUTBOX").await >= 60).then_some(())
    })
    .await;
    // A last row proves nothing more is coming before it.
    pg.psql(&row(60));
    eventually(Duration::from_secs(30), "the last row stored", || async {
        (count(&js, "OUTBOX").await >= 61).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    let report = audit(&messages, 61);
    assert_eq!(report.stored, 61, "{report:?}");
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
    for (n, m) in messages.iter().enumerate().take(60) {
        match n % 3 {
            0 => assert_eq!(m.subject, "outbox.order.created"),
            1 => {
                assert_eq!(m.subject, "outbox.order.paid");
                assert_eq!(m.header("Nats-Msg-Id"), Some(format!("m-{n}").as_str()));
                assert_eq!(m.header("Outbox-Aggregate-Id"), Some(format!("agg-{n}").as_str()));
                assert_eq!(m.header("retries"), Some("3"));
            }
            _ => {
                assert_eq!(m.subject, "outbox.order.shipped");
                assert_eq!(m.header("Nats-Msg-Id").map(str::len), Some(36), "a uuid");
                assert!(m.header("Outbox-Created-At").is_some());
            }
        }
    }
    drop(app);
}

#[tokio::test(flavor = "multi_thread")]
async fn emitted_messages_that_cannot_be_published_are_dead_letters_and_non_transactional_ones_are_not_published()
 {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &EMITTED);
    wait_until_streaming(&pg, &app).await;

    let good = r#"{"id":"good","aggregate_type":"order","aggregate_id":"1","event_type":"paid","payload":{"n":2}}"#;
    let non_transactional = r#"{"id":"nt","aggregate_type":"order","aggregate_id":"1","event_type":"paid","payload":{"n":-1}}"#;
    pg.psql(&format!(
        "BEGIN;\n{}{}{}{}ROLLBACK;\nBEGIN;\n{}{}{}COMMIT;",
        row(0),
        emit(false, "outbox", non_transactional),
        emit(true, "outbox", good),
        row(1),
        row(0),
        emit(true, "outbox", "not json at all"),
        emit(true, "outbox", good),
    ));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "3 messages stored", || async {
        (count(&js, "OUTBOX").await >= 3).then_some(())
    })
    .await;
    pg.psql(&row(3));
    eventually(Duration::from_secs(30), "the last row stored", || async {
        (count(&js, "OUTBOX").await >= 4).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    let subjects: Vec<&str> = messages.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(
        subjects,
        ["outbox.order.created", "outbox.dead_letter", "outbox.order.paid", "outbox.order.created"]
    );
    let letter = messages[1].json();
    assert_eq!(letter["row"]["payload"], "not json at all", "{letter}");
    assert!(letter["reason"].as_str().is_some_and(|r| r.contains("not a JSON object")), "{letter}");
    assert_eq!(messages[2].header("Nats-Msg-Id"), Some("good"));
    assert_eq!(messages[2].json(), serde_json::json!({ "n": 2 }));

    assert!(app.log().contains("non-transactional message not published"), "{}", app.log());
    let (_, metrics) = http_get(app.http_port(), "/metrics").expect("metrics");
    assert!(
        metrics.lines().any(|l| l == "pgoutbox_non_transactional_messages_total 1"),
        "{metrics}"
    );
    drop(app);
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_only_needs_no_outbox_table() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql("CREATE TABLE orders (id int)");
    let app = Pgoutbox::run(&pg, &nats, &[&EMITTED[..], &["--messages-only"]].concat());
    wait_until_streaming(&pg, &app).await;

    let mut script = String::new();
    for n in 0..10 {
        let message = format!(
            r#"{{"id":"e-{n}","aggregate_type":"order","aggregate_id":"{n}","event_type":"paid","payload":{{"n":{n}}}}}"#
        );
        script.push_str(&format!(
            "BEGIN;\nINSERT INTO orders VALUES ({n});\n{}COMMIT;\n",
            emit(true, "outbox", &message)
        ));
    }
    pg.psql(&script);
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "10 messages stored", || async {
        (count(&js, "OUTBOX").await >= 10).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    let report = audit(&messages, 10);
    assert_eq!((report.stored, report.duplicates, report.order_violations), (10, 0, 0));
    assert!(messages.iter().all(|m| m.subject == "outbox.order.paid"));
    assert_eq!(pg.psql("SELECT count(*) FROM pg_publication_tables"), "0");
    drop(app);

    // Without the flag, the missing table says how to do without it.
    let mut cmd = crate::support::pgoutbox::command(&pg, &nats);
    cmd.env_remove("RUST_LOG").args(["setup", "--slot", "other"]);
    let output = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--messages-only"), "{stderr}");
}

/// Issue 45, item 2: an emitted event names no table row, whatever its id says. Before, a
/// recovery read an emitted `dead-letter:<id>` as the dead letter of row `<id>` (a message
/// without `Pgoutbox-Table` counted as the first table's), and an emitted copy of a row's
/// id and payload as the row itself: both rows were skipped, lost. Now both are read from
/// the table; the copy's id is still in JetStream's duplicate window, so that row is a dead
/// letter saying so, with its payload: seen, not lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_recovery_never_takes_an_emitted_event_for_a_table_row() {
    let pg = Postgres::builder().conf("track_commit_timestamp = on").start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &EMITTED);
    wait_until_streaming(&pg, &app).await;
    let (letter_row, copied_row) =
        ("00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b");
    let forged = |id: &str, n: u32| {
        format!(
            r#"{{"id":"{id}","aggregate_type":"order","aggregate_id":"x","event_type":"created","payload":{{"n": {n}}}}}"#
        )
    };
    pg.psql(&format!(
        "{}{}{}",
        row(0),
        emit(true, "outbox", &forged(&format!("dead-letter:{letter_row}"), 1)),
        emit(true, "outbox", &forged(copied_row, 2)),
    ));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "the row and two emitted events stored", || async {
        (count(&js, "OUTBOX").await >= 3).then_some(())
    })
    .await;
    let emitted = read_all(&js, "OUTBOX").await;
    assert_eq!(emitted[1].header("Pgoutbox-Emitted"), Some("outbox"), "{:?}", emitted[1]);
    assert_eq!(emitted[1].header("Pgoutbox-Table"), None);
    assert_eq!(emitted[0].header("Pgoutbox-Emitted"), None, "a table's row");
    stop_and_wait_released(&pg, app).await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql(&format!(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES \
         ('{letter_row}', 'order', 'x', 'created', '{{\"n\": 1}}'), \
         ('{copied_row}', 'order', 'x', 'created', '{{\"n\": 2}}');"
    ));
    let app = Pgoutbox::run(&pg, &nats, &[&EMITTED[..], &["--recover"]].concat());
    wait_until_streaming(&pg, &app).await;
    let what = format!("both rows recovered from the table\n{}", app.log());
    eventually(Duration::from_secs(30), &what, || async {
        let stored = read_all(&js, "OUTBOX").await;
        let seeded = |id: &str| {
            stored.iter().any(|m| {
                let letter = m.subject == "outbox.dead_letter" && m.json()["row"]["id"] == id;
                m.header("Pgoutbox-Seed").is_some()
                    && (m.header("Nats-Msg-Id") == Some(id) || letter)
            })
        };
        (seeded(letter_row) && seeded(copied_row)).then_some(())
    })
    .await;
    drop(app);
}
