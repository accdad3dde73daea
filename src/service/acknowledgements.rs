//! Keeps the record of what JetStream acknowledged up to date in Postgres
//! (`postgres::acknowledged`), so that a start after a restart of both pgoutbox and
//! nats-server still sees a stream that came back shorter.

use std::sync::{Arc, Mutex};

use tracing::warn;

use crate::domain::horizon::Stored;
use crate::nats::publisher::Publisher;
use crate::postgres::acknowledged::{self, Acknowledged, Owner, StreamIdentity};
use crate::postgres::admin::{self, TableName};

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

/// Records `last` for `slot` every [`acknowledged::EVERY`] when a message was acknowledged
/// since (an idle outbox writes nothing), and once more
/// when `stopped` says the pipeline ended (after its drain), so that the next process
/// starts from the last acknowledgement, not one up to a second older. A table pgoutbox's
/// role does not own, or none at all, is said once and left alone.
pub async fn record_every(
    database: tokio_postgres::Config,
    tls: crate::postgres::tls::PgTls,
    (table, slot): (TableName, String),
    publisher: Publisher,
    last: LastAcknowledged,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut client = None;
    let mut recorded: Option<Acknowledged> = None;
    let mut checked = false;
    let mut last_round = false;
    while !last_round {
        tokio::select! {
            () = tokio::time::sleep(acknowledged::EVERY) => {}
            _ = stopped.wait_for(|stopped| *stopped) => last_round = true,
        }
        // Only a new acknowledgement is recorded: a keepalive's move of `up_to` alone was
        // this task's own write coming back, which wrote again every second, forever.
        let new = |a: &Acknowledged| recorded.is_none_or(|r| r.stored != a.stored);
        let Some(acknowledged) = last.get().filter(new) else { continue };
        if client.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
            client = admin::connect(&database, &tls).await.ok();
        }
        let Some(db) = client.as_ref() else { continue };
        if !checked {
            match acknowledged::owner(db, &table).await {
                Ok(Owner::Ours) => match acknowledged::add_acknowledged_lsn(db, &table).await {
                    Ok(()) => checked = true,
                    Err(_) => continue,
                },
                Ok(not_ours) => return say_no_record_is_kept(&table, not_ours),
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

/// One warning with the command that fixes it: without the record, a restart of both
/// pgoutbox and nats-server cannot tell a stream that lost events, and `pgoutbox replay`
/// waits for the slot. pgoutbox writes only a table its own role owns (a trigger on
/// another's would run as pgoutbox), so the fix is the table made again by that role.
fn say_no_record_is_kept(table: &TableName, owner: Owner) {
    let fix = match owner {
        Owner::Theirs { owner, login, .. } => format!(
            "it is owned by role {owner:?}, not by pgoutbox's role {login:?}: as {owner:?}, run \
             `DROP TABLE {table}`, then `pgoutbox setup` as {login:?}"
        ),
        _ => "it is missing: run `pgoutbox setup` as pgoutbox's role".to_owned(),
    };
    warn!(%table, "no record of what JetStream acknowledged is kept ({fix}); a restart of \
        both pgoutbox and nats-server cannot tell a stream that lost events, and pgoutbox \
        replay waits for the slot");
}
