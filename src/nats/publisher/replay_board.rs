//! Where a `pgoutbox replay` that publishes by itself (into a stream no pgoutbox streams
//! into) shows its progress to `pgoutbox status`: one record per stream in the key-value
//! bucket `pgoutbox_replays`, written each second and at the end. A replay through the
//! running pgoutbox shows on that pgoutbox's `/metrics` instead.
//!
//! Laid out as a key-value bucket (stream `KV_pgoutbox_replays`, subjects
//! `$KV.pgoutbox_replays.<stream>`), so `nats kv get pgoutbox_replays OUTBOX` shows it,
//! and written with plain publishes, as the claims are (`crate::nats::claim`).

use async_nats::jetstream::stream::{self, LastRawMessageErrorKind};
use serde::{Deserialize, Serialize};

use super::{Publisher, PublisherError, is_stream_not_found, request_error};

const BUCKET: &str = "pgoutbox_replays";

/// A replay's progress, as it last wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayRecord {
    pub replay_id: String,
    /// Rows selected, and of those published or passed over (stored before, unpublishable).
    pub rows: u64,
    pub rows_done: u64,
    pub rows_per_second: f64,
    /// Epoch seconds.
    pub updated_at: u64,
    pub finished: bool,
}

impl Publisher {
    /// Records a replay's progress into this stream.
    pub async fn record_replay(&self, record: &ReplayRecord) -> Result<(), PublisherError> {
        self.replay_bucket().await?;
        let body = serde_json::to_vec(record).unwrap_or_default();
        let ack = self.js.publish(self.replay_key(), body.into()).await.map_err(request_error)?;
        ack.await.map_err(request_error)?;
        Ok(())
    }

    /// The last replay recorded into this stream, if any.
    pub async fn last_replay(&self) -> Result<Option<ReplayRecord>, PublisherError> {
        let bucket = match self.js.get_stream(format!("KV_{BUCKET}")).await {
            Ok(bucket) => bucket,
            Err(err) if is_stream_not_found(&err) => return Ok(None),
            Err(err) => return Err(request_error(err)),
        };
        match bucket.get_last_raw_message_by_subject(&self.replay_key()).await {
            Ok(message) => Ok(serde_json::from_slice(&message.payload).ok()),
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(err) => Err(request_error(err)),
        }
    }

    fn replay_key(&self) -> String {
        format!("$KV.{BUCKET}.{}", self.stream)
    }

    async fn replay_bucket(&self) -> Result<(), PublisherError> {
        let config = stream::Config {
            name: format!("KV_{BUCKET}"),
            description: Some("pgoutbox: the progress of the last replay into each stream".into()),
            subjects: vec![format!("$KV.{BUCKET}.>")],
            max_messages_per_subject: 1,
            allow_rollup: true,
            allow_direct: true,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        self.js.get_or_create_stream(config).await.map_err(request_error)?;
        Ok(())
    }
}
