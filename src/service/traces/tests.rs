use std::sync::{Arc, Mutex};

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

use super::*;
use crate::nats::outbound::{Stored, ack_of};

const ROW_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const ROW_SPAN: &str = "00f067aa0ba902b7";

/// Spans made by an SDK with no exporter, every one sampled.
fn traces() -> Traces {
    Traces::new(SdkTracerProvider::builder().build().tracer("test"))
}

fn headers(pairs: &[(&str, &str)]) -> Headers {
    let mut headers = Headers::default();
    for (name, value) in pairs {
        headers.insert(name, value);
    }
    headers
}

fn produce(traces: &mut Traces, headers: &mut Headers) -> (TraceParent, Option<RowSpan>) {
    let position = Position { commit_lsn: 1, index: 0 };
    let template = || "outbox.{aggregate_type}.{event_type}".to_owned();
    let span = traces.producer("id-1", "outbox.order.created", template, position, headers);
    let traceparent = headers.get(TRACEPARENT).expect("pgoutbox's traceparent");
    (traceparent.parse().expect("a valid traceparent"), span)
}

#[test]
fn the_rows_traceparent_is_the_parent_and_is_replaced_by_the_spans_own() {
    let mut traces = traces();
    let row = format!("00-{ROW_TRACE}-{ROW_SPAN}-01");
    let mut headers = headers(&[("Traceparent", &row), ("tracestate", "k=v"), ("a", "1")]);
    let (ours, span) = produce(&mut traces, &mut headers);
    let span = span.expect("sampled: the parent was");
    let data = span.0.exported_data().expect("recorded");
    assert_eq!(data.span_context.trace_id().to_string(), ROW_TRACE);
    assert_eq!(data.parent_span_id.to_string(), ROW_SPAN);
    assert_eq!(data.span_kind, SpanKind::Producer);
    assert_eq!(data.name, "publish outbox.{aggregate_type}.{event_type}", "not the subject");
    for (key, value) in [
        ("messaging.destination.name", "outbox.order.created"),
        ("messaging.destination.template", "outbox.{aggregate_type}.{event_type}"),
    ] {
        assert_eq!(attribute(&data.attributes, key).as_deref(), Some(value), "{key}");
    }
    assert_eq!(ours.trace_id, data.span_context.trace_id().to_bytes());
    assert_eq!(ours.span_id, data.span_context.span_id().to_bytes());
    assert_eq!(headers.get("tracestate"), Some("k=v"));
    assert_eq!(headers.get("Traceparent"), None, "one traceparent, pgoutbox's");
    assert_eq!(headers.len(), 3);
}

#[test]
fn a_malformed_traceparent_names_no_parent_and_its_tracestate_goes_with_it() {
    let mut traces = traces();
    let mut headers = headers(&[("traceparent", "00-zz-01"), ("tracestate", "k=v")]);
    let (ours, span) = produce(&mut traces, &mut headers);
    let span = span.expect("sampled");
    let data = span.0.exported_data().expect("recorded");
    assert_eq!(data.parent_span_id, SpanId::INVALID, "a root span");
    assert_eq!(ours.span_id, data.span_context.span_id().to_bytes());
    assert_eq!(headers.get("tracestate"), None);
}

#[test]
fn an_unsampled_parent_gives_an_unsampled_traceparent_and_no_span_to_keep() {
    let mut traces = traces();
    let row = format!("00-{ROW_TRACE}-{ROW_SPAN}-00");
    let mut headers = headers(&[("traceparent", &row)]);
    let (ours, span) = produce(&mut traces, &mut headers);
    assert!(span.is_none());
    assert!(!ours.sampled());
    assert_eq!(hex(&ours.trace_id), ROW_TRACE, "the trace goes on");
    assert_ne!(hex(&ours.span_id), ROW_SPAN);
}

#[test]
fn a_transactions_span_waits_for_its_confirmation() {
    let mut traces = traces();
    traces.begin();
    let mut headers = Headers::default();
    let (_, span) = produce(&mut traces, &mut headers);
    let span = span.expect("sampled");
    assert_eq!(span.0.exported_data().expect("recorded").links.len(), 1);
    traces.commit(100);
    traces.stored(99);
    assert!(!traces.pending[0].stored);
    traces.stored(100);
    traces.confirmed(99);
    assert_eq!(traces.pending.len(), 1);
    traces.confirmed(100);
    assert!(traces.pending.is_empty());
    // A transaction without a message has no span.
    traces.begin();
    traces.commit(200);
    assert!(traces.pending.is_empty());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Spans as an exporter receives them when they end.
#[derive(Debug, Clone, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collected {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        self.0.lock().expect("collected spans").extend(batch);
        std::future::ready(Ok(()))
    }
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.to_string())
}

/// A failed publish's span says why in `error.type`, one of few values, with an error
/// status: JetStream's API error code, else the kind of failure; a span whose ack never
/// came (the attempt ended first) too. A stored message's has neither.
#[test]
fn a_failed_publish_ends_its_span_with_an_error_type_and_an_error_status() {
    let spans = Collected::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(spans.clone()).build();
    let mut traces = Traces::new(provider.tracer("test"));
    let mut span = || produce(&mut traces, &mut Headers::default()).1.expect("sampled");
    let wrong =
        br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"}}"#;
    acknowledged(span(), &ack_of(None, wrong));
    acknowledged(span(), &Err(PublishError::new(PublishErrorKind::TimedOut)));
    acknowledged(span(), &ack_of(Some(503), b""));
    drop(span());
    let mut letter = span();
    letter.dead_letter("column aggregate_type is NULL");
    acknowledged(letter, &Ok(Stored { sequence: 6, duplicate: false }));
    acknowledged(span(), &Ok(Stored { sequence: 7, duplicate: false }));
    let spans = spans.0.lock().expect("collected spans");
    let ended: Vec<(Option<String>, bool)> = spans
        .iter()
        .map(|s| {
            let error = matches!(s.status, Status::Error { .. });
            (attribute(&s.attributes, "error.type"), error)
        })
        .collect();
    let error = |kind: &str| (Some(kind.to_owned()), true);
    assert_eq!(
        ended,
        [
            error("10071"),
            error("timeout"),
            error("stream_not_found"),
            error("unacknowledged"),
            error("dead_letter"),
            (None, false)
        ]
    );
    assert!(spans.iter().all(|s| s.name == "publish outbox.{aggregate_type}.{event_type}"));
}
