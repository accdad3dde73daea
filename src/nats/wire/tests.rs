use super::*;
use proptest::prelude::*;

fn one(bytes: &[u8]) -> (ServerOp<'_>, usize) {
    parse(bytes).expect("parses").expect("complete")
}

#[test]
fn control_lines_are_read() {
    assert_eq!(one(b"PING\r\n"), (ServerOp::Ping, 6));
    assert_eq!(one(b"PONG\r\nPING\r\n"), (ServerOp::Pong, 6));
    assert_eq!(one(b"+OK\r\n"), (ServerOp::Ok, 5));
    let (err, _) = one(b"-ERR 'Authorization Violation'\r\n");
    assert_eq!(err, ServerOp::Err("Authorization Violation".into()));
    assert_eq!(parse(b"PIN").unwrap(), None);
    assert_eq!(parse(b"").unwrap(), None);
}

#[test]
fn info_gives_the_limits_and_the_nonce() {
    let line = br#"INFO {"server_id":"x","max_payload":8192,"headers":true,"tls_required":true,"nonce":"abc","connect_urls":["10.0.0.2:4222"]}"#;
    let framed = [&line[..], b"\r\n"].concat();
    let (ServerOp::Info(info), used) = one(&framed) else { panic!("INFO") };
    assert_eq!(used, framed.len());
    assert_eq!(info.max_payload, 8192);
    assert!(info.tls_required && info.headers);
    assert_eq!(info.nonce.as_deref(), Some("abc"));
    assert_eq!(info.connect_urls, ["10.0.0.2:4222"]);
    assert!(matches!(parse(b"INFO {nope\r\n"), Err(WireError::Malformed { op: "INFO", .. })));
}

#[test]
fn acks_arrive_as_msg_and_statuses_as_hmsg() {
    let ack = br#"{"stream":"OUTBOX","seq":7}"#;
    let framed = [format!("MSG _INBOX.a.3 1 {}\r\n", ack.len()).as_bytes(), ack, b"\r\n"].concat();
    let (ServerOp::Message(d), used) = one(&framed) else { panic!("MSG") };
    assert_eq!(
        (d.subject, d.status, d.payload, used),
        ("_INBOX.a.3", None, &ack[..], framed.len())
    );

    let headers = b"NATS/1.0 503\r\n\r\n";
    let framed =
        [format!("HMSG _INBOX.a.4 1 {0} {0}\r\n", headers.len()).as_bytes(), headers, b"\r\n"]
            .concat();
    let (ServerOp::Message(d), _) = one(&framed) else { panic!("HMSG") };
    assert_eq!((d.subject, d.status, d.payload), ("_INBOX.a.4", Some(503), &b""[..]));

    let with_reply = b"HMSG s 1 r 12 14\r\nNATS/1.0\r\n\r\nhi\r\n";
    let (ServerOp::Message(d), _) = one(with_reply) else { panic!("HMSG with reply") };
    assert_eq!((d.status, d.payload), (None, &b"hi"[..]));
}

#[test]
fn a_message_cut_short_waits_for_more() {
    let framed = b"MSG _INBOX.a.3 1 10\r\n0123456789\r\n";
    for cut in 0..framed.len() {
        assert_eq!(parse(&framed[..cut]).unwrap(), None, "cut at {cut}");
    }
}

#[test]
fn broken_frames_are_errors() {
    for broken in [
        &b"MSG s 1\r\n"[..],
        b"MSG s 1 x\r\n",
        b"MSG s 1 2\r\nabXY",
        b"HMSG s 1 5 3\r\n",
        b"HMSG s 1 2 2\r\nxx\r\n",
        b"WHAT\r\n",
    ] {
        assert!(parse(broken).is_err(), "{:?}", String::from_utf8_lossy(broken));
    }
    assert_eq!(
        parse(b"MSG s 1 99999999999\r\n"),
        Err(WireError::Malformed { op: "MSG", line: "MSG s 1 99999999999".into() })
    );
}

#[test]
fn hpub_frames_headers_and_payload_with_their_sizes() {
    let mut headers = BytesMut::new();
    let mut block = HeaderBlock::start(&mut headers);
    block.add("Nats-Msg-Id", "a-1");
    block.add_display("Nats-Expected-Last-Sequence", 41);
    let header_len = block.finish();
    let expected_headers =
        "NATS/1.0\r\nNats-Msg-Id: a-1\r\nNats-Expected-Last-Sequence: 41\r\n\r\n";
    assert_eq!(header_len, expected_headers.len());
    let mut out = BytesMut::new();
    write_hpub(&mut out, "outbox.order.created", ("_INBOX.x.", 9), &headers, b"{}");
    let expected = format!(
        "HPUB outbox.order.created _INBOX.x.9 {} {}\r\n{expected_headers}{{}}\r\n",
        header_len,
        header_len + 2
    );
    assert_eq!(out, expected.as_bytes());
}

#[test]
fn subjects_that_would_break_the_framing_are_not_publishable() {
    assert!(publishable("outbox.order.created"));
    for bad in ["", "a b", "a\tb", "a\r\nPUB x 1"] {
        assert!(!publishable(bad), "{bad:?}");
    }
}

proptest! {
    /// Whatever the server sends, parsing never panics, and an operation never claims more
    /// bytes than there are.
    #[test]
    fn any_bytes_parse_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(Some((_, used))) = parse(&bytes) {
            prop_assert!(used <= bytes.len());
        }
    }

    /// A framed message reads back whole, whatever its subject, headers and payload.
    #[test]
    fn a_framed_message_reads_back(
        subject in "[a-z_.]{1,20}",
        status in proptest::option::of(100u16..600),
        payload in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let headers = match status {
            Some(code) => format!("NATS/1.0 {code} Some Text\r\n\r\n"),
            None => "NATS/1.0\r\nA: b\r\n\r\n".to_owned(),
        };
        let line = format!("HMSG {subject} 1 {} {}\r\n", headers.len(), headers.len() + payload.len());
        let framed = [line.as_bytes(), headers.as_bytes(), &payload, b"\r\n"].concat();
        let (op, used) = parse(&framed).unwrap().unwrap();
        prop_assert_eq!(used, framed.len());
        prop_assert_eq!(op, ServerOp::Message(Delivery { subject: &subject, status, payload: &payload }));
    }
}
