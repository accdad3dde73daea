//! Connection-string parameters that tokio-postgres does not parse as libpq does.
//!
//! The settings are libpq's (`libpq_env` gathers them into one `key=value` list), but
//! tokio-postgres differs from libpq on a few keys: it rejects `sslrootcert`, `verify-ca`/`verify-full`
//! (see `tls`) and `keepalives_count`, and it reads `tcp_user_timeout` in seconds where
//! libpq reads milliseconds. [`strip_params`] takes such keys out of the string before
//! tokio-postgres parses the rest, and [`TcpSettings`] holds the TCP ones.
//!
//! The TCP settings matter because a silent network partition (packets dropped, no RST)
//! otherwise goes unnoticed for as long as the kernel keeps retransmitting, about 15
//! minutes. pgoutbox's defaults detect a dead peer within 50 s: keepalive probes after 20 s
//! of silence, every 10 s, 3 unanswered probes; and data unacknowledged for 50 s ends the
//! connection. The values are applied to the `tokio_postgres::Config`, from which both the
//! SQL connection (tokio-postgres sets the socket options itself) and the replication
//! connection (`replication::connection`) read them.

use std::path::PathBuf;
use std::time::Duration;

/// Linux's own `tcp_keepalive_time`, used when `keepalives_idle=0` asks for the system
/// default: tokio-postgres always sets an idle time.
const SYSTEM_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// TCP keepalive, `TCP_USER_TIMEOUT` and the connect deadline, as libpq's parameters give
/// them. `None` leaves the operating system's default, as a libpq value of 0 does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpSettings {
    /// `keepalives` (0 or 1).
    pub keepalives: bool,
    /// `keepalives_idle`: silence before the first probe.
    pub idle: Option<Duration>,
    /// `keepalives_interval`: between unanswered probes.
    pub interval: Option<Duration>,
    /// `keepalives_count`: unanswered probes before the connection is dropped.
    pub count: Option<u32>,
    /// `tcp_user_timeout`: how long sent data may stay unacknowledged (milliseconds in libpq).
    pub user_timeout: Option<Duration>,
    /// `connect_timeout`: a bound on each step of connecting (`None`: wait indefinitely).
    pub connect_timeout: Option<Duration>,
}

impl Default for TcpSettings {
    /// Detects a dead peer within 50 s, inside the 60 s pgoutbox promises.
    fn default() -> Self {
        TcpSettings {
            keepalives: true,
            idle: Some(Duration::from_secs(20)),
            interval: Some(Duration::from_secs(10)),
            count: Some(3),
            user_timeout: Some(Duration::from_secs(50)),
            connect_timeout: Some(Duration::from_secs(10)),
        }
    }
}

