//! Events emitted with `pg_logical_emit_message`, in the pipeline: a transactional one is a
//! row of its transaction (see `domain::outbox::emitted`).

use std::sync::Arc;
use std::time::Instant;

use tracing::warn;

use super::{Pipeline, lsn};
use crate::domain::outbox::log_preview;
use crate::postgres::pgoutput::DecodingMessage;
use crate::service::error::PipelineError;

impl Pipeline<'_> {
    /// A `pg_logical_emit_message` event. A transactional one is a row of its transaction, in
    /// its place among the table's rows. A non-transactional one is sent by Postgres at once,
    /// even if its transaction later rolls back, so it is never published: it is logged and
    /// counted, and the docs tell the application to pass `true`. None is published without
    /// a `--message-prefix` (`emitted` is `None`), whatever its prefix: replayed rows come
    /// through the replay table, never as messages (`pipeline::replayed`).
    pub(super) async fn on_emitted(
        &mut self,
        message: DecodingMessage,
    ) -> Result<(), PipelineError> {
        let Some(mapping) = &self.emitted else { return Ok(()) };
        if Some(&message.prefix) != self.config.message_prefix.as_ref() {
            return Ok(());
        }
        if !message.transactional {
            // Any login may send these: one line a minute at most, the metric counts all.
            if let Some(left_out) = self.memory.non_transactional_log.allow(Instant::now()) {
                warn!(lsn = %lsn(message.lsn), prefix = %message.prefix,
                    content = %log_preview(&message.content), left_out,
                    "non-transactional message not published: it is sent even when its \
                     transaction rolls back; emit it with pg_logical_emit_message(true, ...) \
                     (one line a minute; left_out: others since the last line)");
            }
            self.metrics.non_transactional_messages.increment(1);
            return Ok(());
        }
        let mapping = Arc::clone(mapping);
        let position = self.next_position("transactional message outside a transaction")?;
        match mapping.emitted_row(&message.content) {
            Ok(row) => self.on_row(mapping, row, position, None).await,
            Err((row, rejection)) => self.on_row(mapping, row, position, Some(rejection)).await,
        }
    }
}
