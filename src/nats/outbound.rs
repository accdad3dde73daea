//! Pipelined publishing to JetStream with every ack on one reply subscription.
//!
//! Each message is a plain publish whose reply subject is `<inbox>.<token>`, the token
//! counting up; one subscription on `<inbox>.*` receives every ack, and [`ack_of`] reads
//! it. async-nats's JetStream `publish` gives each message its own inbox, map entry,
//! oneshot channel, two timers and a boxed future; at tens of thousands of messages a
//! second that was a third of pgoutbox's CPU. Connecting, reconnecting, auth and TLS stay
//! async-nats's.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{HeaderMap, StatusCode};
use bytes::Bytes;
use futures_util::StreamExt;

/// What JetStream answered for a stored message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub sequence: u64,
    /// A message with the same `Nats-Msg-Id` was already in the stream; this one was not
    /// stored again.
    pub duplicate: bool,
}

pub type Ack = Result<Stored, PublishError>;

/// The sending half: hands messages to the client, each with its token.
pub struct Outbound {
    client: async_nats::Client,
    reply_prefix: String,
    next_token: u64,
    ack_timeout: Duration,
}

/// The receiving half: the acks, in the order they arrive, each with its message's token.
pub struct Acks {
    replies: async_nats::Subscriber,
    reply_prefix: String,
}

/// Opens the reply subscription. The server handles it before any publish sent after it
/// on the same connection, so no ack can come before the subscription exists. async-nats
/// queues up to 65,536 messages per subscription and drops the rest (a slow consumer);
/// the pipeline has at most 4,096 messages in flight, so every ack fits.
pub async fn open(
    client: &async_nats::Client,
    ack_timeout: Duration,
) -> Result<(Outbound, Acks), async_nats::SubscribeError> {
    let reply_prefix = format!("{}.", client.new_inbox());
    let replies = client.subscribe(format!("{reply_prefix}*")).await?;
    let outbound = Outbound {
        client: client.clone(),
        reply_prefix: reply_prefix.clone(),
        next_token: 0,
        ack_timeout,
    };
    Ok((outbound, Acks { replies, reply_prefix }))
}

impl Outbound {
    /// How long an ack may take before the message counts as not acknowledged.
    pub fn ack_timeout(&self) -> Duration {
        self.ack_timeout
    }

    /// Sends one message and returns the token its ack will carry. When the client's queue
    /// is full (NATS not reading), the wait for room is bounded by the ack timeout; the
    /// usual case, room at once, sets no timer.
    pub async fn send(
        &mut self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<u64, PublishError> {
        use std::fmt::Write;
        let token = self.next_token;
        let mut reply = String::with_capacity(self.reply_prefix.len() + 20);
        reply.push_str(&self.reply_prefix);
        let _ = write!(reply, "{token}");
        let send = self.client.publish_with_reply_and_headers(subject, reply, headers, payload);
        let mut send = std::pin::pin!(send);
        let sent = match std::future::poll_fn(|cx| Poll::Ready(send.as_mut().poll(cx))).await {
            Poll::Ready(sent) => sent,
            Poll::Pending => tokio::time::timeout(self.ack_timeout, send)
                .await
                .map_err(|_| PublishError::new(PublishErrorKind::TimedOut))?,
        };
        sent.map_err(|err| {
            let kind = match err.kind() {
                async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                    PublishErrorKind::MaxPayloadExceeded
                }
                async_nats::client::PublishErrorKind::Send => PublishErrorKind::BrokenPipe,
                _ => PublishErrorKind::Other,
            };
            PublishError::with_source(kind, err)
        })?;
        self.next_token += 1;
        Ok(token)
    }
}

impl Acks {
    /// The next ack to arrive, with its message's token; `None` once the subscription has
    /// ended (the client closed). Cancel-safe.
    pub async fn next(&mut self) -> Option<(u64, Ack)> {
        loop {
            let reply = self.replies.next().await?;
            let token = reply.subject.strip_prefix(self.reply_prefix.as_str());
            // Only the server writes to this inbox; anything else there is not an ack.
            if let Some(token) = token.and_then(|token| token.parse().ok()) {
                return Some((token, ack_of(reply.status, &reply.payload)));
            }
        }
    }
}

