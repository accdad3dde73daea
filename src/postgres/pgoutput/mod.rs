//! The pgoutput decoder: bytes of one logical replication message in, a typed message out.
//!
//! Pure by design (no I/O, no async): every quirk of the format can be pinned down by a test
//! on bytes, and supporting proto_version 2 later stays a change to this module. Values are
//! `Bytes::slice`s of the input, so a row's payload reaches NATS without being copied.
//! Malformed input is an `Err`, never a panic. Format: PostgreSQL docs, "Logical
//! Replication Message Formats" (proto_version 1, no streaming).

mod cursor;
mod replayed;

use bytes::Bytes;

use cursor::Cursor;

pub use crate::domain::row::{Column, ColumnValue, Relation};
pub use replayed::{ADOPTION_ID, FrameWriter, ReplayFrame, ReplayedRows};

/// One pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalMessage {
    Begin(Begin),
    Commit(Commit),
    Origin(Origin),
    Relation(Relation),
    Type(TypeMessage),
    Insert(Insert),
    /// Parsed only as far as the relation; the outbox ignores updates.
    Update {
        rel_id: u32,
    },
    /// Parsed only as far as the relation; the outbox ignores deletes.
    Delete {
        rel_id: u32,
    },
    Truncate(Truncate),
    Message(DecodingMessage),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begin {
    /// The LSN of the commit record: known before the first row, unique per transaction.
    pub final_lsn: u64,
    /// Microseconds since 2000-01-01 UTC.
    pub commit_time: i64,
    pub xid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub flags: u8,
    pub commit_lsn: u64,
    /// The end of the commit record: what may be confirmed once the transaction is published.
    pub end_lsn: u64,
    pub commit_time: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub commit_lsn: u64,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeMessage {
    pub type_id: u32,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    pub rel_id: u32,
    pub tuple: Vec<ColumnValue>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    pub options: u8,
    pub rel_ids: Vec<u32>,
}

/// A message from `pg_logical_emit_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodingMessage {
    pub transactional: bool,
    pub lsn: u64,
    pub prefix: String,
    pub content: Bytes,
}

/// Why bytes are not a valid pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("pgoutput message ended early: needed {need} bytes at offset {at}")]
    UnexpectedEof { need: usize, at: usize },
    #[error("unknown pgoutput message tag {0:#04x}")]
    UnknownMessageTag(u8),
    #[error("unknown tuple column kind {kind:#04x} at offset {at}")]
    UnknownTupleKind { kind: u8, at: usize },
    #[error("expected tuple marker 'N' but found {found:#04x} at offset {at}")]
    UnexpectedTupleMarker { found: u8, at: usize },
    #[error("negative length {len} at offset {at}")]
    NegativeLength { len: i32, at: usize },
    #[error("string without its terminating NUL at offset {at}")]
    MissingNul { at: usize },
    #[error("string is not valid UTF-8 at offset {at}")]
    InvalidUtf8 { at: usize },
    #[error("{extra} unexpected bytes after a complete '{message}' message")]
    TrailingBytes { message: char, extra: usize },
    #[error("replayed row in an unknown format (version {0}): a newer pgoutbox replay wrote it")]
    UnknownReplayVersion(u8),
    #[error("replayed row with replay id {0:?}: ids are letters, digits, '.', '_' and '-'")]
    BadReplayId(String),
    #[error("empty pgoutput message")]
    Empty,
}

