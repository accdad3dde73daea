//! One module per subcommand; each is an `async fn` from settings to `anyhow::Result`.

pub mod run;
pub mod setup;
pub mod status;
pub mod teardown;

use std::time::Duration;

use anyhow::Context;

use crate::config::Config;

/// How long a publish may wait for its ack before the pipeline reconnects.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to NATS once; the client then reconnects by itself for as long as we run.
pub async fn connect_nats(config: &Config) -> anyhow::Result<async_nats::Client> {
    connect_nats_watched(config, std::sync::Arc::new(tokio::sync::watch::channel(0).0)).await
}

/// Like [`connect_nats`], counting each lost connection in `disconnects`: acks awaited on
/// a lost connection never come, and the pipeline need not wait out their timeout.
pub async fn connect_nats_watched(
    config: &Config,
    disconnects: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
) -> anyhow::Result<async_nats::Client> {
    let connected_before = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    auth_options(config)
        .await?
        .name("pgoutbox")
        .connection_timeout(Duration::from_secs(5))
        .max_reconnects(None)
        .event_callback(move |event| {
            let connected_before = connected_before.clone();
            let disconnects = disconnects.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        if connected_before.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            crate::telemetry::Metrics::reconnect("nats");
                        }
                        tracing::info!("NATS connected")
                    }
                    async_nats::Event::Disconnected => {
                        disconnects.send_modify(|count| *count += 1);
                        tracing::warn!("NATS disconnected")
                    }
                    async_nats::Event::Closed => tracing::debug!("NATS connection closed"),
                    other => tracing::warn!(event = %other, "NATS"),
                }
            }
        })
        .connect(config.nats_servers.as_slice())
        .await
        .with_context(|| format!("connecting to NATS at {}", servers(config)))
}

/// Connect options carrying the configured NATS authentication and TLS.
async fn auth_options(config: &Config) -> anyhow::Result<async_nats::ConnectOptions> {
    let auth = &config.nats_auth;
    let mut options = async_nats::ConnectOptions::new();
    if let Some(path) = &auth.creds_file {
        options = options
            .credentials_file(path)
            .await
            .with_context(|| format!("reading --nats-creds {}", path.display()))?;
    }
    if let Some(path) = &auth.nkey_file {
        let seed = std::fs::read_to_string(path)
            .with_context(|| format!("reading --nats-nkey {}", path.display()))?;
        options = options.nkey(seed.trim().to_owned());
    }
    if let Some((user, password)) = &auth.user_password {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &auth.token {
        options = options.token(token.clone());
    }
    if let Some(ca) = &auth.tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((cert, key)) = &auth.tls_client {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options)
}

/// The server list for messages, without credentials.
pub fn servers(config: &Config) -> String {
    config
        .nats_servers
        .iter()
        .map(|s| format!("{}:{}", s.host(), s.port()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Capped exponential backoff: 200 ms doubling up to 30 s.
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(200);
    const CAP: Duration = Duration::from_secs(30);

    pub fn new() -> Self {
        Backoff { next: Self::FIRST }
    }

    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::CAP);
        delay
    }

    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_and_resets() {
        let mut b = Backoff::new();
        let delays: Vec<_> = (0..10).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(200));
    }
}