/// Reads JetStream's answer to one publish: `{"stream":…,"seq":…[,"duplicate":true]}`, an
/// API error, or a status without body (503: nothing answers for the subject, so on a
/// cluster the stream has no leader). Errors are sorted as async-nats sorts them, so that
/// callers tell them apart by kind and API code alone.
pub fn ack_of(status: Option<StatusCode>, payload: &[u8]) -> Ack {
    #[derive(serde::Deserialize)]
    struct Reply {
        #[serde(default)]
        seq: u64,
        #[serde(default)]
        duplicate: bool,
        #[serde(default)]
        error: Option<jetstream::Error>,
    }
    match status {
        Some(StatusCode::NO_RESPONDERS) => {
            return Err(PublishError::new(PublishErrorKind::StreamNotFound));
        }
        Some(status) if !status.is_success() => {
            return Err(PublishError::with_source(
                PublishErrorKind::Other,
                format!("the publish was answered with status {status}"),
            ));
        }
        _ => {}
    }
    // serde reads a struct from an array too; an ack is always an object.
    if payload.first() != Some(&b'{') {
        return Err(PublishError::with_source(PublishErrorKind::Other, "the ack is no object"));
    }
    let reply: Reply = serde_json::from_slice(payload)
        .map_err(|err| PublishError::with_source(PublishErrorKind::Other, err))?;
    match reply.error {
        Some(error) => {
            let kind = match error.error_code() {
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE => PublishErrorKind::WrongLastSequence,
                ErrorCode::STREAM_WRONG_LAST_MESSAGE_ID => PublishErrorKind::WrongLastMessageId,
                _ => PublishErrorKind::Other,
            };
            Err(PublishError::with_source(kind, error))
        }
        None if reply.seq == 0 => Err(PublishError::with_source(
            PublishErrorKind::Other,
            "the ack names no stream sequence",
        )),
        None => Ok(Stored { sequence: reply.seq, duplicate: reply.duplicate }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nats::publisher::refused_for_itself;
    use proptest::prelude::*;

    proptest! {
        /// Whatever arrives on the inbox, reading it never panics.
        #[test]
        fn any_answer_is_read_without_panicking(payload in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ack_of(None, &payload);
            let _ = ack_of(Some(StatusCode::OK), &payload);
        }

        /// A stored message's sequence and duplicate flag come back as JetStream sent them,
        /// whatever else the ack holds.
        #[test]
        fn a_stored_ack_reads_back(seq in 1u64.., duplicate: bool, stream in "[A-Z_]{1,12}") {
            let ack = format!(r#"{{"stream":"{stream}","domain":"d","seq":{seq},"duplicate":{duplicate}}}"#);
            prop_assert_eq!(ack_of(None, ack.as_bytes()).unwrap(), Stored { sequence: seq, duplicate });
        }
    }

    #[test]
    fn stored_and_duplicate_acks_are_read() {
        let stored = ack_of(None, br#"{"stream":"OUTBOX","seq":42}"#).unwrap();
        assert_eq!(stored, Stored { sequence: 42, duplicate: false });
        let duplicate =
            ack_of(None, br#"{"stream":"OUTBOX","domain":"hub","seq":7,"duplicate":true}"#);
        assert_eq!(duplicate.unwrap(), Stored { sequence: 7, duplicate: true });
    }

    #[test]
    fn api_errors_keep_their_kind_and_code() {
        let wrong =
            br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"}}"#;
        assert_eq!(ack_of(None, wrong).unwrap_err().kind(), PublishErrorKind::WrongLastSequence);
        let too_big = br#"{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}}"#;
        let err = ack_of(None, too_big).unwrap_err();
        assert_eq!(err.kind(), PublishErrorKind::Other);
        assert!(refused_for_itself(&err).is_some_and(|why| why.contains("10054")));
    }

    #[test]
    fn statuses_and_unreadable_answers_are_errors() {
        let none = ack_of(Some(StatusCode::NO_RESPONDERS), b"").unwrap_err();
        assert_eq!(none.kind(), PublishErrorKind::StreamNotFound);
        let timeout = ack_of(Some(StatusCode::TIMEOUT), b"").unwrap_err();
        assert_eq!(timeout.kind(), PublishErrorKind::Other);
        for garbage in [&b""[..], b"{", b"{}", b"[1]", b"\xff\xfe", br#"{"seq":"x"}"#] {
            assert!(ack_of(None, garbage).is_err(), "{garbage:?}");
        }
    }
}
