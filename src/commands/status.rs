//! `pgoutbox status [--json]`: what an operator alerts on.
//!
//! Exit codes: 0 healthy; 1 warning (slot inactive, lag above `--max-lag-bytes`, the
//! running pgoutbox stalled); 2 critical (slot missing or lost, database unreachable, NATS
//! unreachable, the stream missing or not this source's: `status/nats.rs`).
//!
//! The slot comes from Postgres and the stream from NATS; the age of the last confirmation
//! is known only to the running process, so it is read from its `/metrics`.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::nats::publisher::ReplayRecord;
use crate::postgres::acknowledged;
use crate::postgres::admin::{self, SlotState, WalStatus};
use crate::postgres::replay_table;
use crate::service::telemetry;
use crate::settings::cli::StatusArgs;
use crate::settings::config::Config;

mod nats;
mod process;
mod watch;

use process::{process_report, tables_report};

/// The health verdict, which is also the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    Healthy = 0,
    Warning = 1,
    Critical = 2,
}

pub async fn run(config: &Config, args: &StatusArgs) -> Health {
    if args.watch {
        return watch::run(config, args).await;
    }
    let (report, health) = report(config, args).await;
    if let Some(error) = report["error"].as_str() {
        // The report says it too, but a script reading stdout as JSON should not have to
        // look for it, and a human expects an error on stderr.
        eprintln!("error: {error}");
    }
    if args.json {
        say!("{report:#}");
    } else {
        print_table(&report);
    }
    health
}

/// The whole report, with its `health`; never fails: what could not be read is in it.
async fn report(config: &Config, args: &StatusArgs) -> (serde_json::Value, Health) {
    let unreadable = |err: &dyn std::fmt::Display| {
        let report = json!({ "slot": config.slot, "error": format!("{err:#}") });
        Findings { report, health: Health::Critical, problems: Vec::new() }
    };
    let found = match admin::connect(&config.database, &config.pg_tls).await {
        Err(err) => unreadable(&err),
        Ok(client) => match admin::slot_state(&client, &config.slot).await {
            Err(err) => unreadable(&err),
            Ok(state) => with_the_slot(config, args, &client, state).await,
        },
    };
    let Findings { mut report, health, .. } = found;
    report["health"] = json!(match health {
        Health::Healthy => "healthy",
        Health::Warning => "warning",
        Health::Critical => "critical",
    });
    (report, health)
}

/// A report being written: its parts, the worst health found, and the problems behind it.
struct Findings {
    report: serde_json::Value,
    health: Health,
    problems: Vec<String>,
}

impl Findings {
    fn problem(&mut self, health: Health, line: String) {
        self.health = self.health.max(health);
        self.problems.push(line);
    }
}

/// The report once the slot could be read: the slot, a seed's slot, the running process,
/// the server, NATS and the stream, each table.
async fn with_the_slot(
    config: &Config,
    args: &StatusArgs,
    client: &tokio_postgres::Client,
    state: Option<SlotState>,
) -> Findings {
    let (health, problems) = judge(state.as_ref(), args.max_lag_bytes);
    let report = slot_report(&config.slot, state.as_ref());
    let mut found = Findings { report, health, problems };
    let seed = seed_report(config, client, state.is_none(), &mut found).await;
    let holder = state.as_ref().or(seed.as_ref());
    let mut process = running_process(holder, args.http_addr, &mut found).await;
    horizon_room(client, &process, &mut found).await;
    found.report["postgres"] = postgres_report(client).await;
    let mut nats = nats::report(config, holder.is_some()).await;
    found.health = found.health.max(nats.health);
    found.problems.extend(nats.problems);
    if let Some(line) = made_again(config, client, &nats.stream).await {
        nats.stream["recreated"] = json!(line);
        found.problem(Health::Warning, line);
    }
    found.report["problems"] = json!(found.problems);
    found.report["nats"] = nats.nats;
    found.report["stream"] = nats.stream;
    found.report["tables"] = tables_report(config, &process, &nats.dead_letters_by_subject);
    if let Some(replay) = nats.replay {
        found.report["replay"] = replay;
    }
    if let Some(process) = process.as_object_mut() {
        process.remove("tables");
    }
    found.report["pgoutbox"] = process;
    found
}