impl TcpSettings {
    /// Takes one parameter if it is a TCP one: `Ok(true)` when taken.
    fn take(&mut self, key: &str, value: &str) -> Result<bool, ConnInfoError> {
        let seconds = |value: &str| -> Result<Option<Duration>, ConnInfoError> {
            let n = whole_number(key, value)?;
            Ok((n > 0).then(|| Duration::from_secs(n.unsigned_abs())))
        };
        match key {
            "keepalives" => self.keepalives = whole_number(key, value)? != 0,
            "keepalives_idle" => self.idle = seconds(value)?,
            "keepalives_interval" => self.interval = seconds(value)?,
            // tokio-postgres's name for libpq's keepalives_count.
            "keepalives_count" | "keepalives_retries" => {
                let n = whole_number(key, value)?;
                self.count = (n > 0).then(|| u32::try_from(n).unwrap_or(u32::MAX));
            }
            "tcp_user_timeout" => {
                let n = whole_number(key, value)?;
                self.user_timeout = (n > 0).then(|| Duration::from_millis(n.unsigned_abs()));
            }
            "connect_timeout" => self.connect_timeout = seconds(value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Writes the settings into `config`, where both connections read them.
    pub fn apply(&self, config: &mut tokio_postgres::Config) {
        config.keepalives(self.keepalives);
        config.keepalives_idle(self.idle.unwrap_or(SYSTEM_KEEPALIVE_IDLE));
        if let Some(interval) = self.interval {
            config.keepalives_interval(interval);
        }
        if let Some(count) = self.count {
            config.keepalives_retries(count);
        }
        if let Some(timeout) = self.user_timeout {
            config.tcp_user_timeout(timeout);
        }
        if let Some(timeout) = self.connect_timeout {
            config.connect_timeout(timeout);
        }
    }
}

/// Takes the TCP parameters out of a `key=value` connection string; returns the rest
/// for tokio-postgres and the settings, defaults filled in.
pub fn split_tcp_settings(text: &str) -> Result<(String, TcpSettings), ConnInfoError> {
    let mut settings = TcpSettings::default();
    let rest = strip_params(text, |key, value| settings.take(key, value))?;
    Ok((rest, settings))
}

/// libpq reads these parameters as integers (surrounding blanks allowed).
fn whole_number(key: &str, value: &str) -> Result<i64, ConnInfoError> {
    value
        .trim()
        .parse()
        .map_err(|_| ConnInfoError::NotANumber { key: key.to_owned(), value: value.to_owned() })
}

/// A connection-string parameter pgoutbox reads itself has a value it cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnInfoError {
    #[error("{key} must be a whole number, not {value:?}")]
    NotANumber { key: String, value: String },
    #[error("unknown sslmode {0:?}: use disable, allow, prefer, require, verify-ca or verify-full")]
    UnknownSslMode(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Postgres TLS settings that cannot work; found when the settings are validated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("sslmode={mode} needs sslrootcert=<CA file> in --database-url")]
    NeedsRootCert { mode: &'static str },
    #[error("cannot read sslrootcert {}: {reason}", path.display())]
    UnreadableRootCert { path: PathBuf, reason: String },
    #[error("sslrootcert {}: {reason}", path.display())]
    RootCert { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(String),
    #[error("client certificate {}: {reason}", path.display())]
    ClientCert { path: PathBuf, reason: String },
    #[error("sslcert and sslkey go together: give both (PGSSLCERT and PGSSLKEY), or neither")]
    CertWithoutKey,
}

/// Removes every parameter that `take` accepts (it returns `Ok(true)` for those) from a
/// `key=value` list (`libpq_env` writes every way of giving the settings as one), and
/// returns the rest.
pub(crate) fn strip_params(
    text: &str,
    mut take: impl FnMut(&str, &str) -> Result<bool, ConnInfoError>,
) -> Result<String, ConnInfoError> {
    let mut kept = Vec::new();
    for token in key_value_tokens(text) {
        let (key, value) = token.split_once('=').unwrap_or((token, ""));
        if !take(key.trim(), &unquote(value.trim()))? {
            kept.push(token);
        }
    }
    Ok(kept.join(" "))
}

/// Decodes `%XX` escapes in URLs (user info, query values).
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A `key=value` value without its quotes and backslash escapes, as libpq reads it.
fn unquote(value: &str) -> String {
    let inner = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')).unwrap_or(value);
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// Splits `key=value key='quoted value'` on whitespace outside quotes (a backslash escapes
/// the next character).
fn key_value_tokens(text: &str) -> Vec<&str> {
    let mut tokens = Vec::new();
    let (mut start, mut quoted, mut escaped) = (None, false, false);
    for (i, c) in text.char_indices() {
        if std::mem::take(&mut escaped) {
            start.get_or_insert(i);
            continue;
        }
        match c {
            '\\' => escaped = true,
            '\'' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if let Some(s) = start.take() {
                    tokens.push(&text[s..i]);
                }
                continue;
            }
            _ => {}
        }
        start.get_or_insert(i);
    }
    if let Some(s) = start {
        tokens.push(&text[s..]);
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
    }

    #[test]
    fn defaults_detect_a_dead_peer_within_a_minute() {
        let (rest, tcp) = split_tcp_settings("host=h dbname=db application_name='x'").unwrap();
        assert_eq!(rest, "host=h dbname=db application_name='x'");
        assert_eq!(tcp, TcpSettings::default());
        let probes = tcp.idle.unwrap() + tcp.interval.unwrap() * tcp.count.unwrap();
        assert!(probes <= Duration::from_secs(60), "keepalive gives up after {probes:?}");
        assert!(tcp.user_timeout.unwrap() <= Duration::from_secs(60));
    }

    #[test]
    fn libpq_parameters_are_taken_out_of_written_settings() {
        let (rest, tcp) = split_tcp_settings(
            "host='h' keepalives_idle='5' sslmode='disable' keepalives_interval='2' \
             keepalives_count='4' tcp_user_timeout='1500' connect_timeout='3' password='a\\' b'",
        )
        .unwrap();
        assert_eq!(rest, "host='h' sslmode='disable' password='a\\' b'");
        let expected = TcpSettings {
            keepalives: true,
            idle: secs(5),
            interval: secs(2),
            count: Some(4),
            user_timeout: Some(Duration::from_millis(1500)),
            connect_timeout: secs(3),
        };
        assert_eq!(tcp, expected);
    }

    #[test]
    fn libpq_parameters_are_taken_out_of_key_value_strings() {
        let (rest, tcp) = split_tcp_settings(
            "host=h keepalives=0 password='a b' keepalives_retries=7 tcp_user_timeout='250'",
        )
        .unwrap();
        assert_eq!(rest, "host=h password='a b'");
        assert!(!tcp.keepalives);
        assert_eq!(tcp.count, Some(7), "tokio-postgres's name is accepted too");
        assert_eq!(tcp.user_timeout, Some(Duration::from_millis(250)), "milliseconds, as libpq");
    }

    #[test]
    fn zero_means_the_system_default_and_garbage_is_refused() {
        let (_, tcp) = split_tcp_settings(
            "host=h keepalives_idle=0 keepalives_interval=0 keepalives_count=0 \
             tcp_user_timeout=0 connect_timeout=0",
        )
        .unwrap();
        let system = TcpSettings {
            keepalives: true,
            idle: None,
            interval: None,
            count: None,
            user_timeout: None,
            connect_timeout: None,
        };
        assert_eq!(tcp, system);
        let err = split_tcp_settings("host=h keepalives_idle=30s").unwrap_err();
        let expected =
            ConnInfoError::NotANumber { key: "keepalives_idle".into(), value: "30s".into() };
        assert_eq!(err, expected);
    }

    #[test]
    fn settings_reach_the_tokio_postgres_config() {
        let (rest, tcp) =
            split_tcp_settings("host=h keepalives_idle=0 tcp_user_timeout=0").unwrap();
        let mut config: tokio_postgres::Config = rest.parse().unwrap();
        tcp.apply(&mut config);
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), SYSTEM_KEEPALIVE_IDLE);
        assert_eq!(config.get_keepalives_interval(), secs(10));
        assert_eq!(config.get_keepalives_retries(), Some(3));
        assert_eq!(config.get_tcp_user_timeout(), None);
        assert_eq!(config.get_connect_timeout().copied(), secs(10));
    }
}
