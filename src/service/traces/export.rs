//! The HTTP client the OTLP exporter sends spans with: hyper (already linked for the ops
//! endpoint), driven by a current-thread tokio runtime on a thread of its own, so that
//! exporting never takes the pipeline's thread and never waits on it. The SDK's batch
//! processor calls it from its own thread and drops what does not fit its queue.
//!
//! An endpoint that fails is said once, in one warning, and once more when exports work
//! again: never once per span or per batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use tracing::{info, warn};

#[derive(Debug, Clone)]
pub struct Client {
    inner: HyperClient,
    runtime: tokio::runtime::Handle,
    /// The last export failed, and that was said.
    failing: Arc<AtomicBool>,
}

impl Client {
    /// Starts the exporting thread and its runtime; they last as long as the process.
    pub fn start(timeout: Duration) -> anyhow::Result<Client> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the runtime that exports traces")?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .context("starting the thread that exports traces")?;
        let inner = {
            let _entered = handle.enter();
            HyperClient::with_default_connector(timeout, None)
        };
        Ok(Client { inner, runtime: handle, failing: Arc::default() })
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
        let inner = self.inner.clone();
        let sent = self.runtime.spawn(async move { inner.send_bytes(request).await }).await;
        let answer = sent.unwrap_or_else(|join| Err(Box::new(join)));
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
