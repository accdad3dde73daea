//! Rows that cannot become a correct message go to the dead-letter subject with the reason
//! and the original row, are counted in `status` and the log, and never block the rows
//! behind them. A dead letter is built to fit what the server and the stream accept, so
//! hostile bytes (line breaks in an id, payloads that grow when escaped, rows a stream's
//! `max_msg_size` refuses) cannot stop the stream either.

use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::Stored;
use crate::support::stream::{count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, wait_until_streaming};

/// A nats-server whose max_payload is 8 KiB.
pub(crate) fn small_payload_nats() -> (Nats, tempfile::TempDir) {
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
    insert(&pg, 6, "'order'", "'created'", "'{\"n\": 6}'", "'{\"a\": \"x\\ny\"}'");
    let headers = r#"'{"Trace": "t", "retries": 3, "urgent": true, "gone": null}'"#;
    insert(&pg, 7, "'order'", "'created'", "'{\"n\": 7}'", headers);

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
    let reasons = ["max_payload", "whitespace", "`.`", "is NULL", "JSON object", "line break"];
    for (m, reason) in messages[1..7].iter().zip(reasons) {
        let header = m.header("Pgoutbox-Dead-Letter-Reason").expect("reason header");
        assert!(header.contains(reason), "{header:?} does not mention {reason:?}");
        let body = m.json();
        assert!(body["reason"].as_str().is_some_and(|r| r.contains(reason)), "{body}");
        assert_eq!(body["table"], "public.outbox");
        assert!(body["row"]["id"].as_str().is_some(), "the original row is missing: {body}");
        assert!(m.header("Nats-Msg-Id").is_some_and(|id| id.starts_with("dead-letter:")));
    }
    // Header values that are not strings arrive as their JSON text; null leaves one out.
    assert_eq!(messages[7].header("Trace"), Some("t"));
    assert_eq!(messages[7].header("retries"), Some("3"));
    assert_eq!(messages[7].header("urgent"), Some("true"));
    assert_eq!(messages[7].header("gone"), None);
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

/// A subject over nats-server's control line (4 KiB) would be refused with `-ERR` and the
/// connection closed on every try: it becomes a dead letter, and the rows behind it flow.
#[tokio::test(flavor = "multi_thread")]
async fn a_subject_longer_than_the_control_line_becomes_a_dead_letter() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(LOOSE_OUTBOX);
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    insert(&pg, 0, "repeat('t', 4100)", "'created'", "'{\"n\": 0}'", "NULL");
    for n in 1..=100 {
        insert(&pg, n, "'order'", "'created'", &format!("'{{\"n\": {n}}}'"), "NULL");
    }
    let messages = stored(&nats, 101, &app).await;
    assert_dead_letter(&messages[0], "control line", false);
    let numbers: Vec<u64> = messages[1..].iter().filter_map(|m| m.json()["n"].as_u64()).collect();
    assert_eq!(numbers, (1..=100).collect::<Vec<u64>>(), "the rows behind it");
}

/// Waits until the stream holds `n` messages and returns them in stream order.
async fn stored(nats: &Nats, n: u64, app: &Pgoutbox) -> Vec<Stored> {
    let js = jetstream(&nats.url()).await;
    let what = format!("{n} messages stored");
    eventually(Duration::from_secs(30), &what, || async {
        let have = count(&js, "OUTBOX").await;
        assert!(!app.log().contains("panicked"), "pgoutbox panicked:\n{}", app.log());
        (have >= n).then_some(())
    })
    .await;
    read_all(&js, "OUTBOX").await
}

