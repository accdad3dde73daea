//! Proof of delivery: one table's rows against the stream, shared by `pgoutbox verify` and
//! by `run --verify-every`, which checks on a schedule the rows created since its last
//! check and shows what it found on `/metrics` (issue 46). An acknowledgement is not
//! durability: a server that forgot what it acknowledged is seen within one period.
//!
//! Each row must be held once, as its message, a replay's copy or its dead letter (a
//! message with the row's id and another body is another row's: a reused id), and the
//! messages read must be in commit order (`domain::delivery`).

use std::time::Duration;

use metrics::gauge;
use tracing::{debug, warn};

use crate::domain::delivery::{Findings, OrderCheck, SHOWN};
use crate::domain::outbox::{MappingError, MessageId, RowMapping, TableEntry};
use crate::domain::seed::{EventPayload, payload_digest};
use crate::nats::publisher::{Publisher, PublisherError, ReadFrom};
use crate::postgres::admin::SetupError;
use crate::postgres::table_snapshot::{Selection, TableSnapshot};
use crate::postgres::tls::PgTls;
use crate::postgres::trust::TrustedOwners;
use crate::service::retention::PublishedUpTo;
use crate::service::shutdown::Shutdown;
use crate::service::telemetry::names;
use crate::settings::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("reading stream {stream}: {source}")]
    Stream { stream: String, source: PublisherError },
    #[error(transparent)]
    Table(#[from] SetupError),
    #[error("reading the table: {0}")]
    Rows(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Mapping(#[from] MappingError),
}

/// What one check found.
#[derive(Debug)]
pub struct Checked {
    /// `schema.table`.
    pub table: String,
    pub findings: Findings,
    pub order: OrderCheck,
    /// The last stream sequence read.
    pub last: u64,
}

impl Checked {
    pub fn clean(&self) -> bool {
        self.findings.missing == 0 && self.findings.duplicated == 0 && self.order.violations == 0
    }
}

/// What a check reads: the stream, the database, and the exactly named tables (a message
/// without `Pgoutbox-Table`, from an older version, is the first's, as the seed reads it).
#[derive(Clone)]
pub struct Scope {
    pub stream: String,
    pub database: tokio_postgres::Config,
    pub pg_tls: PgTls,
    pub tables: Vec<TableEntry>,
    /// Whose tables may be read (`--trusted-owner`).
    pub trusted: TrustedOwners,
}

impl Scope {
    pub fn of(config: &Config) -> Scope {
        Scope {
            stream: config.stream.clone(),
            database: config.database.clone(),
            pg_tls: config.pg_tls.clone(),
            trusted: config.trusted_owners.clone(),
            tables: config
                .pipeline
                .tables
                .iter()
                .filter(|e| e.pattern.is_none())
                .cloned()
                .collect(),
        }
    }
}

/// Checks the rows of `entry`'s table that `selection` picks, in one snapshot, against the
/// stream's messages read `from` there to its end; `all_missing` keeps every missing row's id
/// (for a replay), else the first [`SHOWN`].
pub async fn check(
    scope: &Scope,
    publisher: &Publisher,
    entry: &TableEntry,
    selection: &Selection,
    from: ReadFrom,
    all_missing: bool,
) -> Result<Checked, CheckError> {
    let mut tables: Vec<(String, String)> =
        scope.tables.iter().map(|e| (e.table.to_string(), e.roles.payload.clone())).collect();
    let name = entry.table.to_string();
    if !tables.iter().any(|(table, _)| *table == name) {
        tables.push((name.clone(), entry.roles.payload.clone()));
    }
    let mut order = OrderCheck::default();
    let (held, last) = publisher
        .held_rows(from, &tables, Some(&mut order))
        .await
        .map_err(|source| CheckError::Stream { stream: scope.stream.clone(), source })?;

    let session = TableSnapshot::session(&scope.database, &scope.pg_tls, None).await?;
    let snapshot =
        TableSnapshot::read_set(session, &[(&entry.table, &entry.roles)], &scope.trusted).await?;
    let mapping = RowMapping::of_entry(snapshot.relation(), entry)?;
    let qualifier = match entry.message_id {
        MessageId::Qualified => format!("{name}:"),
        MessageId::Row => String::new(),
    };
    let mut findings = Findings::default();
    let (mut rows, _reader) = snapshot.read(selection);
    while let Some(batch) = rows.recv().await {
        for tuple in batch? {
            let Some(id) = mapping.row_id(&tuple) else { continue };
            let event = mapping.map(&tuple).ok();
            let event = event.as_ref().map(|event| EventPayload::new(&event.payload));
            let payload = mapping.payload_text(&tuple).map(|text| payload_digest(text.as_bytes()));
            let found = held.holds(&name, &id, event.as_ref(), payload);
            let copies = event.map_or(0, |event| held.copies(&name, &id, &event));
            let own = id.strip_prefix(qualifier.as_str()).unwrap_or(&id);
            findings.row(own, found, copies, all_missing);
        }
    }
    snapshot.close().await;
    Ok(Checked { table: name, findings, order, last })
}

/// How long before the newest published commit a row must have been created to be checked:
/// its transaction may have been open that long, and committed after that commit.
const SETTLED: Duration = Duration::from_secs(60);

/// How far back the first check of a process looks: rows its predecessor published may
/// have been lost while no pgoutbox ran.
const FIRST_LOOK: Duration = Duration::from_secs(600);

/// How much earlier than the rows' window the stream is read: the clocks of Postgres and
/// NATS may differ that much.
const CLOCK_SKEW: f64 = 60.0;

/// `run --verify-every`: every `every`, the rows of each named table created since the last
/// clean check (the first looks back [`FIRST_LOOK`]) and at least [`SETTLED`] before the
/// newest commit pgoutbox published
/// (`published_up_to`), against the stream read from a little before them. What it finds is
/// on `/metrics` (`pgoutbox_verify_*`) and, when not clean, in one warning per table with
/// the ids and the `replay` that publishes them again. A check that cannot be made is
/// logged and tried at the next period.
pub async fn run_every(
    scope: Scope,
    publisher: Publisher,
    every: Duration,
    published_up_to: PublishedUpTo,
    mut shutdown: Shutdown,
) {
    let mut checked_to: Option<f64> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = shutdown.requested() => return,
        }
        let Some(newest) = published_up_to.unix_seconds() else { continue };
        let to = newest - SETTLED.as_secs_f64();
        let from = checked_to.unwrap_or(to - FIRST_LOOK.max(every).as_secs_f64());
        if to <= from {
            continue;
        }
        let selection = Selection::Created { from: Some(timestamp(from)), to: Some(timestamp(to)) };
        let mut clean = true;
        for entry in &scope.tables {
            let read_from = ReadFrom::Time(from - CLOCK_SKEW);
            match check(&scope, &publisher, entry, &selection, read_from, false).await {
                Ok(checked) => {
                    clean &= checked.clean();
                    record(&checked, (from, to));
                }
                Err(err) => {
                    warn!(table = %entry.table, error = %err, "verify: the scheduled check \
                        could not be made; trying again in one period");
                    clean = false;
                }
            }
        }
        if clean {
            checked_to = Some(to);
            gauge!(names::VERIFY_CHECKED_TO).set(to);
        }
    }
}

/// A time in epoch seconds as a timestamptz literal (RFC 3339).
fn timestamp(epoch: f64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos((epoch * 1e9) as i128)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

fn record(checked: &Checked, (from, to): (f64, f64)) {
    let Checked { table, findings, order, .. } = checked;
    let labels = [("table", table.clone())];
    gauge!(names::VERIFY_MISSING_ROWS, &labels).set(findings.missing as f64);
    gauge!(names::VERIFY_DUPLICATED_ROWS, &labels).set(findings.duplicated as f64);
    gauge!(names::VERIFY_OUT_OF_ORDER, &labels).set(order.violations as f64);
    if checked.clean() {
        debug!(%table, rows = findings.rows, "verify: every row created in the period is held once, in order");
        return;
    }
    let ids = findings.missing_ids.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(",");
    warn!(%table, rows = findings.rows, missing = findings.missing,
        duplicated = findings.duplicated, out_of_order = order.violations,
        created_from = from, created_to = to, missing_ids = %ids,
        "verify: the stream does not hold every row created in the period once and in order \
         (a server that lost what it acknowledged?); `pgoutbox replay --ids <missing ids>` \
         publishes the missing again");
}
