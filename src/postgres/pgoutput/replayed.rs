//! Rows `pgoutbox replay` hands to the running pgoutbox through the WAL: the `frame` of a
//! row it inserts into the replay table (`postgres::outbox_table::replay_table`), which only
//! roles the operator granted INSERT may write. Decoded in commit order like any change,
//! each row is published by the pipeline in that place, chained like every other message,
//! so a replay into a live stream never writes beside it.
//!
//! A frame carries several rows of one relation, in pgoutput's own formats (the Relation
//! message body once, then each row's TupleData), so the pipeline maps them exactly as it
//! maps an Insert. Several rows to a frame because every row of the replay table costs an
//! insert, a delete, their WAL records and their decoding: a frame of a few kilobytes costs
//! that once for all its rows. A replay ends with a mark that carries no row, so that its
//! progress reaches its total even when its last rows were passed over.
//!
//! ```text
//! u8 version (1) | 'M' | cstr replay id | u64 rows | u64 total | Relation | rows × (u64 index | TupleData)
//! u8 version (1) | 'R' | cstr replay id | u64 index | u64 total | Relation | TupleData
//! u8 version (1) | 'E' | cstr replay id | u64 total | u64 total
//! u8 version (1) | 'A' | cstr "adoption" | u64 rows | u64 0 | Relation | rows × (u64 index | TupleData)
//! ```
//!
//! `'A'` carries the rows already in a table a pattern matches, read by pgoutbox when it
//! adds the table to the publication (`postgres::adoption`): they are published as that
//! table's own Inserts would be, under their own ids, since the stream never held them.
//!
//! `'R'`, one row to a frame, is what replays before 2026-11-27 wrote: still read, so that
//! rows they handed over and left waiting in the slot are published after an upgrade.

use bytes::{BufMut, Bytes};

use super::cursor::Cursor;
use super::{ColumnValue, DecodeError, Relation, parse_relation, parse_tuple};
use crate::domain::seed::is_replay_id;

const VERSION: u8 = 1;

/// What a replay hands over: rows, or its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayFrame {
    Rows(ReplayedRows),
    End {
        replay_id: String,
        total: u64,
    },
    /// Rows an adoption read from a table that joined the publication (`replay_id` is
    /// [`ADOPTION_ID`], `total` 0, and each index the row's place in the table's read).
    Adopted(ReplayedRows),
}

/// The id an adoption's frames carry in the place of a replay's.
pub const ADOPTION_ID: &str = "adoption";

/// Replayed rows of one relation, and where each stands in its replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayedRows {
    pub replay_id: String,
    pub total: u64,
    pub relation: Relation,
    /// Each row's place among the rows this run of the replay selected (from 1 to `total`),
    /// and its values.
    pub rows: Vec<(u64, Vec<ColumnValue>)>,
}

impl ReplayFrame {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ReplayFrame::Rows(rows) | ReplayFrame::Adopted(rows) => {
                let kind = if matches!(self, ReplayFrame::Rows(_)) { b'M' } else { b'A' };
                let mut frame =
                    FrameWriter::of_kind(kind, &rows.replay_id, rows.total, &rows.relation);
                for (index, tuple) in &rows.rows {
                    frame.push(*index, tuple);
                }
                frame.finish()
            }
            ReplayFrame::End { replay_id, total } => {
                let mut out = Vec::with_capacity(24 + replay_id.len());
                out.put_u8(VERSION);
                out.put_u8(b'E');
                put_cstr(&mut out, replay_id);
                out.put_u64(*total);
                out.put_u64(*total);
                out
            }
        }
    }

    /// Values are slices of `content`, not copies.
    pub fn decode(content: &Bytes) -> Result<ReplayFrame, DecodeError> {
        let mut cur = Cursor::new(content.clone());
        match cur.u8().map_err(|_| DecodeError::Empty)? {
            VERSION => {}
            other => return Err(DecodeError::UnknownReplayVersion(other)),
        }
        let kind = cur.u8()?;
        let (replay_id, index_or_rows, total) = (cur.cstr()?, cur.u64()?, cur.u64()?);
        if !is_replay_id(&replay_id) {
            return Err(DecodeError::BadReplayId(replay_id));
        }
        let frame = match kind {
            b'M' | b'A' => {
                let relation = parse_relation(&mut cur)?;
                // Not allocated by the count it states: every row takes bytes, so a count
                // larger than the frame holds ends at its end.
                let mut rows = Vec::new();
                for _ in 0..index_or_rows {
                    rows.push((cur.u64()?, parse_tuple(&mut cur)?));
                }
                let rows = ReplayedRows { replay_id, total, relation, rows };
                match kind {
                    b'M' => ReplayFrame::Rows(rows),
                    _ => ReplayFrame::Adopted(rows),
                }
            }
            b'R' => {
                let relation = parse_relation(&mut cur)?;
                let rows = vec![(index_or_rows, parse_tuple(&mut cur)?)];
                ReplayFrame::Rows(ReplayedRows { replay_id, total, relation, rows })
            }
            b'E' => ReplayFrame::End { replay_id, total },
            other => return Err(DecodeError::UnknownMessageTag(other)),
        };
        match cur.remaining() {
            0 => Ok(frame),
            extra => Err(DecodeError::TrailingBytes { message: kind as char, extra }),
        }
    }
}

