//! The walsender connection, built on postgres-protocol over a raw socket.
//!
//! tokio-postgres on crates.io cannot open a `replication=database` session nor speak
//! CopyBoth, so this type does the little that is needed: startup, authentication (trust,
//! cleartext, md5, SCRAM-SHA-256), simple queries, `START_REPLICATION`, then reading
//! replication messages and writing standby status updates. It knows nothing of outbox rows
//! or NATS.
//!
//! Logging in lives in `walsender/login.rs`. Reads go through one `BytesMut`; a frame is
//! split off it and frozen, so pgoutput payloads reach the decoder without a copy. [`ReplicationConnection::next_message`] only
//! awaits `read_buf`, so it is cancel-safe inside `tokio::select!`.

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::escape::escape_identifier;
use postgres_protocol::message::{backend, frontend};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::debug;

use super::backend::{ServerError, message_name, server_error};
use super::socket::Socket;
use super::wire::{ReplicationMessage, StandbyStatus, WireError, status_keepalive};

mod login;
pub use login::user_name;

/// What can go wrong on the replication connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("could not connect to Postgres at {target}: {source}")]
    Connect { target: String, source: io::Error },
    #[error("Postgres connection lost: {0}")]
    Io(#[from] io::Error),
    #[error("Postgres: {0}")]
    Server(ServerError),
    #[error("authentication failed: {0}")]
    Auth(String),
    /// `--database-password-command` failed or hung: retried like a refused login.
    #[error(transparent)]
    PasswordCommand(crate::postgres::password_command::PasswordCommandError),
    #[error("unexpected replication protocol message: {0}")]
    Protocol(String),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("the server ended the replication stream")]
    StreamEnded,
    #[error("Postgres TLS: {0}")]
    Tls(String),
    /// The connection looks open but the server no longer answers (see `liveness`), or the
    /// handshake did not finish within `connect_timeout`.
    #[error("Postgres stopped answering: {0}")]
    Unresponsive(String),
    /// No host of the list is what `target_session_attrs` asks for (a standby, say).
    #[error("Postgres at {target} does not match target_session_attrs={wanted:?}")]
    SessionAttrs { target: String, wanted: tokio_postgres::config::TargetSessionAttrs },
}

/// The answer to `IDENTIFY_SYSTEM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemIdentity {
    pub system_id: u64,
    pub timeline: u32,
    /// The server's current WAL flush position.
    pub wal_end: u64,
    pub database: String,
}

/// A new slot's consistent point and the snapshot exported there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedSnapshot {
    pub consistent_point: u64,
    pub name: String,
}

/// One row of a simple query's result, as text.
pub type TextRow = Vec<Option<String>>;

pub struct ReplicationConnection {
    socket: Box<dyn Socket>,
    read_buf: BytesMut,
    write_buf: BytesMut,
    /// The walsender's process id (BackendKeyData), which `liveness` looks for as the
    /// slot's `active_pid`.
    backend_pid: Option<i32>,
    /// The server's `wal_sender_timeout`; `None` when disabled (0).
    wal_sender_timeout: Option<Duration>,
}

const READ_CHUNK: usize = 64 * 1024;
impl ReplicationConnection {
    /// The walsender's process id, as the server announced it at startup.
    pub fn backend_pid(&self) -> Option<i32> {
        self.backend_pid
    }

    /// The server's `wal_sender_timeout` (`None`: disabled): the walsender ends a session
    /// from which it heard nothing for that long.
    pub fn wal_sender_timeout(&self) -> Option<Duration> {
        self.wal_sender_timeout
    }

    /// The longest the client may stay silent towards the walsender: half its
    /// `wal_sender_timeout`, at most 10 s. The server pings after half the timeout, but a
    /// client that has stopped reading (its ack window full) never sees the ping, so its
    /// own unprompted status updates are what keep the session alive.
    pub fn status_keepalive(&self) -> Duration {
        status_keepalive(self.wal_sender_timeout)
    }

    /// Runs a replication command or SQL query and returns its rows as text.
    pub async fn simple_query(&mut self, query: &str) -> Result<Vec<TextRow>, ConnectionError> {
        frontend::query(query, &mut self.write_buf)?;
        self.flush().await?;
        let mut rows = Vec::new();
        let mut failure = None;
        loop {
            match self.next_backend_message().await {
                Ok(backend::Message::ReadyForQuery(_)) => break,
                Ok(backend::Message::DataRow(row)) => rows.push(text_row(&row)?),
                Ok(_) => {}
                Err(ConnectionError::Server(err)) => failure = Some(err),
                Err(err) => return Err(err),
            }
        }
        match failure {
            Some(err) => Err(ConnectionError::Server(err)),
            None => Ok(rows),
        }
    }

