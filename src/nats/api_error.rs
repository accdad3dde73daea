//! Telling JetStream's "no" from its silence. A request at start-up or at the start of an
//! attempt that JetStream refuses (subjects overlap, limits, bad config) will be refused
//! again; one it did not answer (timed out, connection lost, no meta leader) may pass later.

use async_nats::jetstream::context::{
    CreateStreamError, CreateStreamErrorKind, GetStreamError, GetStreamErrorKind,
};
use async_nats::jetstream::stream::{LastRawMessageError, LastRawMessageErrorKind};
use async_nats::jetstream::{self, ErrorCode};

/// JetStream API codes that mean "not now" (no meta leader, cluster still forming), not "no".
const TEMPORARILY_UNAVAILABLE: [ErrorCode; 4] = [
    ErrorCode::CLUSTER_NOT_AVAILABLE,
    ErrorCode::CLUSTER_NOT_ACTIVE,
    ErrorCode::CLUSTER_NOT_LEADER,
    ErrorCode::CLUSTER_INCOMPLETE,
];

/// Whether `err` carries JetStream's own refusal of the request, told by its API error code
/// (async-nats keeps it in the error's kind, not as its source). A timeout, a lost
/// connection or one of [`TEMPORARILY_UNAVAILABLE`] is no final answer.
pub fn is_final_answer(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(error) = cause {
        let code = if let Some(api) = error.downcast_ref::<jetstream::Error>() {
            Some(api.error_code())
        } else if let Some(get) = error.downcast_ref::<GetStreamError>() {
            match get.kind() {
                GetStreamErrorKind::JetStream(api) => Some(api.error_code()),
                _ => None,
            }
        } else if let Some(create) = error.downcast_ref::<CreateStreamError>() {
            match create.kind() {
                CreateStreamErrorKind::JetStream(api) => Some(api.error_code()),
                _ => None,
            }
        } else if let Some(last) = error.downcast_ref::<LastRawMessageError>() {
            match last.kind() {
                LastRawMessageErrorKind::JetStream(api) => Some(api.error_code()),
                _ => None,
            }
        } else {
            None
        };
        if let Some(code) = code {
            return is_final_code(code);
        }
        cause = error.source();
    }
    false
}

/// Whether an answer with API code `code` is JetStream's "no" rather than its "not now".
pub fn is_final_code(code: ErrorCode) -> bool {
    !TEMPORARILY_UNAVAILABLE.contains(&code)
}

/// JetStream answered that the stream asked for does not exist (API code 10059).
pub fn is_stream_not_found(err: &GetStreamError) -> bool {
    matches!(err.kind(), GetStreamErrorKind::JetStream(e) if e.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use async_nats::jetstream::context::{
        PublishError, PublishErrorKind, RequestError, RequestErrorKind,
    };

    use super::*;

    /// An API error as async-nats parses the server's JSON answer.
    fn api(err_code: u64) -> jetstream::Error {
        let answer = serde_json::json!({"code": 503, "err_code": err_code, "description": "x"});
        serde_json::from_value(answer).unwrap()
    }

    #[test]
    fn only_a_refusal_is_a_final_answer() {
        let overlap = CreateStreamError::new(CreateStreamErrorKind::JetStream(api(10065)));
        assert!(is_final_answer(&overlap));
        let no_quorum = GetStreamError::new(GetStreamErrorKind::JetStream(api(10008)));
        assert!(!is_final_answer(&no_quorum));
        let timed_out = GetStreamError::with_source(
            GetStreamErrorKind::Request,
            RequestError::new(RequestErrorKind::TimedOut),
        );
        assert!(!is_final_answer(&timed_out));
        assert!(!is_final_answer(&CreateStreamError::new(CreateStreamErrorKind::TimedOut)));
        let forming = LastRawMessageError::new(LastRawMessageErrorKind::JetStream(api(10004)));
        assert!(!is_final_answer(&forming));
        // A refused publish carries the API error as its source.
        let full = PublishError::with_source(PublishErrorKind::Other, api(10077));
        assert!(is_final_answer(&full));
        assert!(!is_final_answer(&PublishError::new(PublishErrorKind::TimedOut)));
    }
}
