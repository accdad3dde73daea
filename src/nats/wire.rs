//! The NATS client protocol, as far as publishing needs it: the frames pgoutbox writes
//! (`CONNECT`, `SUB`, `HPUB`, `PONG`) and a parser of what the server sends (`INFO`, `MSG`,
//! `HMSG`, `PING`, `PONG`, `+OK`, `-ERR`). No I/O: every quirk is tested on bytes, and any
//! byte string parses to an operation, "need more", or an error, never a panic.

use std::fmt::Write as _;

use bytes::{BufMut, BytesMut};

/// The server's `INFO`, the fields publishing needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct ServerInfo {
    #[serde(default)]
    pub max_payload: usize,
    #[serde(default)]
    pub tls_required: bool,
    #[serde(default)]
    pub headers: bool,
    /// To sign for NKey and JWT authentication.
    #[serde(default)]
    pub nonce: Option<String>,
    /// The cluster's other servers, as the server announces them.
    #[serde(default)]
    pub connect_urls: Vec<String>,
}

/// One operation from the server.
#[derive(Debug, PartialEq, Eq)]
pub enum ServerOp<'a> {
    Info(ServerInfo),
    Message(Delivery<'a>),
    Ping,
    Pong,
    Ok,
    Err(String),
}

/// A message delivered on a subscription (`MSG` or `HMSG`), borrowed from the read buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Delivery<'a> {
    pub subject: &'a str,
    /// The status of a header block's first line (`NATS/1.0 503`), if it has one.
    pub status: Option<u16>,
    pub payload: &'a [u8],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the NATS server sent an unknown operation {0:?}")]
    UnknownOperation(String),
    #[error("the NATS server sent a malformed {op} line: {line:?}")]
    Malformed { op: &'static str, line: String },
    #[error("the NATS server sent a control line longer than {MAX_CONTROL_LINE} bytes")]
    LineTooLong,
    #[error("the NATS server announced a message of {0} bytes, beyond any server's limit")]
    TooLarge(usize),
}

/// Longer than any `INFO` a cluster announces; a server that sends more is not NATS.
const MAX_CONTROL_LINE: usize = 1 << 20;
/// nats-server refuses `max_payload` above 64 MiB.
const MAX_MESSAGE: usize = 64 << 20;

/// Parses the first operation in `buf`: the operation and how many bytes it took, `None`
/// when `buf` holds only part of one.
pub fn parse(buf: &[u8]) -> Result<Option<(ServerOp<'_>, usize)>, WireError> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() > MAX_CONTROL_LINE { Err(WireError::LineTooLong) } else { Ok(None) };
    };
    let line = &buf[..end];
    let after_line = end + 2;
    let (op, args) = match line.iter().position(|&b| b == b' ' || b == b'\t') {
        Some(space) => (&line[..space], &line[space + 1..]),
        None => (line, &b""[..]),
    };
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let malformed = |op| WireError::Malformed { op, line: text(line) };
    let simple = |op| Ok(Some((op, after_line)));
    match op.to_ascii_uppercase().as_slice() {
        b"PING" => simple(ServerOp::Ping),
        b"PONG" => simple(ServerOp::Pong),
        b"+OK" => simple(ServerOp::Ok),
        b"-ERR" => {
            let why = text(args);
            simple(ServerOp::Err(why.trim().trim_matches('\'').to_owned()))
        }
        b"INFO" => {
            let info = serde_json::from_slice(args).map_err(|_| malformed("INFO"))?;
            simple(ServerOp::Info(info))
        }
        b"MSG" => message(buf, args, after_line, false).map_err(|()| malformed("MSG")),
        b"HMSG" => message(buf, args, after_line, true).map_err(|()| malformed("HMSG")),
        _ => Err(WireError::UnknownOperation(text(op))),
    }
    .and_then(|parsed| match parsed {
        Some((ServerOp::Message(ref d), _)) if d.payload.len() > MAX_MESSAGE => {
            Err(WireError::TooLarge(d.payload.len()))
        }
        parsed => Ok(parsed),
    })
}

