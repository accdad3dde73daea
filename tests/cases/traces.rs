//! OpenTelemetry traces, read back from a receiver that decodes OTLP/HTTP protobuf as a
//! collector does: a row's `traceparent` parents pgoutbox's producer span, and the message
//! carries that span's `traceparent`, so the chain row → pgoutbox → consumer holds. Without
//! the OTEL_* variables a message's headers are the row's; with an endpoint that is down,
//! traces are dropped and streaming goes on.

use std::process::Command;
use std::time::Duration;

use crate::support::certs;
use crate::support::otlp::{Received, Receiver};
use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{Stored, audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, free_port, numbered_rows, wait_until_streaming};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";
/// The `kind` of a producer span in OTLP (`SPAN_KIND_PRODUCER`).
const PRODUCER: i32 = 4;
/// An error status in OTLP (`STATUS_CODE_ERROR`).
const STATUS_ERROR: i32 = 2;

fn row(aggregate: &str, headers: Option<&str>) -> String {
    let headers = headers.map_or("NULL".into(), |h| format!("'{h}'"));
    format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('order', '{aggregate}', 'created', '{{}}', {headers});\n"
    )
}

fn traced(pg: &Postgres, nats: &Nats, endpoint: &str) -> Command {
    let mut cmd = command(pg, nats);
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        // Batches go out every 100 ms instead of every 5 s.
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        // A transaction's span ends at its confirmation: without a durability horizon at
        // once, not 150 s after it was stored.
        .env("PGOUTBOX_DURABILITY_HORIZON", "0s")
        .env("PGOUTBOX_MESSAGE_PREFIX", "outbox")
        .arg("run");
    cmd
}

fn message<'a>(messages: &'a [Stored], aggregate: &str) -> (usize, &'a Stored) {
    messages
        .iter()
        .enumerate()
        .find(|(_, m)| m.header("Outbox-Aggregate-Id") == Some(aggregate))
        .unwrap_or_else(|| panic!("no message of {aggregate}"))
}

