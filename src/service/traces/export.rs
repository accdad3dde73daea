//! The HTTP client the OTLP exporter sends spans with: one HTTP/1.1 connection of hyper
//! (already linked for the ops endpoint), driven by a current-thread tokio runtime on a
//! thread of its own, so that exporting never takes the pipeline's thread and never waits
//! on it. The SDK's batch processor calls it from its own thread, one export at a time, and
//! drops what does not fit its queue. (opentelemetry-http's own hyper client would link
//! HTTP/2 as well, for nothing.)
//!
//! An `https://` endpoint is reached over TLS (rustls, as every other connection of
//! pgoutbox), verified against `OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE` or the system's
//! roots.
//!
//! An endpoint that fails is said once, in one warning, and once more when exports work
//! again: never once per span or per batch.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HOST, HeaderValue};
use hyper_util::rt::TokioIo;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use tokio::sync::Mutex;
use tracing::{info, warn};

/// A collector's answer is a few bytes; more is not read.
const MAX_ANSWER_BYTES: usize = 1 << 20;

type Connection = Arc<Mutex<Option<SendRequest<Full<Bytes>>>>>;

#[derive(Debug, Clone)]
pub struct Client {
    runtime: tokio::runtime::Handle,
    timeout: Duration,
    /// Kept open between exports, opened again when it closed.
    connection: Connection,
    /// The last export failed, and that was said.
    failing: Arc<AtomicBool>,
    /// For `https://` endpoints.
    tls: Arc<rustls::ClientConfig>,
}

impl Client {
    /// Starts the exporting thread and its runtime; they last as long as the process.
    /// `certificate`: the CA an `https://` endpoint is verified with (else the system's).
    pub fn start(timeout: Duration, certificate: Option<&Path>) -> anyhow::Result<Client> {
        let tls = Arc::new(tls_config(certificate)?);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the runtime that exports traces")?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .context("starting the thread that exports traces")?;
        let (connection, failing) = (Arc::default(), Arc::default());
        Ok(Client { runtime: handle, timeout, connection, failing, tls })
    }

    fn failed(&self, why: &dyn std::fmt::Display) {
        if !self.failing.swap(true, Ordering::Relaxed) {
            warn!("traces are dropped while the OTLP endpoint fails ({why}); streaming goes on");
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (timeout, connection, tls) = (self.timeout, self.connection.clone(), self.tls.clone());
        let send = async move {
            match tokio::time::timeout(timeout, send(&connection, &tls, request)).await {
                Ok(answer) => answer,
                Err(_) => Err(format!("no answer within {timeout:?}").into()),
            }
        };
        let answer = self.runtime.spawn(send).await.unwrap_or_else(|join| Err(Box::new(join)));
        match &answer {
            Ok(response) if response.status().is_success() => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    info!("traces are exported again");
                }
            }
            Ok(response) => self.failed(&format!("it answered {}", response.status())),
            Err(err) => self.failed(err),
        }
        answer
    }
}

/// Sends `request` on the open connection, or on a new one to the request's host.
async fn send(
    connection: &Connection,
    tls: &Arc<rustls::ClientConfig>,
    request: Request<Bytes>,
) -> Result<Response<Bytes>, HttpError> {
    let (mut parts, body) = request.into_parts();
    let authority = parts.uri.authority().cloned().ok_or("the endpoint names no host")?;
    let tls = (parts.uri.scheme_str() == Some("https")).then_some(tls);
    parts.headers.insert(HOST, HeaderValue::from_str(authority.as_str())?);
    // HTTP/1.1 asks a server for the path (origin form); the host is in `Host`.
    parts.uri = parts.uri.path_and_query().map_or("/", |p| p.as_str()).parse()?;
    let mut held = connection.lock().await;
    let sender = match held.take().filter(|sender| !sender.is_closed()) {
        Some(sender) => sender,
        None => {
            let default_port = if tls.is_some() { 443 } else { 80 };
            connect(authority.host(), authority.port_u16().unwrap_or(default_port), tls).await?
        }
    };
    let sender = held.insert(sender);
    sender.ready().await?;
    let response = sender.send_request(Request::from_parts(parts, Full::new(body))).await;
    let response = match response {
        Ok(response) => response,
        Err(err) => {
            *held = None;
            return Err(err.into());
        }
    };
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_ANSWER_BYTES).collect().await?.to_bytes();
    Ok(Response::from_parts(parts, body))
}

async fn connect(
    host: &str,
    port: u16,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<SendRequest<Full<Bytes>>, HttpError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let stream = tokio::net::TcpStream::connect((host, port)).await?;
    stream.set_nodelay(true)?;
    let Some(tls) = tls else {
        return handshake(stream).await;
    };
    let name = rustls_pki_types::ServerName::try_from(host.to_owned())?;
    let stream = tokio_rustls::TlsConnector::from(tls.clone()).connect(name, stream).await?;
    handshake(stream).await
}

/// HTTP/1.1 on `stream`, the connection driven by a task of its own.
async fn handshake<S>(stream: S) -> Result<SendRequest<Full<Bytes>>, HttpError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Verifies an `https://` endpoint against `certificate` (PEM) or the system's roots.
fn tls_config(certificate: Option<&Path>) -> anyhow::Result<rustls::ClientConfig> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match certificate {
        Some(path) => {
            let unreadable = || format!("reading the OTLP endpoint's CA {}", path.display());
            for cert in CertificateDer::pem_file_iter(path).with_context(unreadable)? {
                roots.add(cert.with_context(unreadable)?).with_context(unreadable)?;
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
