//! An OTLP/HTTP trace receiver: `POST /v1/traces` with a protobuf `ExportTraceServiceRequest`,
//! decoded with the protocol's own generated types, as a collector would decode it.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// A span received, with its resource's `service.name`.
#[derive(Debug, Clone)]
pub struct Received {
    pub service: Option<String>,
    pub span: Span,
}

impl Received {
    pub fn attribute(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }
}

pub fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    value_text(value)
}

fn value_text(value: &AnyValue) -> Option<String> {
    match value.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

/// The receiver, listening until dropped.
pub struct Receiver {
    port: u16,
    spans: Arc<Mutex<Vec<Received>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new().route("/v1/traces", post(export)).with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind OTLP");
        let port = listener.local_addr().expect("OTLP address").port();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { port, spans, server }
    }

    /// What `OTEL_EXPORTER_OTLP_ENDPOINT` says to reach it.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A TLS front to the receiver, with the server certificate `dir/server.pem` (see
    /// `certs::ca_and_server`): `https://localhost:<port>`, served until dropped.
    pub async fn https_front(&self, dir: &std::path::Path) -> TlsFront {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_file_iter(dir.join("server.pem"))
            .expect("read server.pem")
            .collect::<Result<Vec<_>, _>>()
            .expect("parse server.pem");
        let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).expect("read server.key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server certificate");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind TLS");
        let port = listener.local_addr().expect("TLS address").port();
        let plain = self.port;
        let server = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(socket).await else { return };
                    let Ok(mut inner) = tokio::net::TcpStream::connect(("127.0.0.1", plain)).await
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut inner).await;
                });
            }
        });
        TlsFront { port, server }
    }

    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().map(|spans| spans.clone()).unwrap_or_default()
    }
}

/// TLS in front of a [`Receiver`].
pub struct TlsFront {
    port: u16,
    server: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    pub fn endpoint(&self) -> String {
        format!("https://localhost:{}", self.port)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn export(State(spans): State<Arc<Mutex<Vec<Received>>>>, body: Bytes) -> StatusCode {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let Ok(mut spans) = spans.lock() else {
        return StatusCode::INTERNAL_SERVER_ERROR;
    };
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|resource| attribute(&resource.attributes, "service.name"));
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                spans.push(Received { service: service.clone(), span });
            }
        }
    }
    StatusCode::OK
}