/// A dead letter's headers: a usable `Nats-Msg-Id`, the reason, and whether the payload was
/// left out.
fn assert_dead_letter(m: &Stored, reason: &str, payload_omitted: bool) {
    assert_eq!(m.subject, "outbox.dead_letter");
    let id = m.header("Nats-Msg-Id").expect("a dead letter has an id");
    assert!(id.starts_with("dead-letter:") && !id.contains(['\r', '\n']), "{id:?}");
    let header = m.header("Pgoutbox-Dead-Letter-Reason").expect("reason header");
    assert!(header.contains(reason), "{header:?} does not mention {reason:?}");
    let omitted = m.header("Pgoutbox-Payload-Omitted");
    assert_eq!(omitted, Some(if payload_omitted { "true" } else { "false" }));
    let body = m.json();
    assert_eq!(body["table"], "public.outbox");
    assert!(body["position"].as_str().is_some(), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_too_big_for_max_payload_is_shortened() {
    let pg = Postgres::start();
    let (nats, _conf) = small_payload_nats();
    pg.psql(LOOSE_OUTBOX);
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    // Too big as a message (in a header) and too big as a dead letter (in the row).
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', repeat('y', 20000), 'created', '{}')",
    );
    insert(&pg, 1, "'order'", "'created'", "'{\"n\": 1}'", "NULL");
    let messages = stored(&nats, 2, &app).await;
    assert_dead_letter(&messages[0], "max_payload", true);
    let aggregate_id = messages[0].json()["row"]["aggregate_id"].as_str().map(str::to_owned);
    let aggregate_id = aggregate_id.expect("the shortened column is kept");
    assert!(aggregate_id.starts_with("yyy") && aggregate_id.len() < 8192, "{aggregate_id}");
    assert!(aggregate_id.contains("truncated"), "{aggregate_id}");
    assert_eq!(messages[1].subject, "outbox.order.created", "the row behind it was blocked");
    assert!(app.is_running(), "{}", app.log());
}

/// An outbox keyed by text, so that any id a client writes reaches pgoutbox.
const TEXT_ID_OUTBOX: &str = "CREATE TABLE outbox (id text PRIMARY KEY, \
    aggregate_type text, aggregate_id text, event_type text, payload jsonb, headers jsonb, \
    created_at timestamptz DEFAULT now())";

#[tokio::test(flavor = "multi_thread")]
async fn an_id_with_a_line_break_becomes_a_dead_letter() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(TEXT_ID_OUTBOX);
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES (E'a\\nb', 'order', '1', 'created', '{}')",
    );
    pg.psql(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('after', 'order', '2', 'created', '{}')",
    );
    let messages = stored(&nats, 2, &app).await;
    assert_dead_letter(&messages[0], "message id", false);
    assert_eq!(messages[0].json()["id"], "a\nb", "the id is kept in the body");
    assert_eq!(messages[0].json()["row"]["id"], "a\nb");
    assert_eq!(messages[1].subject, "outbox.order.created");
    assert_eq!(messages[1].header("Nats-Msg-Id"), Some("after"));
    assert!(app.is_running(), "{}", app.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_that_grows_when_escaped_leaves_the_payload_out() {
    let pg = Postgres::start();
    let nats = Nats::start(); // max_payload: the default 1 MiB
    pg.psql(LOOSE_OUTBOX);
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    // 450,000 `"` characters: 900 KB as jsonb text (each is `\"`), 1.8 MB once JSON-escaped
    // again inside the dead letter. The bad subject makes it a dead letter.
    let quotes = "to_jsonb(repeat('\"', 450000))";
    insert(&pg, 0, "'has space'", "'created'", quotes, "NULL");
    insert(&pg, 1, "'order'", "'created'", "'{\"n\": 1}'", "NULL");
    let messages = stored(&nats, 2, &app).await;
    assert_dead_letter(&messages[0], "whitespace", true);
    assert_eq!(messages[0].json()["row"]["payload"], serde_json::Value::Null);
    assert_eq!(messages[0].json()["row"]["aggregate_type"], "has space");
    assert_eq!(messages[1].subject, "outbox.order.created");
    assert!(app.is_running(), "{}", app.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_the_stream_refuses_becomes_a_dead_letter() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(LOOSE_OUTBOX);
    // The operator created the stream with a per-message limit below the server's.
    let js = jetstream(&nats.url()).await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "OUTBOX".into(),
        subjects: vec!["outbox.*.*".into(), "outbox.dead_letter".into()],
        max_message_size: 2048,
        ..Default::default()
    })
    .await
    .expect("create the stream with max_msg_size");
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    insert(&pg, 0, "'order'", "'created'", "'{\"n\": 0}'", "NULL");
    let big = "jsonb_build_object('n', 1, 'pad', repeat('x', 4000))";
    insert(&pg, 1, "'order'", "'created'", big, "NULL");
    for n in 2..5 {
        insert(&pg, n, "'order'", "'created'", &format!("'{{\"n\": {n}}}'"), "NULL");
    }
    let messages = stored(&nats, 5, &app).await;
    assert_eq!(messages.len(), 5);
    assert_eq!(messages[0].json()["n"], 0);
    assert_dead_letter(&messages[1], "10054", true);
    assert_eq!(messages[1].json()["row"]["aggregate_id"], "1");
    for (n, m) in messages.iter().enumerate().skip(2) {
        assert_eq!(m.subject, "outbox.order.created");
        assert_eq!(m.json()["n"], n, "rows behind the refused one arrive, in order");
    }
    assert!(app.is_running(), "{}", app.log());
}
