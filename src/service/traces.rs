//! OpenTelemetry traces, off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: a producer span per published message, child
//! of the row's own `traceparent`, and a span per transaction from its decoding to the
//! confirmation of its end LSN.
//!
//! A producer span is named as the messaging conventions ask, `{operation} {destination}`
//! with a destination of low cardinality: `publish <subject template>` (`publish
//! outbox.{aggregate_type}.{event_type}`; a dead letter's subject, a held row's
//! `<prefix>.{$id}.{$position}`), also `messaging.destination.template`. The subject is unique
//! per aggregate, per tenant, per scheduled row; a backend groups, samples and indexes spans
//! by name, so the subject goes in `messaging.destination.name` only. A span whose message
//! failed has an error status and `error.type` (the general conventions), one of few values:
//! JetStream's API error code (`10071`), else the kind of failure (`timeout`, ...);
//! `dead_letter` for a row's dead letter, `unacknowledged` for a message whose ack never
//! came before its attempt ended.
//!
//! The pipeline holds an `Option<Traces>`: with tracing off, each row costs one branch on
//! it and nothing else, and its headers go out exactly as the row wrote them. With tracing
//! on, a message carries its producer span's `traceparent` (and the trace's `tracestate`)
//! in place of the row's, so a consumer's span is the child of pgoutbox's. A row's span ends
//! at its ack; a transaction's when its end LSN is confirmed to Postgres. Spans go to the
//! SDK's batch processor, a bounded queue exported from a thread of its own: when the queue
//! is full or the endpoint is down, spans are dropped, never waited for (`traces/export.rs`).
//!
//! Spans are made with the OpenTelemetry API itself, not through `tracing` and
//! tracing-opentelemetry: a message's span begins at its dispatch and ends at its ack, in no
//! lexical scope, with a remote parent read from the row; a `tracing` span per row would
//! also cost the log subscriber's span registry on every row, traces on or off.

use std::collections::VecDeque;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::{SdkTracerProvider, Span, Tracer};
use tracing::{info, warn};

use crate::domain::outbox::Headers;
use crate::domain::progress::Position;
use crate::domain::trace_context::{TRACEPARENT, TRACESTATE, TraceParent};
use crate::nats::outbound::Ack;
use crate::settings::config::Env;

mod export;
mod settings;

use settings::TraceSettings;

/// The attribute that holds the JetStream stream sequence a message was stored at. The
/// messaging conventions define none for NATS; this follows their `messaging.<system>.*`
/// pattern.
pub const STREAM_SEQUENCE: &str = "messaging.nats.stream.sequence";
/// Why a message's publish failed: few values, as the general conventions ask.
const ERROR_TYPE: &str = "error.type";
/// The `error.type` of a row's dead letter, published in the row's place: the row's event
/// was not delivered (the letter's publish itself may have gone well).
const DEAD_LETTER: &str = "dead_letter";
/// The `error.type` of a message whose ack never came: its attempt ended first (a refusal
/// before it, the connection lost, an overdue ack) and the next one sends it again.
const UNACKNOWLEDGED: &str = "unacknowledged";
/// Transactions whose span waits for its confirmation; past this, the oldest span ends
/// unconfirmed, so that span data never grows without bound.
const MAX_PENDING_TRANSACTIONS: usize = 8192;
/// How long shutting down waits for the spans still queued to be exported.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// The tracer provider of a `run`, when tracing is configured.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: Tracer,
}

impl Tracing {
    /// Tracing as the `OTEL_*` variables configure it: `None` when they ask for none, or
    /// for what pgoutbox cannot export (said in one warning; streaming goes on).
    pub fn from_env(env: &dyn Env) -> Option<Tracing> {
        let settings = match TraceSettings::from_env(env) {
            Ok(settings) => settings?,
            Err(refusal) => {
                warn!("traces are off: {refusal}");
                return None;
            }
        };
        match Self::start(&settings) {
            Ok(tracing) => {
                info!(endpoint = %settings::shown(&settings.endpoint),
                    "exporting traces over OTLP http/protobuf");
                Some(tracing)
            }
            Err(err) => {
                warn!("traces are off: {err:#}");
                None
            }
        }
    }

    fn start(settings: &TraceSettings) -> anyhow::Result<Tracing> {
        use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
        let client = export::Client::start(settings.timeout, settings.certificate.as_deref())?;
        // The exporter reads the endpoint, headers and compression from the same variables.
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_timeout(settings.timeout)
            .with_http_client(client)
            .build()?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        if settings.default_service_name {
            resource = resource.with_service_name("pgoutbox");
        }
        // The sampler comes from OTEL_TRACES_SAMPLER(_ARG), the queue from OTEL_BSP_*.
        let provider = SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_batch_exporter(exporter)
            .build();
        let tracer = provider.tracer("pgoutbox");
        Ok(Tracing { provider, tracer })
    }