/// `(trace id, span id, flags)` of a `traceparent` value, as hex.
fn parts(traceparent: &str) -> (String, String, String) {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent}");
    assert_eq!(fields[0], "00", "{traceparent}");
    (fields[1].into(), fields[2].into(), fields[3].into())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn producer_span<'a>(spans: &'a [Received], id: &str) -> Option<&'a Received> {
    spans.iter().find(|s| s.attribute("messaging.message.id").as_deref() == Some(id))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rows_traceparent_parents_pgoutboxs_span_and_the_message_names_that_span() {
    let receiver = Receiver::start().await;
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::spawn(traced(&pg, &nats, &receiver.endpoint()));
    wait_until_streaming(&pg, &app).await;

    let parent = format!("00-{TRACE_ID}-{PARENT_SPAN}-01");
    let headers = format!(r#"{{"traceparent": "{parent}", "tracestate": "vendor=x", "k": "v"}}"#);
    let emitted = format!(
        r#"{{"id":"m-1","aggregate_type":"order","aggregate_id":"emitted","event_type":"paid","payload":{{}},"headers":{{"traceparent":"{parent}"}}}}"#
    );
    let mut script = format!("BEGIN;\n{}", row("traced", Some(&headers)));
    script.push_str(&format!("SELECT pg_logical_emit_message(true, 'outbox', '{emitted}');\n"));
    script.push_str("COMMIT;\n");
    script.push_str(&row("untraced", None));
    script.push_str(&row("malformed", Some(r#"{"traceparent": "00-not-a-trace-01"}"#)));
    script.push_str(&row("refused", Some(r#"{"Nats-Rollup": "all"}"#)));
    pg.psql(&script);

    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "5 messages stored", || async {
        (count(&js, "OUTBOX").await >= 5).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;

    // The row's own trace context is replaced by pgoutbox's span, in the same trace.
    let (index, traced_message) = message(&messages, "traced");
    let header = traced_message.header("traceparent").expect("a traceparent header");
    let (trace, span_id, flags) = parts(header);
    assert_eq!((trace.as_str(), flags.as_str()), (TRACE_ID, "01"));
    assert_ne!(span_id, PARENT_SPAN, "the message names pgoutbox's span, not the row's");
    assert_eq!(traced_message.header("tracestate"), Some("vendor=x"));
    assert_eq!(traced_message.header("k"), Some("v"));
    let traceparents = traced_message.headers.iter().filter(|(k, _)| k == "traceparent");
    assert_eq!(traceparents.count(), 1, "{:?}", traced_message.headers);
    let id = traced_message.header("Nats-Msg-Id").expect("an id").to_owned();

    let spans = eventually(Duration::from_secs(30), "the producer spans exported", || async {
        let spans = receiver.spans();
        let ids = [id.as_str(), "m-1"];
        ids.iter().all(|id| producer_span(&spans, id).is_some()).then_some(spans)
    })
    .await;
    let span = producer_span(&spans, &id).expect("the traced row's span");
    assert_eq!(span.service.as_deref(), Some("pgoutbox"));
    assert_eq!(hex(&span.span.trace_id), TRACE_ID);
    assert_eq!(hex(&span.span.parent_span_id), PARENT_SPAN, "child of the row's span");
    assert_eq!(hex(&span.span.span_id), span_id, "the span the message names");
    assert_eq!(span.span.kind, PRODUCER);
    // Named by the subject template: the subject is one per aggregate.
    assert_eq!(span.span.name, "publish outbox.{aggregate_type}.{event_type}");
    assert_eq!(span.attribute("error.type"), None);
    for (key, value) in [
        ("messaging.system", "nats"),
        ("messaging.operation.type", "send"),
        ("messaging.destination.name", "outbox.order.created"),
        ("messaging.destination.template", "outbox.{aggregate_type}.{event_type}"),
        ("messaging.nats.stream.sequence", &(index + 1).to_string()),
    ] {
        assert_eq!(span.attribute(key).as_deref(), Some(value), "{key}: {span:?}");
    }
    // An emitted message's traceparent parents its span the same way.
    let emitted_span = producer_span(&spans, "m-1").expect("the emitted message's span");
    assert_eq!(hex(&emitted_span.span.parent_span_id), PARENT_SPAN);
    let (_, emitted_message) = message(&messages, "emitted");
    let (_, emitted_span_id, _) = parts(emitted_message.header("traceparent").expect("header"));
    assert_eq!(hex(&emitted_span.span.span_id), emitted_span_id);

    // Without a traceparent, and with one that does not parse: a trace of pgoutbox's own.
    for aggregate in ["untraced", "malformed"] {
        let (_, stored) = message(&messages, aggregate);
        let header = stored.header("traceparent").expect("pgoutbox's traceparent");
        let (trace, span_id, _) = parts(header);
        assert_ne!(trace, TRACE_ID);
        let id = stored.header("Nats-Msg-Id").expect("an id").to_owned();
        let span = eventually(Duration::from_secs(30), "a root producer span", || async {
            producer_span(&receiver.spans(), &id).cloned()
        })
        .await;
        assert!(span.span.parent_span_id.is_empty(), "{aggregate}: a root span");
        assert_eq!((hex(&span.span.trace_id), hex(&span.span.span_id)), (trace, span_id));
    }

    // A row sent to the dead-letter subject was not delivered: its letter's span says so.
    let letter = messages.iter().find(|m| m.subject == "outbox.dead_letter").expect("a letter");
    let letter_id = letter.header("Nats-Msg-Id").expect("an id").to_owned();
    let letter_span = eventually(Duration::from_secs(30), "the dead letter's span", || async {
        producer_span(&receiver.spans(), &letter_id).cloned()
    })
    .await;
    assert_eq!(letter_span.span.name, "publish outbox.dead_letter");
    assert_eq!(letter_span.attribute("error.type").as_deref(), Some("dead_letter"));
    assert_eq!(
        letter_span.attribute("messaging.destination.name").as_deref(),
        Some(letter.subject.as_str())
    );
    let status = letter_span.span.status.as_ref().expect("a status");
    assert_eq!(status.code, STATUS_ERROR, "{status:?}");
    assert!(status.message.contains("reserved"), "the row's reason: {status:?}");

    // The transaction's span, from its decoding to its confirmation, linked from its rows.
    let transaction = eventually(Duration::from_secs(30), "a transaction span", || async {
        let spans = receiver.spans();
        spans.into_iter().find(|s| {
            s.span.name == "transaction" && s.attribute("pgoutbox.rows").as_deref() == Some("2")
        })
    })
    .await;
    let events: Vec<&str> = transaction.span.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(events, ["stored", "confirmed"]);
    let link = span.span.links.first().expect("the row's span links to its transaction");
    assert_eq!(link.span_id, transaction.span.span_id);
}

/// An `https://` endpoint, verified with the CA `OTEL_EXPORTER_OTLP_CERTIFICATE` names.
#[tokio::test(flavor = "multi_thread")]
async fn an_https_endpoint_verified_with_the_given_ca_receives_the_spans() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().expect("certificates");
    certs::ca_and_server(dir.path(), "DNS:localhost,IP:127.0.0.1");
    let front = receiver.https_front(dir.path()).await;
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let mut cmd = traced(&pg, &nats, &front.endpoint());
    cmd.env("OTEL_EXPORTER_OTLP_CERTIFICATE", dir.path().join("ca.pem"));
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&row("secure", None));

    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "the row stored", || async {
        (count(&js, "OUTBOX").await >= 1).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    let (_, stored) = message(&messages, "secure");
    let id = stored.header("Nats-Msg-Id").expect("a message id").to_owned();
    let span = eventually(Duration::from_secs(30), "the row's span over https", || async {
        producer_span(&receiver.spans(), &id).cloned()
    })
    .await;
    let (trace, span_id, _) = parts(stored.header("traceparent").expect("a traceparent"));
    assert_eq!((hex(&span.span.trace_id), hex(&span.span.span_id)), (trace, span_id));
    let log = app.log();
    assert!(!log.contains("traces are off") && !log.contains("traces are dropped"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_otel_variables_a_messages_headers_are_the_rows() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let parent = format!("00-{TRACE_ID}-{PARENT_SPAN}-01");
    let headers = format!(r#"{{"traceparent": "{parent}", "tracestate": "vendor=x"}}"#);
    pg.psql(&format!("{}{}", row("traced", Some(&headers)), row("untraced", None)));

    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "2 messages stored", || async {
        (count(&js, "OUTBOX").await >= 2).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    let (_, traced_message) = message(&messages, "traced");
    assert_eq!(traced_message.header("traceparent"), Some(parent.as_str()));
    assert_eq!(traced_message.header("tracestate"), Some("vendor=x"));
    let (_, untraced) = message(&messages, "untraced");
    assert_eq!(untraced.header("traceparent"), None);
    let log = app.log();
    assert!(!log.contains("exporting traces") && !log.contains("traces are"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_otlp_endpoint_that_is_down_drops_traces_and_streaming_goes_on() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let closed = format!("http://127.0.0.1:{}", free_port());
    let app = Pgoutbox::spawn(traced(&pg, &nats, &closed));
    wait_until_streaming(&pg, &app).await;
    let rows = 300;
    for batch in 0..3 {
        pg.psql(&numbered_rows(batch * 100, (batch + 1) * 100, 10));
        // Several export batches fail meanwhile.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), "every row stored", || async {
        (count(&js, "OUTBOX").await >= rows as u64).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    let report = audit(&messages, rows);
    assert_eq!(report.stored, rows, "{report:?}");
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
    assert!(messages.iter().all(|m| m.header("traceparent").is_some()));
    let log = eventually(Duration::from_secs(10), "the warning", || async {
        let log = app.log();
        log.contains("traces are dropped").then_some(log)
    })
    .await;
    assert_eq!(log.matches("traces are dropped").count(), 1, "one warning:\n{log}");
}