/// `MSG <subject> <sid> [reply] <size>` or `HMSG <subject> <sid> [reply] <header size>
/// <size>`, then the body and `\r\n`.
#[allow(clippy::type_complexity)]
fn message<'a>(
    buf: &'a [u8],
    args: &'a [u8],
    body_at: usize,
    with_headers: bool,
) -> Result<Option<(ServerOp<'a>, usize)>, ()> {
    let args = std::str::from_utf8(args).map_err(|_| ())?;
    let fields: Vec<&str> = args.split_ascii_whitespace().collect();
    let sizes = if with_headers { 2 } else { 1 };
    if !(2 + sizes..=3 + sizes).contains(&fields.len()) {
        return Err(());
    }
    let size = |field: &str| field.parse::<usize>().map_err(|_| ());
    let total = size(fields[fields.len() - 1])?;
    let header_len = if with_headers { size(fields[fields.len() - 2])? } else { 0 };
    if header_len > total || total > MAX_MESSAGE {
        return Err(());
    }
    let end = body_at + total;
    if buf.len() < end + 2 {
        return Ok(None);
    }
    if &buf[end..end + 2] != b"\r\n" {
        return Err(());
    }
    let status = if with_headers { status(&buf[body_at..body_at + header_len])? } else { None };
    let delivery =
        Delivery { subject: fields[0], status, payload: &buf[body_at + header_len..end] };
    Ok(Some((ServerOp::Message(delivery), end + 2)))
}

/// The status on a header block's first line: `NATS/1.0`, or `NATS/1.0 503 [text]`.
fn status(block: &[u8]) -> Result<Option<u16>, ()> {
    let first = block.split(|&b| b == b'\r').next().unwrap_or_default();
    let rest = first.strip_prefix(b"NATS/1.0").ok_or(())?;
    let code = rest.trim_ascii_start().split(|&b| b == b' ').next().unwrap_or_default();
    if code.is_empty() {
        return Ok(None);
    }
    let code = std::str::from_utf8(code).map_err(|_| ())?;
    code.parse().map(Some).map_err(|_| ())
}

/// A header block under construction: `NATS/1.0\r\n`, `Name: value\r\n` each, `\r\n`. Names
/// and values must already be valid (no `:` in a name, no line break in either).
pub struct HeaderBlock<'a> {
    buf: &'a mut BytesMut,
    start: usize,
}

impl<'a> HeaderBlock<'a> {
    pub fn start(buf: &'a mut BytesMut) -> Self {
        let start = buf.len();
        buf.put_slice(b"NATS/1.0\r\n");
        HeaderBlock { buf, start }
    }

    pub fn add(&mut self, name: &str, value: &str) {
        self.buf.put_slice(name.as_bytes());
        self.buf.put_slice(b": ");
        self.buf.put_slice(value.as_bytes());
        self.buf.put_slice(b"\r\n");
    }

    /// Adds headers already written as `Name: value\r\n` lines.
    pub fn add_lines(&mut self, lines: &str) {
        self.buf.put_slice(lines.as_bytes());
    }

    /// Like [`HeaderBlock::add`], the value written by `value`.
    pub fn add_display(&mut self, name: &str, value: impl std::fmt::Display) {
        self.buf.put_slice(name.as_bytes());
        self.buf.put_slice(b": ");
        let _ = write!(self.buf, "{value}");
        self.buf.put_slice(b"\r\n");
    }

    /// Closes the block and returns its length.
    pub fn finish(self) -> usize {
        self.buf.put_slice(b"\r\n");
        self.buf.len() - self.start
    }
}

/// Appends `HPUB <subject> <reply_prefix><token> <header size> <size>\r\n<headers><payload>
/// \r\n`, the header block taken from `headers` (built with [`HeaderBlock`]).
pub fn write_hpub(
    out: &mut BytesMut,
    subject: &str,
    (reply_prefix, token): (&str, u64),
    headers: &[u8],
    payload: &[u8],
) {
    out.reserve(subject.len() + reply_prefix.len() + 64 + headers.len() + payload.len());
    out.put_slice(b"HPUB ");
    out.put_slice(subject.as_bytes());
    out.put_u8(b' ');
    out.put_slice(reply_prefix.as_bytes());
    let _ = write!(out, "{token} {} {}\r\n", headers.len(), headers.len() + payload.len());
    out.put_slice(headers);
    out.put_slice(payload);
    out.put_slice(b"\r\n");
}

/// Appends `SUB <subject> <sid>\r\n`.
pub fn write_sub(out: &mut BytesMut, subject: &str, sid: u64) {
    let _ = write!(out, "SUB {subject} {sid}\r\n");
}

/// Whether `subject` can be published without breaking the framing: non-empty, and no
/// space, tab or line break (the server itself refuses wildcards, as it always has).
pub fn publishable(subject: &str) -> bool {
    !subject.is_empty() && !subject.contains([' ', '\t', '\r', '\n'])
}

#[cfg(test)]
mod tests;