    /// `IDENTIFY_SYSTEM`: who the server is and where its WAL ends, to tell this source's
    /// history from another's (see `crate::domain::source`).
    pub async fn identify_system(&mut self) -> Result<SystemIdentity, ConnectionError> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        let field = |i: usize| rows.first().and_then(|row| row.get(i)).and_then(Option::as_deref);
        let malformed = || ConnectionError::Protocol("malformed IDENTIFY_SYSTEM answer".into());
        let wal_end: tokio_postgres::types::PgLsn =
            field(2).and_then(|lsn| lsn.parse().ok()).ok_or_else(malformed)?;
        Ok(SystemIdentity {
            system_id: field(0).and_then(|id| id.parse().ok()).ok_or_else(malformed)?,
            timeline: field(1).and_then(|tli| tli.parse().ok()).ok_or_else(malformed)?,
            wal_end: wal_end.into(),
            database: field(3).unwrap_or_default().to_owned(),
        })
    }

    /// The history file of `timeline` (`TIMELINE_HISTORY`); timeline 1 has none.
    pub async fn timeline_history(&mut self, timeline: u32) -> Result<String, ConnectionError> {
        if timeline <= 1 {
            return Ok(String::new());
        }
        let rows = self.simple_query(&format!("TIMELINE_HISTORY {timeline}")).await?;
        Ok(rows.first().and_then(|row| row.get(1)).cloned().flatten().unwrap_or_default())
    }

    /// Creates logical slot `slot` (pgoutput) and exports the snapshot it became consistent
    /// at: every transaction is either visible in that snapshot or decoded from the slot,
    /// never both. The snapshot lives until this connection runs its next command; import it
    /// first (`SET TRANSACTION SNAPSHOT`). The syntax is the one every supported release
    /// still accepts.
    pub async fn create_slot_exporting_snapshot(
        &mut self,
        slot: &str,
    ) -> Result<ExportedSnapshot, ConnectionError> {
        let command = format!(
            "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT",
            escape_identifier(slot)
        );
        let rows = self.simple_query(&command).await?;
        let field = |i: usize| rows.first().and_then(|row| row.get(i)).and_then(Option::as_deref);
        let malformed =
            || ConnectionError::Protocol("malformed CREATE_REPLICATION_SLOT answer".into());
        let consistent_point: tokio_postgres::types::PgLsn =
            field(1).and_then(|lsn| lsn.parse().ok()).ok_or_else(malformed)?;
        Ok(ExportedSnapshot {
            consistent_point: consistent_point.into(),
            name: field(2).ok_or_else(malformed)?.to_owned(),
        })
    }

    /// Sends `START_REPLICATION` and waits for the server to enter CopyBoth mode. With
    /// `messages`, pgoutput also sends `pg_logical_emit_message` messages (PostgreSQL 14+).
    pub async fn start_replication(
        &mut self,
        slot: &str,
        start_lsn: u64,
        publication: &str,
    ) -> Result<(), ConnectionError> {
        let query = format!(
            "START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names {}, \
             messages 'true')",
            escape_identifier(slot),
            tokio_postgres::types::PgLsn::from(start_lsn),
            command_literal(&escape_identifier(publication)),
        );
        debug!(%query, "starting replication");
        frontend::query(&query, &mut self.write_buf)?;
        self.flush().await?;
        loop {
            self.fill_frame().await?;
            if self.read_buf[0] == b'W' {
                let _ = self.split_frame();
                return Ok(());
            }
            match self.next_backend_message().await {
                Ok(backend::Message::NoticeResponse(_)) => {}
                Ok(other) => return Err(unexpected(&other)),
                Err(ConnectionError::Server(err)) => {
                    // The server follows an error with ReadyForQuery; the session stays usable.
                    let _ = self.wait_ready().await;
                    return Err(ConnectionError::Server(err));
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// The next message of the replication stream. Cancel-safe.
    pub async fn next_message(&mut self) -> Result<ReplicationMessage, ConnectionError> {
        loop {
            self.fill_frame().await?;
            match self.read_buf[0] {
                b'd' => {
                    let (_, payload) = self.split_frame();
                    return Ok(ReplicationMessage::parse(payload)?);
                }
                b'c' => return Err(ConnectionError::StreamEnded),
                _ => match self.next_backend_message().await? {
                    backend::Message::NoticeResponse(_) | backend::Message::ParameterStatus(_) => {}
                    other => return Err(unexpected(&other)),
                },
            }
        }
    }

    /// The next message when a whole CopyData frame is already read, without waiting, so
    /// that the messages one read brought are handled in one go. A partial frame, another
    /// kind of message or a bad length is left to [`Self::next_message`].
    pub fn buffered_message(&mut self) -> Option<Result<ReplicationMessage, ConnectionError>> {
        let len = frame_len(&self.read_buf).ok().flatten()?;
        if self.read_buf.len() < len || self.read_buf[0] != b'd' {
            return None;
        }
        let (_, payload) = self.split_frame();
        Some(ReplicationMessage::parse(payload).map_err(ConnectionError::from))
    }

    /// Reports `status.confirmed` as written, flushed and applied.
    pub async fn send_status(&mut self, status: StandbyStatus) -> Result<(), ConnectionError> {
        frontend::CopyData::new(status.encode())?.write(&mut self.write_buf);
        self.flush().await
    }

    /// Ends a session that never started streaming; errors are irrelevant at this point.
    pub async fn terminate(mut self) {
        frontend::terminate(&mut self.write_buf);
        let _ = self.flush().await;
    }

    /// Ends the session politely; errors are irrelevant at this point.
    pub async fn close(mut self) {
        frontend::copy_done(&mut self.write_buf);
        frontend::terminate(&mut self.write_buf);
        let _ = self.flush().await;
    }

    async fn flush(&mut self) -> Result<(), ConnectionError> {
        self.socket.write_all(&self.write_buf).await?;
        self.write_buf.clear();
        self.socket.flush().await?;
        Ok(())
    }

    /// Reads until `read_buf` holds at least one whole frame.
    async fn fill_frame(&mut self) -> Result<(), ConnectionError> {
        loop {
            if let Some(len) = frame_len(&self.read_buf)? {
                if self.read_buf.len() >= len {
                    return Ok(());
                }
                self.read_buf.reserve(len - self.read_buf.len());
            } else {
                self.read_buf.reserve(READ_CHUNK);
            }
            if self.socket.read_buf(&mut self.read_buf).await? == 0 {
                return Err(ConnectionError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }

    /// Takes the whole frame at the front of `read_buf`: its tag and its body.
    fn split_frame(&mut self) -> (u8, Bytes) {
        let len = frame_len(&self.read_buf).ok().flatten().unwrap_or(self.read_buf.len());
        let frame = self.read_buf.split_to(len).freeze();
        (frame[0], frame.slice(5..))
    }

    /// Reads one ordinary backend message; an ErrorResponse becomes `Err(Server)`.
    async fn next_backend_message(&mut self) -> Result<backend::Message, ConnectionError> {
        self.fill_frame().await?;
        let message = backend::Message::parse(&mut self.read_buf)?.ok_or_else(|| {
            ConnectionError::Protocol("incomplete frame after a full read".into())
        })?;
        match message {
            backend::Message::ErrorResponse(body) => {
                Err(ConnectionError::Server(server_error(body.fields())?))
            }
            other => Ok(other),
        }
    }
}

/// The length of the frame at the front of `buf` (tag byte included), once its header is in.
/// The length field counts itself, so one below 4 is no frame: refused, where reading the
/// body after the header would have panicked.
fn frame_len(buf: &[u8]) -> Result<Option<usize>, ConnectionError> {
    let Some(header) = buf.get(1..5) else { return Ok(None) };
    let declared = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    if declared < 4 {
        return Err(ConnectionError::Protocol(format!(
            "a message of tag {:?} declares {declared} bytes, fewer than its length field",
            char::from(buf[0])
        )));
    }
    Ok(Some(1 + declared as usize))
}

fn text_row(row: &backend::DataRowBody) -> Result<TextRow, ConnectionError> {
    let buffer = row.buffer();
    let mut ranges = row.ranges();
    let mut values = Vec::new();
    while let Some(range) = ranges.next()? {
        values.push(range.map(|r| String::from_utf8_lossy(&buffer[r]).into_owned()));
    }
    Ok(values)
}

fn unexpected(message: &backend::Message) -> ConnectionError {
    ConnectionError::Protocol(message_name(message).to_owned())
}

/// Quotes a string for a replication command's option (`'a''b'`). The walsender's command
/// grammar knows only standard strings, so `escape_literal`'s `E'…'` form cannot be used.
fn command_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_len_needs_the_whole_header() {
        assert_eq!(frame_len(b"d\0\0\0").ok(), Some(None));
        assert_eq!(frame_len(b"d\0\0\0\x08abcd").ok(), Some(Some(9)));
        assert_eq!(frame_len(b"d\0\0\0\x04").ok(), Some(Some(5)));
    }

    #[test]
    fn a_length_field_below_its_own_size_is_refused() {
        for short in 0..4u8 {
            let frame = [b'd', 0, 0, 0, short];
            let err = frame_len(&frame).expect_err("no frame is shorter than its header");
            assert!(err.to_string().contains("fewer than its length field"), "{err}");
        }
    }

    #[test]
    fn quoting_doubles_the_quote_character() {
        assert_eq!(command_literal(&escape_identifier("it's")), "'\"it''s\"'");
    }
}
