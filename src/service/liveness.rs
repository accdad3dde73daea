//! Proof, while streaming, that the Postgres end of the replication connection still answers.
//!
//! Silence on the replication socket proves nothing: a walsender whose receiver confirmed
//! everything sends nothing while the database is idle. TCP keepalive (see `conninfo`) finds
//! a peer that vanished, but not a black hole behind a proxy or load balancer, where the
//! kernel next door keeps acknowledging and nothing reaches the server. So every
//! [`CHECK_EVERY`] this task asks Postgres, over an ordinary SQL connection to the same
//! address, whether the slot is still held by our walsender:
//! `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`. No answer within
//! [`DEADLINE`], a lost connection, or another holder is a verdict the pipeline ends the
//! attempt on; `commands::run` then reconnects and resumes from the slot, and nothing is
//! lost because only acknowledged rows were ever confirmed.
//!
//! A black hole is found within `CHECK_EVERY + DEADLINE` (20 s) of starting. An error the
//! server sends (a refused login, `idle_session_timeout`) proves the path alive and is only
//! logged; the connection is opened again at the next check.
//!
//! The same check asks whether the outbox table still has its name and is still published
//! (`postgres::outbox_table`): a table dropped from the publication while streaming is
//! not decoded at all from that point, so waiting for the next attempt to notice could
//! take days. A drift found here stops pgoutbox like one found at the start of an attempt.
//!
//! Beside it, and outside its deadline, `adopter` adopts the tables of a pattern
//! that are out of the publication; a drift it finds ends the attempt through the same
//! verdict.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio_postgres::Client;
use tracing::{debug, warn};

use crate::domain::outbox::{ColumnRoles, TableEntry, TablePattern};
use crate::postgres::admin::TableName;
use crate::postgres::adoption::Handover;
use crate::postgres::outbox_table::{self, StreamedTable, TableDrift};
use crate::postgres::tenant_tables;
use crate::postgres::tls::PgTls;

mod adopter;

/// How often the path to Postgres is checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);
/// How long a check (connecting included) may take before the path counts as dead: a
/// catalog lookup answers in milliseconds even on a busy server.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Why the attempt must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The path to Postgres is dead or the slot is no longer ours: reconnect.
    Unresponsive(String),
    /// The outbox table or its publication changed: stop.
    Drift(TableDrift),
}

/// What the check watches besides the slot: the tables named exactly, the patterns, and
/// their publication.
#[derive(Debug, Clone)]
pub struct Watched {
    pub tables: Vec<TableName>,
    /// Each pattern, with the columns its adopted tables' rows are read in the order of.
    pub patterns: Vec<(TablePattern, ColumnRoles)>,
    /// The OIDs of the tables the patterns matched at the attempt's start: one of these
    /// out of the publication was taken out on purpose, and stops pgoutbox like an exact
    /// table would; only a table new since is adopted.
    pub matched: Vec<u32>,
    /// The publication, and where adoptions hand rows over.
    pub adoption: Handover,
}

impl Watched {
    /// Every entry's table or pattern (none with `--messages-only`).
    pub fn of(entries: &[TableEntry], streamed: &[StreamedTable], adoption: Handover) -> Watched {
        let exact = entries.iter().filter(|e| e.pattern.is_none());
        let of_pattern =
            |t: &&StreamedTable| entries.get(t.entry).is_some_and(|e| e.pattern.is_some());
        Watched {
            tables: exact.map(|e| e.table.clone()).collect(),
            patterns: entries
                .iter()
                .filter_map(|e| Some((e.pattern.clone()?, e.roles.clone())))
                .collect(),
            matched: streamed.iter().filter(of_pattern).map(|t| t.table.oid).collect(),
            adoption,
        }
    }
}

/// The running check, stopped when dropped (the attempt it watched is over).
pub struct Liveness {
    verdict: watch::Receiver<Option<Verdict>>,
    /// The check, and the adopter beside it.
    tasks: [AbortHandle; 2],
}

impl Liveness {
    /// Starts checking that `slot` stays held by `walsender_pid` (when known), that each
    /// of `watched`'s tables stays in its publication, and that no table its patterns
    /// match is out of it, over a connection made from `config`.
    pub fn spawn(
        config: &tokio_postgres::Config,
        tls: &PgTls,
        slot: &str,
        walsender_pid: Option<i32>,
        watched: Watched,
    ) -> Liveness {
        let (tell, verdict) = watch::channel(None);
        let mut adopting = config.clone();
        adopting.application_name("pgoutbox adopting tables");
        let adopter = crate::service::liveness::adopter::run(
            adopting,
            tls.clone(),
            watched.clone(),
            tell.clone(),
        );
        let adopter = tokio::spawn(adopter);
        let mut config = config.clone();
        config.application_name("pgoutbox liveness check");
        let check =
            Check { config, tls: tls.clone(), slot: slot.to_owned(), walsender_pid, watched };
        let task = tokio::spawn(check.run(tell));
        Liveness { verdict, tasks: [task.abort_handle(), adopter.abort_handle()] }
    }

