//! How often the stream's servers sync to disk, read from their monitoring endpoint
//! (`--nats-monitor-url`, nats-server's `/varz`), and whether the durability horizon
//! covers it (issue 70). A server acknowledges a write before it syncs it: its
//! `sync_interval` (2 minutes unless set; `always` syncs each write) is what a power loss
//! can take back. The horizon keeps that long of events in the slot, so it must be at least
//! the interval plus a sync pass; nothing else tells pgoutbox the interval, and `5m` in a
//! config file is 5 minutes where the horizon's default assumes 2.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

/// nats-server's interval when none is set (`server/filestore.go`, `defaultSyncInterval`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(120);

/// What a sync pass may add to the interval: its timer is re-armed once a pass ends, and a
/// write landing after the pass cleared its block waits for the next (`domain::horizon`).
pub const PASS_ALLOWANCE: Duration = Duration::from_secs(30);

/// How long a read of `/varz` may take.
const TIMEOUT: Duration = Duration::from_secs(3);
/// `/varz` is a few kilobytes; anything far larger is not nats-server's.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// How a server syncs its file store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sync {
    /// `sync_interval: always`: each write waits for the disk.
    Always,
    /// Every so often; `DEFAULT_INTERVAL` when the server reports none (2.10+ leave the
    /// default out of `/varz`).
    Every(Duration),
    /// The server does not report it (before 2.10, where it is not a setting).
    Unreported,
}

/// One server's answer: its version and how it syncs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSync {
    pub url: String,
    pub version: String,
    pub sync: Sync,
}

/// What the horizon is against a server's sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It keeps at least the interval and a pass, or the server syncs each write.
    Covered,
    /// Shorter than `needed`: a power loss of that server can take back events the slot no
    /// longer holds.
    Short { needed: Duration },
    /// The server does not say; the horizon's default assumes nats-server's 2 minutes.
    Unknown,
}

impl Sync {
    /// Whether `horizon` keeps what this sync may lose.
    pub fn judge(self, horizon: Duration) -> Verdict {
        match self {
            Sync::Always => Verdict::Covered,
            Sync::Unreported => Verdict::Unknown,
            Sync::Every(interval) => {
                let needed = interval.saturating_add(PASS_ALLOWANCE);
                if horizon >= needed { Verdict::Covered } else { Verdict::Short { needed } }
            }
        }
    }
}

impl std::fmt::Display for Sync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sync::Always => write!(f, "always"),
            Sync::Every(interval) => write!(f, "{} s", interval.as_secs_f64()),
            Sync::Unreported => write!(f, "not reported"),
        }
    }
}

/// Why a server's sync could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error(
        "{0} is not an http:// URL of nats-server's monitoring port (such as http://nats:8222)"
    )]
    Url(String),
    #[error("no answer from {url} within {} s", TIMEOUT.as_secs())]
    Timeout { url: String },
    #[error("{url}: {detail}")]
    Http { url: String, detail: String },
    #[error("{url}/varz is not nats-server's: {source}")]
    NotVarz { url: String, source: VarzError },
}

/// What makes an answer not nats-server's `/varz` with JetStream on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VarzError {
    #[error("not JSON ({0})")]
    NotJson(String),
    #[error("no version")]
    NoVersion,
    #[error("no jetstream.config: JetStream is off")]
    NoJetStream,
    #[error("sync_interval is not a count of nanoseconds")]
    Interval,
}

/// The version and sync of the server whose `/varz` answered `body`.
pub fn parse_varz(body: &[u8]) -> Result<(String, Sync), VarzError> {
    let varz: serde_json::Value =
        serde_json::from_slice(body).map_err(|err| VarzError::NotJson(err.to_string()))?;
    let version = varz.get("version").and_then(|v| v.as_str()).ok_or(VarzError::NoVersion)?;
    let config = varz.get("jetstream").and_then(|js| js.get("config"));
    let Some(config) = config else { return Err(VarzError::NoJetStream) };
    let always = config.get("sync_always").and_then(|v| v.as_bool()).unwrap_or(false);
    let sync = match (always, config.get("sync_interval")) {
        (true, _) => Sync::Always,
        (false, Some(nanos)) => {
            let nanos = nanos.as_u64().ok_or(VarzError::Interval)?;
            Sync::Every(Duration::from_nanos(nanos))
        }
        (false, None) if reports_its_interval(version) => Sync::Every(DEFAULT_INTERVAL),
        (false, None) => Sync::Unreported,
    };
    Ok((version.to_owned(), sync))
}

