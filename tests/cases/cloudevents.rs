//! `--cloudevents`: every row and emitted message is read back by the Python CloudEvents SDK
//! (tests/fixtures/cloudevents_consumer.py) as a valid CloudEvent 1.0, in binary mode and in
//! structured mode, with its attributes taken from the row; dead letters stay pgoutbox's own.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{Stored, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, wait_until_streaming};

/// Each message as the SDK parsed it: its attributes, `data` and `mode`.
fn consume(messages: &[&Stored]) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cloudevents_consumer.py");
    // scripts/install-deps.sh puts the SDK in a directory of its own, not the user's Python.
    let packages = std::env::var("PGOUTBOX_PYTHON_PACKAGES")
        .unwrap_or_else(|_| "/var/tmp/pgoutbox-python".to_owned());
    let mut child = Command::new("python3")
        .arg(script)
        .env("PYTHONPATH", packages)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/install-deps.sh)");
    let mut stdin = child.stdin.take().expect("stdin");
    for message in messages {
        let headers: serde_json::Map<String, Value> =
            message.headers.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        let body = base64::engine::general_purpose::STANDARD.encode(&message.payload);
        writeln!(stdin, "{}", json!({"headers": headers, "body": body})).expect("write");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("the consumer ends");
    assert!(
        out.status.success(),
        "the CloudEvents SDK refused an event ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("the consumer prints JSON"))
        .collect()
}

async fn stored(nats: &Nats, n: u64) -> Vec<Stored> {
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), &format!("{n} messages stored"), || async {
        (count(&js, "OUTBOX").await >= n).then_some(())
    })
    .await;
    read_all(&js, "OUTBOX").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cloudevents_sdk_reads_every_row_and_emitted_message_in_binary_mode() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let database = pg.psql("SELECT current_database()").trim().to_owned();
    let app = Pgoutbox::run(&pg, &nats, &["--cloudevents", "--message-prefix", "outbox"]);
    wait_until_streaming(&pg, &app).await;

    pg.psql(
        "BEGIN;
         INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
         VALUES ('6f1c1a52-0000-4000-8000-000000000001', 'order', 'Bestellung 7 €', 'created',
                 '{\"n\": 0}', '{\"ce-tenant\": \"acme\"}', '2026-11-22 10:00:00.25+01');
         SELECT pg_logical_emit_message(true, 'outbox',
           '{\"id\":\"m-1\",\"aggregate_type\":\"order\",\"aggregate_id\":\"a-1\",\"event_type\":\"paid\",\"payload\":{\"n\":1},\"created_at\":\"2026-11-22T10:00:01Z\"}');
         SELECT pg_logical_emit_message(true, 'outbox',
           '{\"id\":\"m-2\",\"aggregate_type\":\"order\",\"event_type\":\"noted\",\"payload\":\"plain words\"}');
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'a-3', 'bad.type', '{\"n\": 3}');
         COMMIT;",
    );
    let messages = stored(&nats, 4).await;
    let letter = &messages[3];
    assert_eq!(letter.subject, "outbox.dead_letter", "{}", app.log());
    assert!(letter.headers.iter().all(|(name, _)| !name.starts_with("ce-")), "{letter:?}");

    let events: Vec<&Stored> = messages[..3].iter().collect();
    let parsed = consume(&events);
    assert_eq!(parsed.len(), 3);
    let row = &parsed[0];
    assert_eq!(row["mode"], "binary");
    assert_eq!(row["id"], "6f1c1a52-0000-4000-8000-000000000001");
    assert_eq!(row["source"], format!("/postgres/{database}/public.outbox"));
    assert_eq!(row["type"], "created");
    assert_eq!(row["subject"], "Bestellung 7 €", "percent-encoded, decoded by the SDK");
    // In the zone the walsender writes in (its TimeZone setting), as RFC 3339.
    assert_eq!(row["epoch"], 1_795_338_000.25, "{}", row["time"]);
    assert_eq!(row["datacontenttype"], "application/json");
    assert_eq!(row["data"], json!({"n": 0}));
    assert_eq!(row["tenant"], "acme", "a ce- header of the row is an extension attribute");
    assert_eq!(events[0].header("Nats-Msg-Id"), Some("6f1c1a52-0000-4000-8000-000000000001"));
    assert_eq!(events[0].header("Outbox-Event-Type"), Some("created"), "kept for compatibility");

    let emitted = &parsed[1];
    assert_eq!(emitted["id"], "m-1");
    assert_eq!(emitted["source"], format!("/postgres/{database}/pg_logical_emit_message.outbox"));
    assert_eq!((&emitted["type"], &emitted["subject"]), (&json!("paid"), &json!("a-1")));
    assert_eq!(emitted["time"], "2026-11-22T10:00:01+00:00", "as the application wrote it");
    assert_eq!(emitted["data"], json!({"n": 1}));
    let text = &parsed[2];
    assert_eq!(text["datacontenttype"], "text/plain");
    assert_eq!(text["data"], "plain words");
    assert!(text.get("subject").is_none_or(Value::is_null), "no aggregate id, no subject");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cloudevents_sdk_reads_structured_events_with_bytes_as_data_base64() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(
        "CREATE TABLE blobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
         kind text, owner text, body bytea, stamped timestamptz DEFAULT now());",
    );
    let app = Pgoutbox::run(
        &pg,
        &nats,
        &[
            "--table=blobs",
            "--cloudevents=structured",
            "--cloudevents-source=https://shop.example/blobs",
            "--event-type-column=kind",
            "--aggregate-id-column=owner",
            "--payload-column=body",
            "--created-at-column=stamped",
            "--subject-template=outbox.blob.{kind}",
            "--message-prefix=",
        ],
    );
    wait_until_streaming(&pg, &app).await;
    pg.psql(
        "INSERT INTO blobs (kind, owner, body, stamped) VALUES \
         ('png', 'u-1', '\\x89504e47'::bytea, '2026-11-22 10:00:00+00'), \
         ('empty', NULL, ''::bytea, '2026-11-22 10:00:02+00');",
    );
    let messages = stored(&nats, 2).await;
    for message in &messages {
        assert_eq!(message.header("Content-Type"), Some("application/cloudevents+json"));
        assert!(message.json()["data_base64"].is_string(), "{:?}", message.json());
    }
    let parsed = consume(&messages.iter().collect::<Vec<_>>());
    assert_eq!(parsed[0]["mode"], "structured");
    assert_eq!(parsed[0]["id"], "1");
    assert_eq!(parsed[0]["source"], "https://shop.example/blobs");
    assert_eq!((&parsed[0]["type"], &parsed[0]["subject"]), (&json!("png"), &json!("u-1")));
    assert_eq!(parsed[0]["epoch"], 1_795_341_600.0, "{}", parsed[0]["time"]);
    assert_eq!(parsed[0]["datacontenttype"], "application/octet-stream");
    assert_eq!(parsed[0]["data"], json!({"base64": "iVBORw=="}));
    assert_eq!(parsed[1]["type"], "empty");
    assert!(parsed[1].get("subject").is_none_or(Value::is_null));
}