/// A seed from the table (`--recover`, `--backfill`) streams from a slot of its own; the
/// slot itself is made when the seed ends. While one runs, a missing slot is a warning.
async fn seed_report(
    config: &Config,
    client: &tokio_postgres::Client,
    slot_missing: bool,
    found: &mut Findings,
) -> Option<SlotState> {
    let seed_name = format!("{}_seed", config.slot);
    let seed = admin::slot_state(client, &seed_name).await.ok().flatten()?;
    found.report["seed"] = json!({
        "slot": seed_name,
        "active": seed.active,
        "retained_wal_bytes": seed.retained_wal_bytes,
        "wal_status": seed.wal_status.map(WalStatus::as_str),
    });
    if seed.active && slot_missing {
        found.health = Health::Warning;
        found.problems = vec![format!(
            "the stream is being seeded from the table (--recover, --backfill, or a loss only \
             the table could refill); slot {} is made when that ends",
            config.slot
        )];
    } else if !seed.active {
        found.problems.push(format!(
            "slot {seed_name} is left by a seed from the table that did not finish: the next \
             pgoutbox run finishes it"
        ));
    }
    Some(seed)
}

/// The running pgoutbox's view (`process::process_report`), found where told, else where the
/// slot's holder advertises it, else at the default; a stall is a warning.
async fn running_process(
    holder: Option<&SlotState>,
    http_addr: Option<SocketAddr>,
    found: &mut Findings,
) -> serde_json::Value {
    let advertised = holder.and_then(|s| {
        let name = s.holder_application_name.as_deref()?;
        telemetry::advertised_http_addr(name, s.holder_client_addr.as_deref())
    });
    let addr = http_addr.or(advertised).unwrap_or(telemetry::DEFAULT_HTTP_ADDR);
    let process = process_report(addr).await;
    if process["stalled"] == json!(true) {
        found.problem(
            Health::Warning,
            format!(
                "pgoutbox is stalled: no ack and nothing confirmed while messages wait (last \
                 confirmation {} s ago)",
                process["last_confirmation_age_seconds"]
            ),
        );
    }
    process
}

/// A warning when the WAL the durability horizon will hold at the current write rate
/// (`durability_needed_bytes`) passes half of `max_slot_wal_keep_size`: a slot past that is
/// invalidated, and pgoutbox stops until a recovery.
async fn horizon_room(
    client: &tokio_postgres::Client,
    process: &serde_json::Value,
    found: &mut Findings,
) {
    let Some(needed) = process["durability_needed_bytes"].as_f64() else { return };
    let Ok(Some(keep)) = admin::max_slot_wal_keep_size(client).await else { return };
    if let Some(line) =
        horizon_room_problem(needed, keep, process["durability_horizon_seconds"].as_f64())
    {
        found.problem(Health::Warning, line);
    }
}

/// The line [`horizon_room`] warns with, if any: `needed` and `keep` in bytes.
fn horizon_room_problem(needed: f64, keep: i64, horizon_s: Option<f64>) -> Option<String> {
    let keep = keep as f64;
    (needed > keep / 2.0).then(|| {
        let mb = |b: f64| (b / 1e6).round();
        format!(
            "at this write rate the durability horizon ({} s) holds about {} MB of WAL, more \
             than half of max_slot_wal_keep_size ({} MB): a slot past it is invalidated and \
             pgoutbox stops; raise max_slot_wal_keep_size above {} MB, or shorten \
             --durability-horizon towards the NATS server's sync_interval \
             (docs/runbooks/stream-lost-events.md)",
            horizon_s.unwrap_or_default(),
            mb(needed),
            mb(keep),
            mb(2.0 * needed)
        )
    })
}

/// A line when the stream is not the one pgoutbox recorded under its name (deleted and
/// created again: its history is gone from it), from the record in Postgres.
async fn made_again(
    config: &Config,
    client: &tokio_postgres::Client,
    stream: &serde_json::Value,
) -> Option<String> {
    let created = stream["created_unix_ns"].as_str()?.to_owned();
    let now = acknowledged::StreamIdentity { name: config.stream.clone(), created };
    let table = acknowledged::table_in(&config.own_schema);
    let before = acknowledged::made_again(client, &table, &config.slot, &now).await.ok()??;
    Some(format!(
        "stream {} was deleted and created again ({before}): what the old one held is not in \
         it unless `pgoutbox run --backfill` refilled it from the outbox tables",
        config.stream
    ))
}

fn judge(state: Option<&SlotState>, max_lag_bytes: i64) -> (Health, Vec<String>) {
    let Some(state) = state else {
        return (Health::Critical, vec!["slot does not exist".into()]);
    };
    let mut problems = Vec::new();
    let mut health = Health::Healthy;
    if state.wal_status == Some(WalStatus::Lost) {
        problems.push("slot is lost: the WAL it needs was removed".into());
        health = Health::Critical;
    }
    if !state.active {
        problems.push("slot is not active: no pgoutbox is streaming".into());
        health = health.max(Health::Warning);
    }
    if state.lag_bytes.is_some_and(|lag| lag > max_lag_bytes) {
        problems.push(format!("lag is above {max_lag_bytes} bytes"));
        health = health.max(Health::Warning);
    }
    (health, problems)
}