    /// Changes to `Some(why)` once the path to Postgres is found dead or the table drifted.
    pub fn verdict(&self) -> watch::Receiver<Option<Verdict>> {
        self.verdict.clone()
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Whether Postgres refused a session because it is shutting down (or ended one for it). A
/// walsender waits, at shutdown, until its client confirmed all the WAL it sent, which the
/// durability horizon holds back: the attempt ends, and the slot keeps what is unconfirmed.
fn shutting_down(err: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    let stopping = [SqlState::ADMIN_SHUTDOWN, SqlState::CANNOT_CONNECT_NOW];
    err.code().is_some_and(|code| stopping.contains(code))
}

struct Check {
    config: tokio_postgres::Config,
    tls: PgTls,
    slot: String,
    walsender_pid: Option<i32>,
    /// The outbox tables, the patterns and their publication.
    watched: Watched,
}

impl Check {
    async fn run(mut self, tell: watch::Sender<Option<Verdict>>) {
        let mut client: Option<Client> = None;
        let mut ticks = tokio::time::interval(CHECK_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is immediate; replication just proved the path
        loop {
            ticks.tick().await;
            // The password command runs outside the deadline: a slow token service says
            // nothing about the path to Postgres.
            let login = match &client {
                Some(open) if !open.is_closed() => None,
                _ => match self.tls.login(&self.config).await {
                    Ok(config) => Some(config.into_owned()),
                    Err(err) => {
                        warn!(error = %err, "liveness check cannot log in; trying again");
                        continue;
                    }
                },
            };
            let checked = self.once(&mut client, login.as_ref());
            let verdict = match tokio::time::timeout(DEADLINE, checked).await {
                Err(_) => Some(Verdict::Unresponsive(format!(
                    "no answer to the liveness check in {DEADLINE:?}"
                ))),
                Ok(Ok(verdict)) => verdict,
                Ok(Err(err)) if shutting_down(&err) => Some(Verdict::Unresponsive(format!(
                    "Postgres is shutting down ({err}): leaving the walsender, which would \
                     hold the shutdown until the durability horizon let the slot be confirmed"
                ))),
                Ok(Err(err)) if err.as_db_error().is_some() => {
                    warn!(error = %err, "liveness check refused by Postgres; trying again");
                    client = None;
                    None
                }
                Ok(Err(err)) => {
                    Some(Verdict::Unresponsive(format!("liveness check failed: {err}")))
                }
            };
            if let Some(why) = verdict {
                // Nobody listens once the attempt is over; the task ends either way.
                let _ = tell.send(Some(why));
                return;
            }
        }
    }

    /// One check: `Some(why)` when the slot is no longer ours or the table drifted.
    /// `login`: the settings to open a new connection with, when there is none open.
    async fn once(
        &mut self,
        client: &mut Option<Client>,
        login: Option<&tokio_postgres::Config>,
    ) -> Result<Option<Verdict>, tokio_postgres::Error> {
        let connected = match (client.take(), login) {
            (Some(open), _) if !open.is_closed() => open,
            (_, login) => {
                let config = login.unwrap_or(&self.config);
                crate::postgres::admin::open(config, self.tls.client_config()).await?
            }
        };
        let row = connected
            .query_opt(
                "SELECT active_pid FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await?;
        let holder: Option<i32> = row.and_then(|r| r.get(0));
        debug!(slot = %self.slot, ?holder, ours = ?self.walsender_pid, "liveness check");
        if let Some(why) = verdict(&self.slot, self.walsender_pid, holder) {
            return Ok(Some(Verdict::Unresponsive(why)));
        }
        let publication = &self.watched.adoption.publication;
        for table in &self.watched.tables {
            // The replay table's OID is the attempt's concern, not a drift.
            let query = outbox_table::query(table, publication, None);
            let answer = connected.simple_query(&query).await?;
            let rows = tenant_tables::text_rows(&answer);
            if let Err(drift) = outbox_table::judge(&rows, table, publication) {
                return Ok(Some(Verdict::Drift(drift)));
            }
        }
        *client = Some(connected);
        Ok(None)
    }
}

/// Whether the slot is still held by our walsender; `Some(why)` when not.
fn verdict(slot: &str, ours: Option<i32>, holder: Option<i32>) -> Option<String> {
    match (ours, holder) {
        (_, None) => Some(format!("replication slot {slot} is no longer in use by our walsender")),
        (Some(ours), Some(holder)) if ours != holder => Some(format!(
            "replication slot {slot} is held by process {holder}, not by our walsender {ours}"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::verdict;

    #[test]
    fn the_slot_must_stay_with_our_walsender() {
        assert_eq!(verdict("s", Some(7), Some(7)), None);
        assert_eq!(verdict("s", None, Some(7)), None, "pid unknown: any holder will do");
        assert!(verdict("s", Some(7), Some(8)).unwrap().contains("process 8"));
        assert!(verdict("s", Some(7), None).unwrap().contains("no longer in use"));
    }
}