    pub fn tracer(&self) -> Tracer {
        self.tracer.clone()
    }

    /// Exports what is queued, waiting [`SHUTDOWN_TIMEOUT`] at most.
    pub fn shutdown(self) {
        if let Err(err) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            warn!("traces not all exported at exit: {err}");
        }
    }
}

/// A published message's producer span, recording: it ends when the message's ack comes;
/// dropped before that, it ends as [`UNACKNOWLEDGED`].
pub struct RowSpan(Box<Span>);

impl RowSpan {
    /// The message is a row's dead letter, sent in its place for `reason`.
    pub fn dead_letter(&mut self, reason: &str) {
        self.failed(
            DEAD_LETTER.into(),
            format!("the row was sent to the dead-letter subject: {reason}"),
        );
    }

    fn failed(&mut self, error_type: Value, description: String) {
        self.0.set_attribute(KeyValue::new(ERROR_TYPE, error_type));
        self.0.set_status(Status::error(description));
    }
}

impl Drop for RowSpan {
    fn drop(&mut self) {
        // An ended span records nothing more: this is one whose ack never came.
        if self.0.is_recording() {
            let why = "no ack came before the attempt ended; the message is sent again";
            self.failed(UNACKNOWLEDGED.into(), why.into());
        }
    }
}

struct OpenTransaction {
    began: SystemTime,
    /// Made at the transaction's first row: a transaction without one has no span.
    span: Option<Span>,
    rows: u64,
}

struct PendingTransaction {
    end_lsn: u64,
    span: Span,
    stored: bool,
}

/// The spans of one pipeline attempt.
pub struct Traces {
    tracer: Tracer,
    open: Option<OpenTransaction>,
    /// Committed transactions whose span ends at their confirmation, oldest first.
    pending: VecDeque<PendingTransaction>,
}

impl Traces {
    pub fn new(tracer: Tracer) -> Traces {
        Traces { tracer, open: None, pending: VecDeque::new() }
    }

    /// A transaction's Begin was decoded.
    pub fn begin(&mut self) {
        self.open = Some(OpenTransaction { began: SystemTime::now(), span: None, rows: 0 });
    }