fn slot_report(name: &str, state: Option<&SlotState>) -> serde_json::Value {
    match state {
        None => json!({ "slot": name, "exists": false }),
        Some(s) => json!({
            "slot": name,
            "exists": true,
            "plugin": s.plugin,
            "active": s.active,
            "active_pid": s.active_pid,
            "wal_status": s.wal_status.map(WalStatus::as_str),
            "safe_wal_size": s.safe_wal_size,
            "confirmed_flush_lsn": s.confirmed_flush_lsn,
            "restart_lsn": s.restart_lsn,
            "current_wal_lsn": s.current_wal_lsn,
            "lag_bytes": s.lag_bytes,
            "lag_seconds": s.lag_seconds,
            "retained_wal_bytes": s.retained_wal_bytes,
            "failover": s.failover,
            "synced": s.synced,
        }),
    }
}

/// The server's version, whether it is in recovery (a standby), and whether anyone may emit
/// messages into the WAL; never fails the command.
async fn postgres_report(client: &tokio_postgres::Client) -> serde_json::Value {
    let mut report = match (admin::server_version(client).await, admin::in_recovery(client).await) {
        (Ok((num, version)), Ok(in_recovery)) => {
            json!({ "version": version, "version_num": num, "in_recovery": in_recovery })
        }
        (Err(err), _) | (_, Err(err)) => json!({ "error": err.to_string() }),
    };
    // A line of the report, not a warning at every call: a healthy default setup writes
    // nothing to stderr.
    let revoke = replay_table::public_may_emit(client).await.ok();
    report["public_may_emit_message"] = json!(revoke.as_ref().map(Option::is_some));
    if let Some(Some(revoke)) = revoke {
        report["emit_message_fix"] = json!(revoke);
    }
    report
}

/// The last replay into the stream: running, finished, or stopped (killed, or waiting to be
/// resumed) when its record is older than a few seconds.
fn replay_report(record: ReplayRecord) -> serde_json::Value {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let age = now.saturating_sub(record.updated_at);
    let state = match (record.finished, age) {
        (true, _) => "finished".to_owned(),
        (false, 0..=5) => "running".to_owned(),
        (false, _) => format!("stopped: resume it with --replay-id {}", record.replay_id),
    };
    json!({
        "replay_id": record.replay_id,
        "state": state,
        "rows": record.rows,
        "rows_done": record.rows_done,
        "rows_left": record.rows.saturating_sub(record.rows_done),
        "rows_per_second": record.rows_per_second.round(),
        "updated_seconds_ago": age,
    })
}

fn print_table(report: &serde_json::Value) {
    for line in table_lines(report) {
        say!("{line}");
    }
}

/// The report as aligned `key  value` lines.
fn table_lines(report: &serde_json::Value) -> Vec<String> {
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut push = |prefix: &str, value: &serde_json::Value| {
        if let Some(object) = value.as_object() {
            for (key, value) in object {
                if value.is_object() || key == "problems" || key == "tables" {
                    continue;
                }
                let text = match value {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Null => "-".into(),
                    other => other.to_string(),
                };
                rows.push((format!("{prefix}{key}"), text));
            }
        }
    };
    push("", report);
    push("postgres.", &report["postgres"]);
    push("nats.", &report["nats"]);
    push("stream.", &report["stream"]);
    push("pgoutbox.", &report["pgoutbox"]);
    push("seed.", &report["seed"]);
    push("replay.", &report["replay"]);
    // One line per table: its figures as `key=value`, null as `-`.
    for table in report["tables"].as_array().into_iter().flatten() {
        let name = table["table"].as_str().unwrap_or_default();
        let figures: Vec<String> = table
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(key, _)| *key != "table")
            .map(|(key, value)| match value {
                serde_json::Value::Null => format!("{key}=-"),
                serde_json::Value::String(s) => format!("{key}={s}"),
                other => format!("{key}={other}"),
            })
            .collect();
        rows.push((format!("table {name}"), figures.join(" ")));
    }
    if let Some(problems) = report["problems"].as_array() {
        for problem in problems {
            rows.push(("problem".into(), problem.as_str().unwrap_or_default().to_owned()));
        }
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.into_iter().map(|(key, value)| format!("{key:<width$}  {value}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_horizon_that_fills_half_of_max_slot_wal_keep_size_is_a_warning_saying_what_to_change() {
        let gib = 1_073_741_824;
        assert_eq!(horizon_room_problem(400e6, gib, Some(150.0)), None);
        let line = horizon_room_problem(600e6, gib, Some(150.0)).expect("a warning");
        assert!(line.contains("600 MB") && line.contains("1074 MB"), "{line}");
        assert!(line.contains("above 1200 MB") && line.contains("--durability-horizon"), "{line}");
    }
}
