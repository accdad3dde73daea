//! What the stream must allow for the messages pgoutbox makes (per-message TTLs,
//! schedules), and the one line that says what to do when the server or an existing
//! stream does not.

use async_nats::jetstream::stream;

/// What the stream must allow, beyond storing messages, for the messages pgoutbox makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamFeatures {
    /// `--ttl-column`: `Nats-TTL` (nats-server 2.11+, the stream's `allow_msg_ttl`).
    pub message_ttl: bool,
    /// `--schedule-column`: `Nats-Schedule` (nats-server 2.12+, `allow_msg_schedules`).
    pub message_schedules: bool,
}

impl StreamFeatures {
    /// Why the server at `version` or the existing stream's `config` (`None`: pgoutbox
    /// creates it) cannot take these messages, if it cannot: one line that says what to do.
    pub(super) fn refusal(
        &self,
        version: &str,
        stream: &str,
        config: Option<&stream::Config>,
    ) -> Option<String> {
        self.schedules_refusal(version, stream, config)
            .or_else(|| self.ttl_refusal(version, stream, config))
    }

    fn schedules_refusal(
        &self,
        version: &str,
        stream: &str,
        config: Option<&stream::Config>,
    ) -> Option<String> {
        if !self.message_schedules {
            return None;
        }
        if crate::nats::server_version::older_than(version, (2, 12)) {
            return Some(format!(
                "--schedule-column needs nats-server 2.12 or later (message schedules); this \
                 server is {version}: upgrade it, or run without --schedule-column"
            ));
        }
        match config {
            Some(config) if !config.allow_message_schedules => Some(format!(
                "--schedule-column needs message schedules, which stream {stream} does not \
                 allow; pgoutbox never changes an existing stream, and nats-server allows them \
                 only on an empty one: use a new --stream, or purge {stream} and allow them \
                 (nats stream edit {stream} --allow-schedules)"
            )),
            _ => None,
        }
    }

    fn ttl_refusal(
        &self,
        version: &str,
        stream: &str,
        config: Option<&stream::Config>,
    ) -> Option<String> {
        if !self.message_ttl {
            return None;
        }
        if crate::nats::server_version::older_than(version, (2, 11)) {
            return Some(format!(
                "--ttl-column needs nats-server 2.11 or later (per-message TTL); this server \
                 is {version}: upgrade it, or run without --ttl-column"
            ));
        }
        match config {
            Some(config) if !config.allow_message_ttl => Some(format!(
                "--ttl-column needs per-message TTLs, which stream {stream} does not allow; \
                 pgoutbox never changes an existing stream: allow them (nats stream edit \
                 {stream} --allow-msg-ttl) or use a new --stream"
            )),
            Some(config) if config.subject_delete_marker_ttl.is_some() => Some(format!(
                "--ttl-column cannot be used with stream {stream}: it keeps subject delete \
                 markers (subject_delete_marker_ttl), messages the server writes into the \
                 stream when one expires, which break pgoutbox's chain; use a new --stream"
            )),
            _ => None,
        }
    }
}