/// A frame of rows written as they come: `pgoutbox replay` adds rows until the frame is
/// large enough, without holding them twice.
pub struct FrameWriter {
    out: Vec<u8>,
    /// Where the row count stands, written at the end.
    count_at: usize,
    rows: u64,
}

impl FrameWriter {
    /// A frame of a replay's rows.
    pub fn new(replay_id: &str, total: u64, relation: &Relation) -> FrameWriter {
        FrameWriter::of_kind(b'M', replay_id, total, relation)
    }

    /// A frame of an adoption's rows ([`ReplayFrame::Adopted`]).
    pub fn adoption(relation: &Relation) -> FrameWriter {
        FrameWriter::of_kind(b'A', ADOPTION_ID, 0, relation)
    }

    fn of_kind(kind: u8, replay_id: &str, total: u64, relation: &Relation) -> FrameWriter {
        let mut out = Vec::with_capacity(4096);
        out.put_u8(VERSION);
        out.put_u8(kind);
        put_cstr(&mut out, replay_id);
        let count_at = out.len();
        out.put_u64(0);
        out.put_u64(total);
        out.put_u32(relation.rel_id);
        put_cstr(&mut out, &relation.namespace);
        put_cstr(&mut out, &relation.name);
        out.put_u8(relation.replica_identity);
        out.put_i16(relation.columns.len() as i16);
        for column in &relation.columns {
            out.put_u8(column.flags);
            put_cstr(&mut out, &column.name);
            out.put_u32(column.type_oid);
            out.put_i32(column.type_modifier);
        }
        FrameWriter { out, count_at, rows: 0 }
    }

    /// The bytes [`push`](Self::push) adds for `tuple`.
    pub fn row_len(tuple: &[ColumnValue]) -> usize {
        let value_len = |value: &ColumnValue| match value {
            ColumnValue::Text(bytes) | ColumnValue::Binary(bytes) => bytes.len() + 5,
            ColumnValue::Null | ColumnValue::UnchangedToast => 1,
        };
        8 + 2 + tuple.iter().map(value_len).sum::<usize>()
    }

