//! Rows that cannot become a correct message go to the dead-letter subject with the reason
//! and the original row, are counted in `status` and the log, and never block the rows
//! behind them. If even the dead letter cannot be written, pgoutbox stops and says why.

mod support;

use std::time::Duration;

use support::pgoutbox::{Pgoutbox, command};
use support::stream::{count, jetstream, read_all};
use support::{Nats, Postgres, eventually, wait_until_streaming};

/// A nats-server whose max_payload is 8 KiB.
fn small_payload_nats() -> (Nats, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("conf dir");
    let conf = dir.path().join("nats.conf");
    std::fs::write(&conf, "max_payload: 8192\n").expect("write nats.conf");
    let nats = Nats::start_with_args(&["-c", conf.to_str().expect("utf-8 path")]);
    (nats, dir)
}

/// An outbox without NOT NULL constraints, so that NULLs can reach pgoutbox.
const LOOSE_OUTBOX: &str = "CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), \
    aggregate_type text, aggregate_id text, event_type text, payload jsonb, headers jsonb, \
    created_at timestamptz DEFAULT now())";

fn insert(
    pg: &Postgres,
    n: usize,
    aggregate_type: &str,
    event_type: &str,
    payload: &str,
    headers: &str,
) {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ({aggregate_type}, '{n}', {event_type}, {payload}, {headers})"
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_rows_become_dead_letters_and_never_block() {
    let pg = Postgres::start();
    let (nats, _conf) = small_payload_nats();
    pg.psql(LOOSE_OUTBOX);
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    let big = "jsonb_build_object('n', 1, 'pad', repeat('x', 20000))";
    insert(&pg, 0, "'order'", "'created'", "'{\"n\": 0}'", "NULL");
    insert(&pg, 1, "'order'", "'created'", big, "NULL");
    insert(&pg, 2, "'has space'", "'created'", "'{\"n\": 2}'", "NULL");
    insert(&pg, 3, "'order'", "'a.b'", "'{\"n\": 3}'", "NULL");
    insert(&pg, 4, "NULL", "'created'", "'{\"n\": 4}'", "NULL");
    insert(&pg, 5, "'order'", "'created'", "'{\"n\": 5}'", "'[1, 2]'");
    insert(&pg, 6, "'order'", "'created'", "'{\"n\": 6}'", "'{\"a\": 1}'");
    insert(&pg, 7, "'order'", "'created'", "'{\"n\": 7}'", "'{\"Trace\": \"t\"}'");

    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "8 messages stored", || async {
        (count(&js, "OUTBOX").await >= 8).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    assert_eq!(messages.len(), 8);
    let subjects: Vec<&str> = messages.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(subjects[0], "outbox.order.created");
    assert!(subjects[1..7].iter().all(|s| *s == "outbox.dead_letter"), "{subjects:?}");
    assert_eq!(subjects[7], "outbox.order.created", "the row behind the poison was blocked");
    let reasons = ["max_payload", "whitespace", "`.`", "is NULL", "JSON object", "JSON object"];
    for (m, reason) in messages[1..7].iter().zip(reasons) {
        let header = m.header("Pgoutbox-Dead-Letter-Reason").expect("reason header");
        assert!(header.contains(reason), "{header:?} does not mention {reason:?}");
        let body = m.json();
        assert!(body["reason"].as_str().is_some_and(|r| r.contains(reason)), "{body}");
        assert_eq!(body["table"], "public.outbox");
        assert!(body["row"]["id"].as_str().is_some(), "the original row is missing: {body}");
        assert!(m.header("Nats-Msg-Id").is_some_and(|id| id.starts_with("dead-letter:")));
    }
    assert_eq!(messages[3].json()["row"]["event_type"], "a.b");
    assert_eq!(
        messages[1].json()["row"]["payload"],
        serde_json::Value::Null,
        "oversized payload is left out"
    );
    assert_eq!(messages[1].json()["row"]["aggregate_id"], "1");
    assert_eq!(app.log().matches("row sent to the dead-letter subject").count(), 6);

    let mut status = command(&pg, &nats);
    status.args(["status", "--json"]);
    let output = status.output().expect("status runs");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["stream"]["dead_letters"], 6, "{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unwritable_dead_letter_stops_pgoutbox_with_the_reason() {
    let pg = Postgres::start();
    let (nats, _conf) = small_payload_nats();
    pg.psql(LOOSE_OUTBOX);
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    // Too big as a message (in a header) and too big as a dead letter (in the row).
    insert(&pg, 0, "'order'", "'created'", "'{}'", "NULL");
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', repeat('y', 20000), 'created', '{}')",
    );
    let status = app.wait_exit(Duration::from_secs(30));
    assert!(!status.success());
    let log = app.log();
    assert!(log.contains("neither could its dead letter"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}