    /// The producer span of the message `id` to `subject`, named by the subject's `template`
    /// (made only for a span recorded): its parent is the row's `traceparent` when that
    /// parses, and it replaces the row's `traceparent` and `tracestate` in `headers`. A value
    /// that does not parse is dropped with its `tracestate`, and the span starts a trace of
    /// its own. Returned only when sampled.
    pub fn producer(
        &mut self,
        id: &str,
        subject: &str,
        template: impl FnOnce() -> String,
        position: Position,
        headers: &mut Headers,
    ) -> Option<RowSpan> {
        let parent = headers.take_any_case(TRACEPARENT).and_then(|v| v.parse::<TraceParent>().ok());
        let state = headers.take_any_case(TRACESTATE);
        let cx = match parent {
            Some(parent) => {
                let state = state.and_then(|s| TraceState::from_str(&s).ok()).unwrap_or_default();
                let remote = SpanContext::new(
                    TraceId::from_bytes(parent.trace_id),
                    SpanId::from_bytes(parent.span_id),
                    TraceFlags::new(parent.flags),
                    true,
                    state,
                );
                Context::new().with_remote_span_context(remote)
            }
            None => Context::new(),
        };
        let mut builder = self.tracer.span_builder("publish").with_kind(SpanKind::Producer);
        if let Some(transaction) = self.transaction_context() {
            builder = builder.with_links(vec![Link::with_context(transaction)]);
        }
        let mut span = self.tracer.build_with_context(builder, &cx);
        let context = span.span_context();
        let traceparent = TraceParent {
            trace_id: context.trace_id().to_bytes(),
            span_id: context.span_id().to_bytes(),
            flags: context.trace_flags().to_u8(),
        };
        headers.insert(TRACEPARENT, &traceparent.to_string());
        let state = context.trace_state().header();
        if !state.is_empty() {
            headers.insert(TRACESTATE, &state);
        }
        if !span.is_recording() {
            return None;
        }
        let template = template();
        span.update_name(format!("publish {template}"));
        span.set_attributes([
            KeyValue::new("messaging.system", "nats"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", "publish"),
            KeyValue::new("messaging.destination.name", subject.to_owned()),
            KeyValue::new("messaging.destination.template", template),
            KeyValue::new("messaging.message.id", id.to_owned()),
            KeyValue::new("pgoutbox.position", position.to_string()),
        ]);
        Some(RowSpan(Box::new(span)))
    }

    /// The open transaction's span, started at its Begin, made at its first row.
    fn transaction_context(&mut self) -> Option<SpanContext> {
        let open = self.open.as_mut()?;
        open.rows += 1;
        let tracer = &self.tracer;
        let span = open.span.get_or_insert_with(|| {
            tracer
                .span_builder("transaction")
                .with_kind(SpanKind::Consumer)
                .with_start_time(open.began)
                .with_attributes([KeyValue::new("db.system.name", "postgresql")])
                .start(tracer)
        });
        span.is_recording().then(|| span.span_context().clone())
    }

    /// The open transaction's Commit was decoded: its span waits for `end_lsn` to be
    /// stored, then confirmed.
    pub fn commit(&mut self, end_lsn: u64) {
        let Some(OpenTransaction { span: Some(mut span), rows, .. }) = self.open.take() else {
            return;
        };
        if !span.is_recording() {
            return;
        }
        span.set_attributes([
            KeyValue::new("pgoutbox.commit_lsn", lsn(end_lsn)),
            KeyValue::new("pgoutbox.rows", rows as i64),
        ]);
        if self.pending.len() >= MAX_PENDING_TRANSACTIONS
            && let Some(mut oldest) = self.pending.pop_front()
        {
            oldest.span.end();
        }
        self.pending.push_back(PendingTransaction { end_lsn, span, stored: false });
    }

    /// Every message of the transactions ending at or before `confirmable` is stored.
    pub fn stored(&mut self, confirmable: u64) {
        let waiting = self.pending.iter_mut().skip_while(|t| t.stored);
        for transaction in waiting.take_while(|t| t.end_lsn <= confirmable) {
            transaction.span.add_event("stored", vec![]);
            transaction.stored = true;
        }
    }

    /// `confirmed` was reported to Postgres: the transactions ending there are done.
    pub fn confirmed(&mut self, confirmed: u64) {
        while let Some(oldest) = self.pending.front()
            && oldest.end_lsn <= confirmed
        {
            if let Some(mut transaction) = self.pending.pop_front() {
                transaction.span.add_event("confirmed", vec![]);
                transaction.span.end();
            }
        }
    }
}

/// A message's ack came: its span ends with the stream sequence, or with an error.
pub fn acknowledged(mut span: RowSpan, ack: &Ack) {
    match ack {
        Ok(stored) => {
            span.0.set_attribute(KeyValue::new(STREAM_SEQUENCE, stored.sequence as i64));
            if stored.duplicate {
                span.0.set_attribute(KeyValue::new("messaging.nats.duplicate", true));
            }
        }
        Err(err) => span.failed(error_type(err), err.to_string()),
    }
    span.0.end();
}

/// The message could not be handed to NATS at all: its span ends with `err`.
pub fn not_sent(mut span: RowSpan, err: &PublishError) {
    span.failed(error_type(err), err.to_string());
    span.0.end();
}

/// `error.type` of a failed publish: JetStream's API error code when it gave one (`10071`,
/// as nats-server documents them), else the kind of failure async-nats sorted it as.
fn error_type(err: &PublishError) -> Value {
    let api = std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>());
    if let Some(api) = api {
        return api.error_code().0.to_string().into();
    }
    let kind = match err.kind() {
        PublishErrorKind::TimedOut => "timeout",
        PublishErrorKind::BrokenPipe => "broken_pipe",
        PublishErrorKind::StreamNotFound => "stream_not_found",
        PublishErrorKind::WrongLastMessageId => "wrong_last_message_id",
        PublishErrorKind::WrongLastSequence => "wrong_last_sequence",
        PublishErrorKind::MaxAckPending => "max_ack_pending",
        PublishErrorKind::MaxPayloadExceeded => "max_payload_exceeded",
        // The conventions' value for an error of no known class.
        PublishErrorKind::Other => "_OTHER",
    };
    kind.into()
}

fn lsn(value: u64) -> String {
    format!("{:X}/{:X}", value >> 32, value & 0xffff_ffff)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod cost {
    use super::*;
    use opentelemetry_sdk::trace::Sampler;

    #[test]
    #[ignore]
    fn producer_cost() {
        for ratio in [0.0, 0.01, 1.0] {
            let provider = SdkTracerProvider::builder()
                .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))))
                .build();
            let mut traces = Traces::new(provider.tracer("t"));
            let n = 200_000;
            let started = std::time::Instant::now();
            for i in 0..n {
                if i % 100 == 0 {
                    traces.begin();
                }
                let mut headers = Headers::default();
                headers.insert("Outbox-Event-Type", "created");
                let position = Position { commit_lsn: 1, index: i };
                let (subject, template) = ("outbox.order.created", || "outbox.{a}.{b}".into());
                let span = traces.producer("0f0e-1", subject, template, position, &mut headers);
                drop(span);
                if i % 100 == 99 {
                    traces.commit(i as u64);
                    traces.confirmed(i as u64);
                }
            }
            eprintln!(
                "ratio {ratio}: {:.2} µs per row",
                started.elapsed().as_secs_f64() * 1e6 / n as f64
            );
        }
    }
}