/// With one `--cloudevents-source` for two tables, rows of the same id are two events (the id
/// names the table, as `Nats-Msg-Id` does); a row's `CE-Source`, `ce-source` in another case,
/// would stand beside pgoutbox's (the binding's header names are case-insensitive): the row
/// is a dead letter saying so.
#[tokio::test(flavor = "multi_thread")]
async fn one_source_for_two_tables_keeps_events_apart_and_refuses_a_rows_ce_header() {
    use super::several_tables::TABLES;
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(
        "CREATE SCHEMA billing; CREATE TABLE billing.outbox (LIKE public.outbox INCLUDING ALL);",
    );
    let mut args = vec!["--cloudevents", "--cloudevents-source=https://shop.example/outbox"];
    args.extend(TABLES);
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let id = "6f1c1a52-0000-4000-8000-000000000009";
    pg.psql(&format!(
        "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload)
         VALUES ('{id}', 'order', 'o-1', 'created', '{{}}');
         INSERT INTO billing.outbox (id, aggregate_type, aggregate_id, event_type, payload)
         VALUES ('{id}', 'invoice', 'i-1', 'created', '{{}}');
         INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
         VALUES ('order', 'o-2', 'created', '{{}}', '{{\"CE-Source\": \"/elsewhere\"}}');"
    ));
    let messages = stored(&nats, 3).await;
    let parsed = consume(&messages[..2].iter().collect::<Vec<_>>());
    let pairs: Vec<(&Value, &Value)> = parsed.iter().map(|e| (&e["source"], &e["id"])).collect();
    let source = json!("https://shop.example/outbox");
    let ids = [json!(format!("public.outbox:{id}")), json!(format!("billing.outbox:{id}"))];
    assert_eq!(pairs, [(&source, &ids[0]), (&source, &ids[1])], "{}", app.log());
    let letter = &messages[2];
    assert_eq!(letter.subject, "outbox.dead_letter", "{letter:?}");
    let reason = letter.header("Pgoutbox-Dead-Letter-Reason").unwrap_or_default();
    assert!(reason.contains("\"CE-Source\"") && reason.contains("reserved"), "{reason}");
}