/// 2.10 made the interval a setting, and leaves it out of `/varz` while it is the default.
fn reports_its_interval(version: &str) -> bool {
    let mut parts = version.trim_start_matches('v').split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (2, 10),
        _ => false,
    }
}

/// Reads `url`'s `/varz`.
pub async fn read(url: &str) -> Result<ServerSync, MonitorError> {
    let base = url.trim_end_matches('/');
    let authority = base.strip_prefix("http://").ok_or_else(|| MonitorError::Url(url.into()))?;
    let request = hyper::Request::get(format!("{base}/varz"))
        .header(hyper::header::HOST, authority)
        .body(Empty::<Bytes>::new())
        .map_err(|_| MonitorError::Url(url.into()))?;
    let http = |detail: String| MonitorError::Http { url: url.to_owned(), detail };
    let fetch = async {
        let stream =
            tokio::net::TcpStream::connect(authority).await.map_err(|e| http(e.to_string()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| http(e.to_string()))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let response = sender.send_request(request).await.map_err(|e| http(e.to_string()))?;
        if !response.status().is_success() {
            return Err(http(format!("/varz answered {}", response.status())));
        }
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect().await;
        body.map(|b| b.to_bytes()).map_err(|e| http(e.to_string()))
    };
    let body = tokio::time::timeout(TIMEOUT, fetch)
        .await
        .map_err(|_| MonitorError::Timeout { url: url.to_owned() })??;
    let (version, sync) = parse_varz(&body)
        .map_err(|source| MonitorError::NotVarz { url: url.to_owned(), source })?;
    Ok(ServerSync { url: url.to_owned(), version, sync })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varz_says_how_each_version_syncs() {
        let varz = |config: &str, version: &str| {
            format!(r#"{{"version":"{version}","jetstream":{{"config":{{{config}}}}}}}"#)
        };
        let of = |config: &str, version: &str| parse_varz(varz(config, version).as_bytes());
        let five_minutes = Sync::Every(Duration::from_secs(300));
        assert_eq!(
            of(r#""sync_interval":300000000000"#, "2.15.1"),
            Ok(("2.15.1".into(), five_minutes))
        );
        assert_eq!(of(r#""sync_always":true"#, "2.10.26"), Ok(("2.10.26".into(), Sync::Always)));
        assert_eq!(
            of(r#""max_memory":1"#, "2.10.26").map(|v| v.1),
            Ok(Sync::Every(DEFAULT_INTERVAL))
        );
        assert_eq!(of(r#""max_memory":1"#, "2.9.10").map(|v| v.1), Ok(Sync::Unreported));
        assert!(parse_varz(br#"{"version":"2.15.1"}"#).is_err(), "JetStream off");
        assert!(parse_varz(b"<html>").is_err());
        assert!(of(r#""sync_interval":"5m""#, "2.15.1").is_err());
    }

    #[test]
    fn the_default_horizon_covers_the_default_interval_and_not_five_minutes() {
        let horizon = Duration::from_secs(150);
        assert_eq!(Sync::Every(DEFAULT_INTERVAL).judge(horizon), Verdict::Covered);
        let five = Sync::Every(Duration::from_secs(300)).judge(horizon);
        assert_eq!(five, Verdict::Short { needed: Duration::from_secs(330) });
        assert_eq!(Sync::Always.judge(Duration::ZERO), Verdict::Covered);
        assert_eq!(
            Sync::Every(Duration::from_secs(1)).judge(Duration::ZERO),
            Verdict::Short { needed: Duration::from_secs(31) }
        );
        assert_eq!(Sync::Unreported.judge(horizon), Verdict::Unknown);
        // `sync_interval: 5m` without quotes is 5,000,000 s: never covered, never overflows.
        let huge = Sync::Every(Duration::from_secs(5_000_000)).judge(horizon);
        assert!(matches!(huge, Verdict::Short { .. }));
    }
}
