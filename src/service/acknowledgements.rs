//! Keeps the record of what JetStream acknowledged up to date in Postgres
//! (`postgres::acknowledged`), so that a start after a restart of both pgoutbox and
//! nats-server still sees a stream that came back shorter.

use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::domain::horizon::Stored;
use crate::nats::publisher::Publisher;
use crate::postgres::acknowledged::{self, Acknowledged, StreamIdentity};
use crate::postgres::admin::{self, TableName};
use crate::service::shutdown::Shutdown;

/// What JetStream acknowledged last, shared by the pipeline (which sets it at each tick)
/// and the task that records it.
#[derive(Debug, Clone, Default)]
pub struct LastAcknowledged(Arc<Mutex<Option<Acknowledged>>>);

impl LastAcknowledged {
    /// `stored` is the last message acknowledged, `up_to` the position up to which
    /// everything decoded was.
    pub fn set(&self, stored: Stored, up_to: u64) {
        if let Ok(mut last) = self.0.lock() {
            *last = Some(Acknowledged { stored, up_to });
        }
    }

    /// The position up to which everything decoded was acknowledged; 0 before any ack.
    pub fn up_to(&self) -> u64 {
        self.get().map_or(0, |acknowledged| acknowledged.up_to)
    }

    fn get(&self) -> Option<Acknowledged> {
        self.0.lock().ok().and_then(|last| *last)
    }
}

/// The stream's name and creation time, as the record names it; `None` when it has none.
pub async fn stream_identity(publisher: &Publisher, name: &str) -> Option<StreamIdentity> {
    let info = publisher.stream_info().await.ok()??;
    let created = info.created.unix_timestamp_nanos().to_string();
    Some(StreamIdentity { name: name.to_owned(), created })
}

/// Records `last` for `slot` every [`acknowledged::EVERY`] when it moved, until shutdown.
/// A table pgoutbox's role does not own, or none at all, is said once and left alone.
pub async fn record_every(
    database: tokio_postgres::Config,
    tls: crate::postgres::tls::PgTls,
    (table, slot): (TableName, String),
    publisher: Publisher,
    last: LastAcknowledged,
    mut shutdown: Shutdown,
) {
    let mut client = None;
    let mut recorded: Option<Acknowledged> = None;
    let mut checked = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(acknowledged::EVERY) => {}
            () = shutdown.requested() => return,
        }
        let Some(acknowledged) = last.get().filter(|a| Some(*a) != recorded) else { continue };
        if client.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
            client = admin::connect(&database, &tls).await.ok();
        }
        let Some(db) = client.as_ref() else { continue };
        if !checked {
            match acknowledged::writable(db, &table).await {
                Ok(true) => match acknowledged::add_acknowledged_lsn(db, &table).await {
                    Ok(()) => checked = true,
                    Err(_) => continue,
                },
                Ok(false) => {
                    info!(%table, "no record of what JetStream acknowledged is kept: the table \
                        is missing or owned by another role (run `pgoutbox setup`); a restart \
                        of both pgoutbox and nats-server cannot tell a stream that lost events");
                    return;
                }
                Err(_) => continue,
            }
        }
        let Some(stream) = stream_identity(&publisher, publisher.stream()).await else { continue };
        match acknowledged::record(db, &table, &slot, &stream, acknowledged).await {
            Ok(()) => recorded = Some(acknowledged),
            Err(err) => warn!(%table, error = %admin::server_said(&err),
                "could not record what JetStream acknowledged; trying again"),
        }
    }
}
