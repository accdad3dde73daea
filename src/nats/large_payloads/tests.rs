use super::*;

#[test]
fn a_payload_goes_to_the_bucket_when_its_message_would_not_fit_or_it_is_over_the_size_asked() {
    let large = LargePayloads {
        bucket: "b".into(),
        over: None,
        max_size: None,
        replicas: None,
        max_age: None,
    };
    assert!(!large.takes(900, 100, 1000), "exactly fits");
    assert!(large.takes(901, 100, 1000));
    let over = LargePayloads { over: Some(500), ..large };
    assert!(over.takes(501, 0, 1000));
    assert!(!over.takes(500, 0, 1000));
}

#[test]
fn only_a_final_api_answer_refuses_the_payload() {
    let full = "failed getting chunk ack: publish failed: maximum bytes exceeded \
                (code 503, error code 10077)";
    assert!(is_refusal(full));
    let election = "failed chunk publish: JetStream system temporarily unavailable \
                    (code 503, error code 10008)";
    assert!(!is_refusal(election));
    assert!(!is_refusal("failed getting chunk ack: timed out"));
}

#[test]
fn a_payload_over_the_cap_is_refused_with_the_reason() {
    let large = LargePayloads {
        bucket: "b".into(),
        over: None,
        max_size: Some(1_000),
        replicas: None,
        max_age: None,
    };
    assert_eq!(large.refuses(1_000), None);
    let why = large.refuses(1_001).unwrap_or_default();
    assert!(why.contains("1001 bytes") && why.contains("--object-store-max-size"), "{why}");
    assert_eq!(LargePayloads { max_size: None, ..large }.refuses(usize::MAX), None);
}

#[test]
fn a_bucket_name_is_letters_digits_dashes_and_underscores() {
    assert!(bucket_name("PAYLOADS_2-a").is_ok());
    for bad in ["", "a.b", "a b", "a*", "ü"] {
        assert!(bucket_name(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_name_is_the_position_and_the_id() {
    let position = Position { commit_lsn: 0x1521C58, index: 3 };
    assert_eq!(object_name("B", "abc", position), format!("{position}/abc"));
}

#[test]
fn an_id_too_long_for_the_names_subject_is_named_by_its_digest() {
    let position = Position { commit_lsn: 0x1521C58, index: 3 };
    let subject = |name: &str| {
        format!("$O.PAYLOADS.M.{}", base64::engine::general_purpose::URL_SAFE.encode(name))
    };
    for len in [1, 100, 2_900, 3_000, 10_000] {
        let id = "x".repeat(len);
        let name = object_name("PAYLOADS", &id, position);
        assert!(subject(&name).len() <= MAX_SUBJECT_BYTES, "id of {len} bytes");
        assert_eq!(name == format!("{position}/{id}"), len <= 2_900, "id of {len} bytes");
        assert_eq!(name, object_name("PAYLOADS", &id, position), "the same each time");
    }
}
