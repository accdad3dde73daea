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
        let Some(mapping) = &self.emitted else {
            self.say_emitted_events_are_off(&message);
            return Ok(());
        };
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

    /// Emitted events are off (no `--message-prefix`, the default since they were on with
    /// `outbox`): an event with that old default's prefix is most likely one a deployment
    /// that upgraded still emits, so it is named, one line a minute at most, rather than
    /// passed over in silence.
    fn say_emitted_events_are_off(&mut self, message: &DecodingMessage) {
        if message.prefix != OLD_DEFAULT_PREFIX || !message.transactional {
            return;
        }
        if let Some(left_out) = self.memory.emitted_off_log.allow(Instant::now()) {
            warn!(lsn = %lsn(message.lsn), prefix = %message.prefix, left_out,
                "an event emitted with pg_logical_emit_message was not published: emitted \
                 events are off by default; set --message-prefix outbox on setup and run to \
                 stream them (docs/how-to/upgrade.md; one line a minute; left_out: others since \
                 the last line)");
        }
    }
}

/// `--message-prefix`'s default before emitted events became opt-in.
const OLD_DEFAULT_PREFIX: &str = "outbox";
