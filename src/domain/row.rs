//! A row as pgoutbox sees it: a relation's columns and one tuple's values. The pgoutput
//! decoder (`postgres::pgoutput`) fills these; the row mapping (`outbox`) reads them.

use bytes::Bytes;

/// A table as pgoutput describes it, before the first row after any change to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub rel_id: u32,
    pub namespace: String,
    pub name: String,
    pub replica_identity: u8,
    pub columns: Vec<Column>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// 1 when the column is part of the key.
    pub flags: u8,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

/// One column of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnValue {
    Null,
    /// A TOASTed value that did not change (updates only); its value is not sent.
    UnchangedToast,
    /// The type's text output.
    Text(Bytes),
    /// The type's binary output (only with the `binary` option).
    Binary(Bytes),
}

/// A bytea value in pgoutput's text format: `\x` and hex, or the escape format when the
/// server's `bytea_output` says so. `None` when it is neither.
pub fn bytea_text(text: &[u8]) -> Option<Bytes> {
    if let Some(hex) = text.strip_prefix(b"\\x") {
        // Every replayed frame and bytea payload passes here, twice its size in hex: one
        // pass into a buffer of the right size (collecting `Option`s cost a fifth of
        // pgoutbox's CPU in a replay).
        fn digit(c: u8) -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                b'A'..=b'F' => Some(c - b'A' + 10),
                _ => None,
            }
        }
        if hex.len() % 2 != 0 {
            return None;
        }
        let mut out = Vec::with_capacity(hex.len() / 2);
        for pair in hex.chunks_exact(2) {
            out.push(digit(pair[0])? << 4 | digit(pair[1])?);
        }
        return Some(Bytes::from(out));
    }
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some((&c, tail)) = rest.split_first() {
        match (c, tail) {
            (b'\\', [b'\\', tail @ ..]) => {
                out.push(b'\\');
                rest = tail;
            }
            (b'\\', [a @ b'0'..=b'3', b @ b'0'..=b'7', d @ b'0'..=b'7', tail @ ..]) => {
                out.push((a - b'0') << 6 | (b - b'0') << 3 | (d - b'0'));
                rest = tail;
            }
            (b'\\', _) => return None,
            _ => {
                out.push(c);
                rest = tail;
            }
        }
    }
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bytea_reads_in_either_output_format() {
        assert_eq!(bytea_text(b"\\x00ff10").as_deref(), Some(&[0u8, 0xff, 0x10][..]));
        assert_eq!(bytea_text(b"a\\\\b\\001").as_deref(), Some(&b"a\\b\x01"[..]));
        assert_eq!(bytea_text(b"\\x0"), None);
        assert_eq!(bytea_text(b"\\xzz"), None);
        assert_eq!(bytea_text(b"\\9"), None);
    }
}