impl LogicalMessage {
    /// Decodes one message. `buf` is shared, not copied: values point into it.
    pub fn parse(buf: &Bytes) -> Result<LogicalMessage, DecodeError> {
        let mut cur = Cursor::new(buf.clone());
        let tag = cur.u8().map_err(|_| DecodeError::Empty)?;
        let message = match tag {
            b'B' => LogicalMessage::Begin(Begin {
                final_lsn: cur.u64()?,
                commit_time: cur.i64()?,
                xid: cur.u32()?,
            }),
            b'C' => LogicalMessage::Commit(Commit {
                flags: cur.u8()?,
                commit_lsn: cur.u64()?,
                end_lsn: cur.u64()?,
                commit_time: cur.i64()?,
            }),
            b'O' => LogicalMessage::Origin(Origin { commit_lsn: cur.u64()?, name: cur.cstr()? }),
            b'R' => LogicalMessage::Relation(parse_relation(&mut cur)?),
            b'Y' => LogicalMessage::Type(TypeMessage {
                type_id: cur.u32()?,
                namespace: cur.cstr()?,
                name: cur.cstr()?,
            }),
            b'I' => {
                let rel_id = cur.u32()?;
                let at = cur.position();
                let marker = cur.u8()?;
                if marker != b'N' {
                    return Err(DecodeError::UnexpectedTupleMarker { found: marker, at });
                }
                LogicalMessage::Insert(Insert { rel_id, tuple: parse_tuple(&mut cur)? })
            }
            // The rest of an Update or Delete is not needed: the outbox is insert-only.
            b'U' => return Ok(LogicalMessage::Update { rel_id: cur.u32()? }),
            b'D' => return Ok(LogicalMessage::Delete { rel_id: cur.u32()? }),
            b'T' => {
                let count = cur.u32()?;
                let options = cur.u8()?;
                // Each id is 4 bytes: refuse a count the input cannot hold before allocating.
                if cur.remaining() < count as usize * 4 {
                    return Err(DecodeError::UnexpectedEof {
                        need: count as usize * 4,
                        at: cur.position(),
                    });
                }
                let rel_ids = (0..count).map(|_| cur.u32()).collect::<Result<_, _>>()?;
                LogicalMessage::Truncate(Truncate { options, rel_ids })
            }
            b'M' => {
                let transactional = cur.u8()? == 1;
                let lsn = cur.u64()?;
                let prefix = cur.cstr()?;
                let at = cur.position();
                let len = cur.i32()?;
                let len =
                    usize::try_from(len).map_err(|_| DecodeError::NegativeLength { len, at })?;
                let content = cur.bytes(len)?;
                LogicalMessage::Message(DecodingMessage { transactional, lsn, prefix, content })
            }
            other => return Err(DecodeError::UnknownMessageTag(other)),
        };
        match cur.remaining() {
            0 => Ok(message),
            extra => Err(DecodeError::TrailingBytes { message: tag as char, extra }),
        }
    }
}

fn parse_relation(cur: &mut Cursor) -> Result<Relation, DecodeError> {
    let rel_id = cur.u32()?;
    let namespace = cur.cstr()?;
    let name = cur.cstr()?;
    let replica_identity = cur.u8()?;
    let count = column_count(cur)?;
    let mut columns = Vec::with_capacity(count);
    for _ in 0..count {
        columns.push(Column {
            flags: cur.u8()?,
            name: cur.cstr()?,
            type_oid: cur.u32()?,
            type_modifier: cur.i32()?,
        });
    }
    Ok(Relation { rel_id, namespace, name, replica_identity, columns })
}

fn parse_tuple(cur: &mut Cursor) -> Result<Vec<ColumnValue>, DecodeError> {
    let count = column_count(cur)?;
    let mut values = Vec::with_capacity(count);
    for _ in 0..count {
        let at = cur.position();
        let value = match cur.u8()? {
            b'n' => ColumnValue::Null,
            b'u' => ColumnValue::UnchangedToast,
            kind @ (b't' | b'b') => {
                let len_at = cur.position();
                let len = cur.i32()?;
                let len = usize::try_from(len)
                    .map_err(|_| DecodeError::NegativeLength { len, at: len_at })?;
                let bytes = cur.bytes(len)?;
                if kind == b't' { ColumnValue::Text(bytes) } else { ColumnValue::Binary(bytes) }
            }
            kind => return Err(DecodeError::UnknownTupleKind { kind, at }),
        };
        values.push(value);
    }
    Ok(values)
}

/// A column count, refused when negative or larger than the remaining bytes could hold
/// (each column needs at least one byte), so garbage cannot make us allocate gigabytes.
fn column_count(cur: &mut Cursor) -> Result<usize, DecodeError> {
    let at = cur.position();
    let count = cur.i16()?;
    let count = usize::try_from(count)
        .map_err(|_| DecodeError::NegativeLength { len: i32::from(count), at })?;
    if count > cur.remaining() {
        return Err(DecodeError::UnexpectedEof { need: count, at: cur.position() });
    }
    Ok(count)
}

#[cfg(test)]
mod tests;
