//! The NATS connection: authentication, TLS, and telling the pipeline when it is lost.

use std::time::{Duration, Instant};

use async_nats::ServerError;

use crate::nats::credentials::{self, NatsAuth};

/// Where NATS is and how to log in.
pub struct NatsSettings {
    pub servers: Vec<async_nats::ServerAddr>,
    pub auth: NatsAuth,
}

/// How long a publish may wait for its ack before the pipeline reconnects.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to NATS once; the client then reconnects by itself for as long as we run.
pub async fn connect_nats(settings: &NatsSettings) -> anyhow::Result<async_nats::Client> {
    let disconnects = std::sync::Arc::new(tokio::sync::watch::channel(0).0);
    connect_nats_watched(settings, disconnects, || {}).await
}

/// Like [`connect_nats`], counting each lost connection in `disconnects`: acks awaited on
/// a lost connection never come, and the pipeline need not wait out their timeout.
/// `on_reconnect` is called each time the client connects again after losing the server.
pub async fn connect_nats_watched(
    settings: &NatsSettings,
    disconnects: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
    on_reconnect: fn(),
) -> anyhow::Result<async_nats::Client> {
    let connected_before = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    auth_options(&settings.auth)
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
                            on_reconnect();
                        }
                        tracing::info!("NATS connected")
                    }
                    async_nats::Event::Disconnected => {
                        disconnects.send_modify(|count| *count += 1);
                        tracing::warn!("NATS disconnected")
                    }
                    async_nats::Event::Closed => tracing::debug!("NATS connection closed"),
                    other => {
                        if let async_nats::Event::ServerError(ServerError::Other(text)) = &other
                            && let Some(subject) = denied_subject(text)
                        {
                            record_denial(subject.to_owned());
                        }
                        tracing::warn!(event = %other, "NATS")
                    }
                }
            }
        })
        .connect(settings.servers.as_slice())
        .await
        // async-nats writes an error's source into its text and returns it as `source()`
        // too, so `{:#}` would print it twice: the text alone says it once.
        .map_err(|err| anyhow::anyhow!("connecting to NATS at {}: {err}", settings.describe()))
}

/// The subjects this process's NATS user was refused a publish to, as the server said
/// (`-ERR 'Permissions Violation for Publish to "<subject>"'`), each with when it was last
/// said. The server answers such a request with nothing else, so a caller that saw its
/// request time out asks here why.
static DENIED: std::sync::Mutex<Vec<(String, Instant)>> = std::sync::Mutex::new(Vec::new());

/// How many refused subjects [`DENIED`] keeps: the oldest go first (an Object Store put
/// refused for each row names a subject of its own).
const DENIED_KEPT: usize = 64;

fn record_denial(subject: String) {
    if let Ok(mut denied) = DENIED.lock() {
        denied.retain(|(d, _)| *d != subject);
        if denied.len() >= DENIED_KEPT {
            denied.remove(0);
        }
        denied.push((subject, Instant::now()));
    }
}

/// Whether the server refused this process a publish to `subject` (see [`DENIED`]).
pub fn publish_denied(subject: &str) -> bool {
    DENIED.lock().is_ok_and(|denied| denied.iter().any(|(d, _)| d == subject))
}

/// The newest subject starting with `prefix` the server refused this process a publish
/// to since `since`.
pub fn publish_denied_under(prefix: &str, since: Instant) -> Option<String> {
    let denied = DENIED.lock().ok()?;
    let found = denied.iter().rev().find(|(d, at)| *at >= since && d.starts_with(prefix));
    found.map(|(subject, _)| subject.clone())
}

/// The subject of a server error that refuses a publish for want of permission.
fn denied_subject(text: &str) -> Option<&str> {
    let (_, quoted) = text.split_once("Permissions Violation for Publish to ")?;
    let quoted = quoted.trim_start_matches(['"', '\'']);
    quoted.split(['"', '\'']).next().filter(|subject| !subject.is_empty())
}

/// Connect options carrying the configured NATS authentication and TLS. The credentials
/// go through async-nats's auth callback, which reads their files again at each connect,
/// so a rotated `.creds` file is used by the next reconnect; they are read once here too,
/// so that a missing or broken file stops the start with one line.
async fn auth_options(auth: &NatsAuth) -> anyhow::Result<async_nats::ConnectOptions> {
    let mut options = async_nats::ConnectOptions::new();
    if credentials::any(auth) {
        credentials::login(auth, b"")?;
        let auth = std::sync::Arc::new(auth.clone());
        options = async_nats::ConnectOptions::with_auth_callback(move |nonce| {
            let auth = auth.clone();
            async move {
                let login =
                    credentials::login(&auth, &nonce).map_err(async_nats::AuthError::new)?;
                let mut answer = async_nats::Auth::new();
                answer.jwt = login.jwt;
                answer.nkey = login.nkey;
                answer.signature = login.signature;
                if let Some((user, password)) = login.user_password {
                    answer.username = Some(user);
                    answer.password = Some(password);
                }
                answer.token = login.token;
                Ok(answer)
            }
        });
    }
    if let Some(ca) = &auth.tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((cert, key)) = &auth.tls_client {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options)
}

impl NatsSettings {
    /// The server list for messages, without credentials.
    pub fn describe(&self) -> String {
        self.servers
            .iter()
            .map(|s| format!("{}:{}", s.host(), s.port()))
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::denied_subject;

    #[test]
    fn a_publish_permission_violation_names_its_subject() {
        let text = r#"Permissions Violation for Publish to "$JS.API.STREAM.CREATE.OBJ_P""#;
        assert_eq!(denied_subject(text), Some("$JS.API.STREAM.CREATE.OBJ_P"));
        let unquoted = "permissions violation: Permissions Violation for Publish to 'a.b'";
        assert_eq!(denied_subject(unquoted), Some("a.b"));
        assert_eq!(denied_subject(r#"Permissions Violation for Subscription to "a""#), None);
        assert_eq!(denied_subject("Permissions Violation for Publish to "), None);
    }
}
