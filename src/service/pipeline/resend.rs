//! After a duplicate: the messages chained behind it, sent again in place.

use async_nats::jetstream::context::{PublishError, PublishErrorKind};

use super::Pipeline;
use crate::service::error::{NatsFailure, NatsFailureKind, PipelineError};

impl Pipeline<'_> {
    /// JetStream did not store a duplicate, so every message sent after it expected one
    /// sequence too many and is refused as out of order. Rather than ending the attempt
    /// (and having Postgres decode everything again, once per duplicate), wait for those
    /// refusals and send the same messages again, chained to the stream's real end. The
    /// tracker's counts do not change: the same messages stay in flight, in the same order.
    pub(super) async fn resend_after_duplicate(&mut self) -> Result<(), PipelineError> {
        let stale = self.in_flight.len();
        // The duplicate and every message behind it each counted one stored message.
        self.expected_last_sequence -= 1 + stale as u64;
        let timeout = self.outbound.ack_timeout();
        for _ in 0..stale {
            let refusal = tokio::time::timeout(timeout, self.in_flight.oldest())
                .await
                .unwrap_or_else(|_| Err(PublishError::new(PublishErrorKind::TimedOut)));
            let Some(entry) = self.in_flight.pop_oldest() else { break };
            match refusal {
                Err(err) if err.kind() == PublishErrorKind::WrongLastSequence => {}
                // Not stored either (JetStream checks duplicates first): sent again, it is
                // acknowledged as a duplicate in its turn.
                Ok(ack) if ack.duplicate => {}
                Ok(_) => {
                    return Err(NatsFailure::new(
                        NatsFailureKind::Other,
                        "a message chained behind a duplicate was stored: another writer on \
                         the stream?",
                    )
                    .into());
                }
                Err(err) => return Err(self.refused(entry.position, &err)),
            }
            let event = entry
                .resend
                .rebuild()
                .map_err(|_| PipelineError::Protocol("a row mapped once did not map again"))?;
            let (token, payload) = self.dispatch(event, entry.position).await.map_err(|err| {
                self.unsent_row = true;
                PipelineError::Nats(NatsFailure::unacknowledged(&err))
            })?;
            self.in_flight.push(token, entry.position, payload, entry.resend);
        }
        Ok(())
    }
}
