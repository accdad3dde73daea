use bytes::Bytes;

use super::*;

macro_rules! fixture {
    ($name:literal) => {
        Bytes::from_static(include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/pgoutput/",
            $name,
            ".bin"
        )))
    };
}

fn all_fixtures() -> Vec<(&'static str, Bytes)> {
    vec![
        ("begin", fixture!("begin")),
        ("commit", fixture!("commit")),
        ("relation", fixture!("relation")),
        ("type", fixture!("type")),
        ("insert", fixture!("insert")),
        ("update", fixture!("update")),
        ("delete", fixture!("delete")),
        ("truncate", fixture!("truncate")),
        ("message", fixture!("message")),
    ]
}

/// Builds a message from parts, as the server would.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn tag(t: u8) -> Self {
        Msg(vec![t])
    }
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn i16(mut self, v: i16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn raw(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    fn cstr(self, v: &str) -> Self {
        self.raw(v.as_bytes()).u8(0)
    }
    fn parse(self) -> Result<LogicalMessage, DecodeError> {
        LogicalMessage::parse(&Bytes::from(self.0))
    }
}

#[test]
fn begin_and_commit() {
    let begin = Msg::tag(b'B').u64(0x1_0000_0010).u64(777).i32(42).parse().unwrap();
    assert_eq!(
        begin,
        LogicalMessage::Begin(Begin { final_lsn: 0x1_0000_0010, commit_time: 777, xid: 42 })
    );
    let commit = Msg::tag(b'C').u8(0).u64(0x10).u64(0x38).u64(777).parse().unwrap();
    assert_eq!(
        commit,
        LogicalMessage::Commit(Commit {
            flags: 0,
            commit_lsn: 0x10,
            end_lsn: 0x38,
            commit_time: 777
        })
    );
}

#[test]
fn relation_with_columns() {
    let msg = Msg::tag(b'R')
        .i32(16384)
        .cstr("public")
        .cstr("outbox")
        .u8(b'd')
        .i16(2)
        .u8(1)
        .cstr("id")
        .i32(2950)
        .i32(-1)
        .u8(0)
        .cstr("payload")
        .i32(3802)
        .i32(-1)
        .parse()
        .unwrap();
    let LogicalMessage::Relation(r) = msg else { panic!("not a relation: {msg:?}") };
    assert_eq!((r.rel_id, r.namespace.as_str(), r.name.as_str()), (16384, "public", "outbox"));
    assert_eq!(r.replica_identity, b'd');
    assert_eq!(
        r.columns,
        vec![
            Column { flags: 1, name: "id".into(), type_oid: 2950, type_modifier: -1 },
            Column { flags: 0, name: "payload".into(), type_oid: 3802, type_modifier: -1 },
        ]
    );
}

#[test]
fn insert_with_every_column_kind() {
    let msg = Msg::tag(b'I')
        .i32(7)
        .u8(b'N')
        .i16(5)
        .u8(b'n')
        .u8(b'u')
        .u8(b't')
        .i32(3)
        .raw(b"abc")
        .u8(b'b')
        .i32(2)
        .raw(&[0, 255])
        .u8(b't')
        .i32(0)
        .parse()
        .unwrap();
    assert_eq!(
        msg,
        LogicalMessage::Insert(Insert {
            rel_id: 7,
            tuple: vec![
                ColumnValue::Null,
                ColumnValue::UnchangedToast,
                ColumnValue::Text(Bytes::from_static(b"abc")),
                ColumnValue::Binary(Bytes::from_static(&[0, 255])),
                ColumnValue::Text(Bytes::new()),
            ],
        })
    );
}

#[test]
fn insert_with_zero_columns() {
    let msg = Msg::tag(b'I').i32(7).u8(b'N').i16(0).parse().unwrap();
    assert_eq!(msg, LogicalMessage::Insert(Insert { rel_id: 7, tuple: vec![] }));
}

#[test]
fn other_messages() {
    let origin = Msg::tag(b'O').u64(5).cstr("node_a").parse().unwrap();
    assert_eq!(origin, LogicalMessage::Origin(Origin { commit_lsn: 5, name: "node_a".into() }));
    let ty = Msg::tag(b'Y').i32(99).cstr("public").cstr("mood").parse().unwrap();
    assert_eq!(
        ty,
        LogicalMessage::Type(TypeMessage {
            type_id: 99,
            namespace: "public".into(),
            name: "mood".into()
        })
    );
    let truncate = Msg::tag(b'T').i32(2).u8(1).i32(10).i32(11).parse().unwrap();
    assert_eq!(truncate, LogicalMessage::Truncate(Truncate { options: 1, rel_ids: vec![10, 11] }));
    let message = Msg::tag(b'M').u8(1).u64(9).cstr("p").i32(2).raw(b"hi").parse().unwrap();
    assert_eq!(
        message,
        LogicalMessage::Message(DecodingMessage {
            transactional: true,
            lsn: 9,
            prefix: "p".into(),
            content: Bytes::from_static(b"hi"),
        })
    );
    assert_eq!(
        Msg::tag(b'U').i32(3).raw(b"whatever").parse(),
        Ok(LogicalMessage::Update { rel_id: 3 })
    );
    assert_eq!(Msg::tag(b'D').i32(4).parse(), Ok(LogicalMessage::Delete { rel_id: 4 }));
}

#[test]
fn malformed_messages_are_exact_errors() {
    assert_eq!(LogicalMessage::parse(&Bytes::new()), Err(DecodeError::Empty));
    assert_eq!(Msg::tag(b'Z').parse(), Err(DecodeError::UnknownMessageTag(b'Z')));
    assert_eq!(Msg::tag(b'B').u64(1).parse(), Err(DecodeError::UnexpectedEof { need: 8, at: 9 }));
    assert_eq!(
        Msg::tag(b'I').i32(7).u8(b'N').i16(1).u8(b'x').parse(),
        Err(DecodeError::UnknownTupleKind { kind: b'x', at: 8 })
    );
    assert_eq!(
        Msg::tag(b'I').i32(7).u8(b'K').parse(),
        Err(DecodeError::UnexpectedTupleMarker { found: b'K', at: 5 })
    );
    assert_eq!(
        Msg::tag(b'I').i32(7).u8(b'N').i16(1).u8(b't').i32(-5).parse(),
        Err(DecodeError::NegativeLength { len: -5, at: 9 })
    );
    assert_eq!(
        Msg::tag(b'I').i32(7).u8(b'N').i16(1).u8(b't').i32(10).raw(b"abc").parse(),
        Err(DecodeError::UnexpectedEof { need: 10, at: 13 })
    );
    assert_eq!(
        Msg::tag(b'O').u64(5).raw(b"no-nul").parse(),
        Err(DecodeError::MissingNul { at: 9 })
    );
    assert_eq!(
        Msg::tag(b'O').u64(5).raw(&[0xff, 0xfe, 0]).parse(),
        Err(DecodeError::InvalidUtf8 { at: 9 })
    );
    assert_eq!(
        Msg::tag(b'C').u8(0).u64(1).u64(2).u64(3).u8(0).parse(),
        Err(DecodeError::TrailingBytes { message: 'C', extra: 1 })
    );
    assert_eq!(
        Msg::tag(b'I').i32(7).u8(b'N').i16(-1).parse(),
        Err(DecodeError::NegativeLength { len: -1, at: 6 })
    );
    // A huge count with no bytes behind it is refused before allocating.
    assert_eq!(
        Msg::tag(b'T').i32(i32::MAX).u8(0).parse(),
        Err(DecodeError::UnexpectedEof { need: i32::MAX as usize * 4, at: 6 })
    );
}

#[test]
fn real_fixtures_decode() {
    let LogicalMessage::Begin(begin) = LogicalMessage::parse(&fixture!("begin")).unwrap() else {
        panic!("begin.bin is not a Begin")
    };
    let LogicalMessage::Commit(commit) = LogicalMessage::parse(&fixture!("commit")).unwrap() else {
        panic!("commit.bin is not a Commit")
    };
    assert_eq!(begin.final_lsn, commit.commit_lsn, "Begin announces the commit's LSN");
    assert!(commit.end_lsn > commit.commit_lsn);

    let LogicalMessage::Relation(rel) = LogicalMessage::parse(&fixture!("relation")).unwrap()
    else {
        panic!("relation.bin is not a Relation")
    };
    let names: Vec<_> = rel.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!((rel.namespace.as_str(), rel.name.as_str()), ("public", "fixture"));
    assert_eq!(names, ["id", "note", "doc", "raw", "big", "feeling"]);
    assert_eq!(rel.columns[0].flags, 1, "the primary key is flagged");
    assert_eq!(rel.columns[2].type_oid, 3802);

    let LogicalMessage::Type(ty) = LogicalMessage::parse(&fixture!("type")).unwrap() else {
        panic!("type.bin is not a Type")
    };
    assert_eq!(ty.name, "mood");

    let LogicalMessage::Insert(insert) = LogicalMessage::parse(&fixture!("insert")).unwrap() else {
        panic!("insert.bin is not an Insert")
    };
    assert_eq!(insert.rel_id, rel.rel_id);
    assert_eq!(insert.tuple[0], ColumnValue::Text(Bytes::from_static(b"1")));
    assert_eq!(insert.tuple[1], ColumnValue::Null);
    assert_eq!(insert.tuple[2], ColumnValue::Text(Bytes::from_static(br#"{"a": 1}"#)));
    assert_eq!(insert.tuple[3], ColumnValue::Text(Bytes::from_static(br"\x00ff")));
    assert_eq!(insert.tuple[4], ColumnValue::Text(Bytes::from("x".repeat(5000))));
    assert_eq!(insert.tuple[5], ColumnValue::Text(Bytes::from_static(b"happy")));

    assert_eq!(
        LogicalMessage::parse(&fixture!("update")),
        Ok(LogicalMessage::Update { rel_id: rel.rel_id })
    );
    assert_eq!(
        LogicalMessage::parse(&fixture!("delete")),
        Ok(LogicalMessage::Delete { rel_id: rel.rel_id })
    );
    assert_eq!(
        LogicalMessage::parse(&fixture!("truncate")),
        Ok(LogicalMessage::Truncate(Truncate { options: 0, rel_ids: vec![rel.rel_id] }))
    );
    let LogicalMessage::Message(m) = LogicalMessage::parse(&fixture!("message")).unwrap() else {
        panic!("message.bin is not a Message")
    };
    assert_eq!(
        (m.transactional, m.prefix.as_str(), &m.content[..]),
        (true, "pgoutbox", &b"hello"[..])
    );
}

#[test]
fn values_share_the_input_buffer() {
    let input = fixture!("insert");
    let LogicalMessage::Insert(insert) = LogicalMessage::parse(&input).unwrap() else {
        panic!("not an insert")
    };
    let ColumnValue::Text(big) = &insert.tuple[4] else { panic!("not text") };
    let range = input.as_ptr_range();
    assert!(range.contains(&big.as_ptr()), "the value was copied");
}

/// A stand-in for a fuzzer: every fixture cut at every length, and every byte altered,
/// must give `Err` or `Ok`, never a panic; a cut message (except U/D, whose tail is not
/// read) must never decode.
#[test]
fn truncated_or_corrupted_input_never_panics() {
    for (name, bytes) in all_fixtures() {
        for len in 0..bytes.len() {
            let cut = bytes.slice(..len);
            let result = LogicalMessage::parse(&cut);
            if !matches!(name, "update" | "delete") || len < 5 {
                assert!(result.is_err(), "{name} cut to {len} bytes decoded: {result:?}");
            }
        }
        for i in 0..bytes.len() {
            for value in [0x00, 0xff, 0x7f, 0x80, bytes[i] ^ 0xff, bytes[i].wrapping_add(1)] {
                let mut corrupted = bytes.to_vec();
                corrupted[i] = value;
                let _ = LogicalMessage::parse(&Bytes::from(corrupted));
            }
        }
    }
}
