//! A row `pgoutbox replay` hands to the running pgoutbox through the WAL: the `frame` of a
//! row it inserts into the replay table (`postgres::outbox_table::replay_table`), which only
//! roles the operator granted INSERT may write. Decoded in commit order like any change,
//! the row is published by the pipeline in that place, chained like every other message,
//! so a replay into a live stream never writes beside it.
//!
//! The row travels with its relation, both in pgoutput's own formats (the Relation message
//! body and TupleData), so the pipeline maps it exactly as it maps an Insert. A replay ends
//! with a mark that carries no row, so that its progress reaches its total even when its
//! last rows were passed over.
//!
//! ```text
//! u8 version (1) | 'R' | cstr replay id | u64 index | u64 total | Relation | TupleData
//! u8 version (1) | 'E' | cstr replay id | u64 total | u64 total
//! ```

use bytes::{BufMut, Bytes};

use super::cursor::Cursor;
use super::{ColumnValue, DecodeError, Relation, parse_relation, parse_tuple};
use crate::domain::seed::is_replay_id;

const VERSION: u8 = 1;

/// What a replay hands over: a row, or its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayFrame {
    Row(ReplayedRow),
    End { replay_id: String, total: u64 },
}

/// One replayed row and where it stands in its replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayedRow {
    pub replay_id: String,
    /// Its place among the rows this run of the replay selected, from 1 to `total`.
    pub index: u64,
    pub total: u64,
    pub relation: Relation,
    pub tuple: Vec<ColumnValue>,
}

impl ReplayFrame {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ReplayFrame::Row(row) => row.encode(),
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
        let (replay_id, index, total) = (cur.cstr()?, cur.u64()?, cur.u64()?);
        if !is_replay_id(&replay_id) {
            return Err(DecodeError::BadReplayId(replay_id));
        }
        let frame = match kind {
            b'R' => ReplayFrame::Row(ReplayedRow {
                replay_id,
                index,
                total,
                relation: parse_relation(&mut cur)?,
                tuple: parse_tuple(&mut cur)?,
            }),
            b'E' => ReplayFrame::End { replay_id, total },
            other => return Err(DecodeError::UnknownMessageTag(other)),
        };
        match cur.remaining() {
            0 => Ok(frame),
            extra => Err(DecodeError::TrailingBytes { message: kind as char, extra }),
        }
    }
}

impl ReplayedRow {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.tuple_len());
        out.put_u8(VERSION);
        out.put_u8(b'R');
        put_cstr(&mut out, &self.replay_id);
        out.put_u64(self.index);
        out.put_u64(self.total);
        let relation = &self.relation;
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
        out.put_i16(self.tuple.len() as i16);
        for value in &self.tuple {
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
        out
    }

    fn tuple_len(&self) -> usize {
        self.tuple
            .iter()
            .map(|value| match value {
                ColumnValue::Text(bytes) | ColumnValue::Binary(bytes) => bytes.len() + 5,
                _ => 1,
            })
            .sum()
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

    fn row() -> ReplayedRow {
        let column = |name: &str, type_oid| Column {
            flags: 0,
            name: name.into(),
            type_oid,
            type_modifier: -1,
        };
        ReplayedRow {
            replay_id: "r1764050000".into(),
            index: 3,
            total: 10,
            relation: Relation {
                rel_id: 16384,
                namespace: "public".into(),
                name: "outbox".into(),
                replica_identity: b'd',
                columns: vec![column("id", 2950), column("payload", 3802), column("h", 3802)],
            },
            tuple: vec![
                ColumnValue::Text(Bytes::from_static(b"7f0c")),
                ColumnValue::Binary(Bytes::from_static(&[0, 1, 2])),
                ColumnValue::Null,
            ],
        }
    }

    fn round_trip(frame: ReplayFrame) {
        assert_eq!(ReplayFrame::decode(&Bytes::from(frame.encode())), Ok(frame));
    }

    #[test]
    fn a_row_and_an_end_come_back_as_they_went() {
        round_trip(ReplayFrame::Row(row()));
        round_trip(ReplayFrame::End { replay_id: "nightly".into(), total: 42 });
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let mut bytes = ReplayFrame::Row(row()).encode();
        bytes[0] = 2;
        let err = ReplayFrame::decode(&Bytes::from(bytes));
        assert_eq!(err, Err(DecodeError::UnknownReplayVersion(2)));
    }

    #[test]
    fn every_cut_and_every_flipped_byte_is_an_error_or_a_frame_never_a_panic() {
        let end = ReplayFrame::End { replay_id: "r1".into(), total: 1 };
        for bytes in [ReplayFrame::Row(row()).encode(), end.encode()] {
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
        fn any_row_comes_back_as_it_went(
            replay_id in "[a-z0-9-]{1,20}",
            index in any::<u64>(),
            names in proptest::collection::vec("[a-z_]{1,12}", 0..6),
            tuple in proptest::collection::vec(value(), 0..6),
        ) {
            let mut row = row();
            row.replay_id = replay_id;
            row.index = index;
            row.relation.columns = names
                .into_iter()
                .map(|name| Column { flags: 1, name, type_oid: 25, type_modifier: -1 })
                .collect();
            row.tuple = tuple;
            let frame = ReplayFrame::Row(row);
            prop_assert_eq!(ReplayFrame::decode(&Bytes::from(frame.encode())), Ok(frame));
        }
    }

    #[test]
    fn a_replay_id_with_a_separator_is_refused() {
        let mut row = row();
        row.replay_id = "r1:x".into();
        let err = ReplayFrame::decode(&Bytes::from(ReplayFrame::Row(row).encode()));
        assert_eq!(err, Err(DecodeError::BadReplayId("r1:x".into())));
    }
}