    pub fn push(&mut self, index: u64, tuple: &[ColumnValue]) {
        let out = &mut self.out;
        out.put_u64(index);
        out.put_i16(tuple.len() as i16);
        for value in tuple {
            match value {
                ColumnValue::Null => out.put_u8(b'n'),
                ColumnValue::UnchangedToast => out.put_u8(b'u'),
                ColumnValue::Text(bytes) | ColumnValue::Binary(bytes) => {
                    out.put_u8(if matches!(value, ColumnValue::Text(_)) { b't' } else { b'b' });
                    // A Postgres value is at most 1 GB.
                    out.put_i32(bytes.len() as i32);
                    out.put_slice(bytes);
                }
            }
        }
        self.rows += 1;
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> usize {
        self.out.len()
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.out[self.count_at..self.count_at + 8].copy_from_slice(&self.rows.to_be_bytes());
        self.out
    }
}

fn put_cstr(out: &mut Vec<u8>, text: &str) {
    // A NUL inside would end the string early: Postgres names and our ids never hold one.
    out.put_slice(text.replace('\0', "").as_bytes());
    out.put_u8(0);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::postgres::pgoutput::Column;

    fn relation() -> Relation {
        let column = |name: &str, type_oid| Column {
            flags: 0,
            name: name.into(),
            type_oid,
            type_modifier: -1,
        };
        Relation {
            rel_id: 16384,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: vec![column("id", 2950), column("payload", 3802), column("h", 3802)],
        }
    }

    fn tuple() -> Vec<ColumnValue> {
        vec![
            ColumnValue::Text(Bytes::from_static(b"7f0c")),
            ColumnValue::Binary(Bytes::from_static(&[0, 1, 2])),
            ColumnValue::Null,
        ]
    }

    fn rows() -> ReplayedRows {
        ReplayedRows {
            replay_id: "r1764050000".into(),
            total: 10,
            relation: relation(),
            rows: vec![(3, tuple()), (7, vec![ColumnValue::UnchangedToast])],
        }
    }

    fn round_trip(frame: ReplayFrame) {
        assert_eq!(ReplayFrame::decode(&Bytes::from(frame.encode())), Ok(frame));
    }

    #[test]
    fn rows_and_an_end_come_back_as_they_went() {
        round_trip(ReplayFrame::Rows(rows()));
        round_trip(ReplayFrame::End { replay_id: "nightly".into(), total: 42 });
        let adopted = ReplayedRows { replay_id: ADOPTION_ID.into(), total: 0, ..rows() };
        round_trip(ReplayFrame::Adopted(adopted));
    }

    /// A one-row frame as replays before several-row frames wrote it, byte by byte.
    fn one_row_frame() -> Vec<u8> {
        let mut out = vec![1, b'R'];
        out.extend_from_slice(b"r1764050000\0");
        out.extend_from_slice(&3u64.to_be_bytes());
        out.extend_from_slice(&10u64.to_be_bytes());
        out.extend_from_slice(&16384u32.to_be_bytes());
        out.extend_from_slice(b"public\0outbox\0d");
        out.extend_from_slice(&1i16.to_be_bytes());
        out.extend_from_slice(b"\0id\0");
        out.extend_from_slice(&25u32.to_be_bytes());
        out.extend_from_slice(&(-1i32).to_be_bytes());
        out.extend_from_slice(&1i16.to_be_bytes());
        out.extend_from_slice(b"t");
        out.extend_from_slice(&4i32.to_be_bytes());
        out.extend_from_slice(b"7f0c");
        out
    }

    #[test]
    fn a_one_row_frame_of_an_older_replay_is_still_read() {
        let Ok(ReplayFrame::Rows(rows)) = ReplayFrame::decode(&Bytes::from(one_row_frame())) else {
            panic!("the one-row frame was not read");
        };
        assert_eq!((rows.replay_id.as_str(), rows.total), ("r1764050000", 10));
        assert_eq!(rows.relation.columns[0].name, "id");
        assert_eq!(rows.rows, vec![(3, vec![ColumnValue::Text(Bytes::from_static(b"7f0c"))])]);
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let mut bytes = ReplayFrame::Rows(rows()).encode();
        bytes[0] = 2;
        let err = ReplayFrame::decode(&Bytes::from(bytes));
        assert_eq!(err, Err(DecodeError::UnknownReplayVersion(2)));
    }

    #[test]
    fn a_row_count_larger_than_the_frame_ends_at_its_end() {
        let mut bytes = ReplayFrame::Rows(rows()).encode();
        let at = 2 + "r1764050000".len() + 1;
        bytes[at..at + 8].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(matches!(
            ReplayFrame::decode(&Bytes::from(bytes)),
            Err(DecodeError::UnexpectedEof { .. })
        ));
    }

    #[test]
    fn every_cut_and_every_flipped_byte_is_an_error_or_a_frame_never_a_panic() {
        let end = ReplayFrame::End { replay_id: "r1".into(), total: 1 };
        let adopted = ReplayFrame::Adopted(ReplayedRows { total: 0, ..rows() }).encode();
        for bytes in [ReplayFrame::Rows(rows()).encode(), one_row_frame(), end.encode(), adopted] {
            for len in 0..bytes.len() {
                assert!(ReplayFrame::decode(&Bytes::copy_from_slice(&bytes[..len])).is_err());
            }
            for i in 0..bytes.len() {
                for flip in [0x01, 0x80, 0xff] {
                    let mut changed = bytes.clone();
                    changed[i] ^= flip;
                    let _ = ReplayFrame::decode(&Bytes::from(changed));
                }
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(matches!(
                ReplayFrame::decode(&Bytes::from(longer)),
                Err(DecodeError::TrailingBytes { extra: 1, .. })
            ));
        }
    }

    fn value() -> impl Strategy<Value = ColumnValue> {
        let bytes = proptest::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from);
        prop_oneof![
            Just(ColumnValue::Null),
            Just(ColumnValue::UnchangedToast),
            bytes.clone().prop_map(ColumnValue::Text),
            bytes.prop_map(ColumnValue::Binary),
        ]
    }

    proptest! {
        #[test]
        fn any_rows_come_back_as_they_went(
            replay_id in "[a-z0-9-]{1,20}",
            names in proptest::collection::vec("[a-z_]{1,12}", 0..6),
            rows in proptest::collection::vec(
                (any::<u64>(), proptest::collection::vec(value(), 0..6)),
                0..8,
            ),
        ) {
            let mut frame = self::rows();
            frame.replay_id = replay_id;
            frame.relation.columns = names
                .into_iter()
                .map(|name| Column { flags: 1, name, type_oid: 25, type_modifier: -1 })
                .collect();
            frame.rows = rows;
            let frame = ReplayFrame::Rows(frame);
            prop_assert_eq!(ReplayFrame::decode(&Bytes::from(frame.encode())), Ok(frame));
        }
    }

    #[test]
    fn a_replay_id_with_a_separator_is_refused() {
        let mut rows = rows();
        rows.replay_id = "r1:x".into();
        let err = ReplayFrame::decode(&Bytes::from(ReplayFrame::Rows(rows).encode()));
        assert_eq!(err, Err(DecodeError::BadReplayId("r1:x".into())));
    }
}
