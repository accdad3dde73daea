//! `pgoutbox status [--json]`: what an operator alerts on.
//!
//! Exit codes: 0 healthy; 1 warning (slot inactive, lag above `--max-lag-bytes`, the
//! running pgoutbox stalled); 2 critical (slot missing or lost, database unreachable, NATS
//! unreachable, the stream missing or not this source's: `status/nats.rs`).
//!
//! The slot comes from Postgres and the stream from NATS; the age of the last confirmation
//! is known only to the running process, so it is read from its `/metrics`.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::nats::publisher::ReplayRecord;
use crate::postgres::acknowledged;
use crate::postgres::admin::{self, SlotState, WalStatus};
use crate::postgres::replay_table;
use crate::service::telemetry;
use crate::service::telemetry::names;
use crate::settings::cli::StatusArgs;
use crate::settings::config::Config;

mod nats;
mod watch;

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
        println!("{report:#}");
    } else {
        print_table(&report);
    }
    health
}

/// The whole report, with its `health`; never fails: what could not be read is in it.
async fn report(config: &Config, args: &StatusArgs) -> (serde_json::Value, Health) {
    let StatusArgs { max_lag_bytes, http_addr, .. } = *args;
    let (mut report, health) = match admin::connect(&config.database, &config.pg_tls).await {
        Err(err) => (json!({ "slot": config.slot, "error": format!("{err:#}") }), Health::Critical),
        Ok(client) => match admin::slot_state(&client, &config.slot).await {
            Err(err) => {
                (json!({ "slot": config.slot, "error": format!("{err:#}") }), Health::Critical)
            }
            Ok(state) => {
                let (mut health, mut problems) = judge(state.as_ref(), max_lag_bytes);
                let mut report = slot_report(&config.slot, state.as_ref());
                // A seed from the table (`--recover`, `--backfill`) streams from its own
                // slot; the slot itself is made when the seed ends.
                let seed_name = format!("{}_seed", config.slot);
                let seed = admin::slot_state(&client, &seed_name).await.ok().flatten();
                if let Some(seed) = &seed {
                    report["seed"] = json!({
                        "slot": seed_name,
                        "active": seed.active,
                        "retained_wal_bytes": seed.retained_wal_bytes,
                        "wal_status": seed.wal_status.map(WalStatus::as_str),
                    });
                    if seed.active && state.is_none() {
                        health = Health::Warning;
                        problems = vec![format!(
                            "the stream is being seeded from the table (--recover, \
                             --backfill, or a loss only the table could refill); slot {} is \
                             made when that ends",
                            config.slot
                        )];
                    } else if !seed.active {
                        problems.push(format!(
                            "slot {seed_name} is left by a seed from the table that did not \
                             finish: the next pgoutbox run finishes it"
                        ));
                    }
                }
                // Where the running pgoutbox serves: as told, else as the slot's holder
                // advertises it, else the default.
                let advertised = state.as_ref().or(seed.as_ref()).and_then(|s| {
                    let name = s.holder_application_name.as_deref()?;
                    telemetry::advertised_http_addr(name, s.holder_client_addr.as_deref())
                });
                let addr = http_addr.or(advertised).unwrap_or(telemetry::DEFAULT_HTTP_ADDR);
                let mut process = process_report(addr).await;
                if process["stalled"] == json!(true) {
                    problems.push(format!(
                        "pgoutbox is stalled: no ack and nothing confirmed while messages wait \
                         (last confirmation {} s ago)",
                        process["last_confirmation_age_seconds"]
                    ));
                    health = health.max(Health::Warning);
                }
                report["postgres"] = postgres_report(&client).await;
                // A line of the report, not a warning at every call: a healthy default setup
                // writes nothing to stderr.
                let revoke = replay_table::public_may_emit(&client).await.ok();
                let may_emit = revoke.as_ref().map(Option::is_some);
                report["postgres"]["public_may_emit_message"] = json!(may_emit);
                if let Some(Some(revoke)) = revoke {
                    report["postgres"]["emit_message_fix"] = json!(revoke);
                }
                let mut nats = nats::report(config, state.is_some() || seed.is_some()).await;
                health = health.max(nats.health);
                problems.extend(nats.problems);
                if let Some(line) = made_again(config, &client, &nats.stream).await {
                    nats.stream["recreated"] = json!(line);
                    problems.push(line);
                    health = health.max(Health::Warning);
                }
                report["problems"] = json!(problems);
                report["nats"] = nats.nats;
                report["stream"] = nats.stream;
                report["tables"] = tables_report(config, &process, &nats.dead_letters_by_subject);
                if let Some(replay) = nats.replay {
                    report["replay"] = replay;
                }
                if let Some(process) = process.as_object_mut() {
                    process.remove("tables");
                }
                report["pgoutbox"] = process;
                (report, health)
            }
        },
    };
    report["health"] = json!(match health {
        Health::Healthy => "healthy",
        Health::Warning => "warning",
        Health::Critical => "critical",
    });
    (report, health)
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
    let table = acknowledged::table_beside(&config.pipeline.replay_table);
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

/// The server's version and whether it is in recovery (a standby); never fails the command.
async fn postgres_report(client: &tokio_postgres::Client) -> serde_json::Value {
    match (admin::server_version(client).await, admin::in_recovery(client).await) {
        (Ok((num, version)), Ok(in_recovery)) => {
            json!({ "version": version, "version_num": num, "in_recovery": in_recovery })
        }
        (Err(err), _) | (_, Err(err)) => json!({ "error": err.to_string() }),
    }
}

/// The per-row counters `status` shows for each table, as `/metrics` names them.
const TABLE_COUNTERS: [(&str, &str); 4] = [
    ("rows_published", names::ROWS_PUBLISHED),
    ("bytes_published", names::BYTES_PUBLISHED),
    ("dead_letters", names::DEAD_LETTERS),
    ("duplicates", names::DUPLICATES),
];

/// One object per table, in the configuration's order, then any other table the running
/// pgoutbox counts (`(emitted)`): its rows, bytes, dead letters and duplicates since the
/// process started, from its `/metrics` (null when it could not be read), and the dead
/// letters in the stream on its dead-letter subject. Those are counted by subject, which
/// the server does in one request without reading a message; a subject several tables
/// share cannot be split by table that cheaply (it would mean reading every letter's
/// `Pgoutbox-Table`), so such a table's `dead_letters_in_stream` is null and the sum is
/// `stream.dead_letters`. Lag is the slot's, shared by every table.
fn tables_report(
    config: &Config,
    process: &serde_json::Value,
    dead_letters_by_subject: &[(String, u64)],
) -> serde_json::Value {
    let counted = &process["tables"];
    let entries = &config.pipeline.tables;
    let mut tables = Vec::new();
    for entry in entries {
        let label = entry.metrics_label();
        let subject = &entry.dead_letter_subject;
        let shared = entries.iter().filter(|e| e.dead_letter_subject == *subject).count() > 1;
        let in_stream = dead_letters_by_subject
            .iter()
            .find(|(s, _)| s == subject)
            .filter(|_| !shared)
            .map(|(_, count)| *count);
        let mut table = json!({
            "table": label,
            "dead_letter_subject": subject,
            "dead_letters_in_stream": in_stream,
        });
        for (key, _) in TABLE_COUNTERS {
            table[key] = counted[&label][key].clone();
        }
        tables.push(table);
    }
    let known: Vec<String> = entries.iter().map(|e| e.metrics_label()).collect();
    for (label, counters) in counted.as_object().into_iter().flatten() {
        if known.contains(label) {
            continue;
        }
        let mut table = json!({ "table": label });
        for (key, _) in TABLE_COUNTERS {
            table[key] = counters[key].clone();
        }
        tables.push(table);
    }
    json!(tables)
}

/// Each table's per-row counters in `/metrics` text: label → { counter → value }.
fn table_counters(text: &str) -> serde_json::Value {
    let mut tables = serde_json::Map::new();
    for line in text.lines() {
        for (key, name) in TABLE_COUNTERS {
            if let Some((label, value)) = labelled(line, name) {
                let table = tables.entry(label).or_insert_with(|| json!({}));
                table[key] = json!(value as u64);
            }
        }
    }
    serde_json::Value::Object(tables)
}

/// `name{table="<label>"} <value>`: the label, unescaped as the text format escapes it
/// (`\\`, `\"`, `\n`), and the value.
fn labelled(line: &str, name: &str) -> Option<(String, f64)> {
    let rest = line.strip_prefix(name)?.strip_prefix("{table=\"")?;
    let mut label = String::new();
    let mut chars = rest.char_indices();
    let end = loop {
        match chars.next()? {
            (_, '\\') => match chars.next()?.1 {
                'n' => label.push('\n'),
                other => label.push(other),
            },
            (i, '"') => break i,
            (_, c) => label.push(c),
        }
    };
    let value = rest[end + 1..].strip_prefix('}')?.trim().parse().ok()?;
    Some((label, value))
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

/// The running process's view, from its `/metrics`; never fails the command.
async fn process_report(addr: SocketAddr) -> serde_json::Value {
    let addr = telemetry::reachable(addr, None);
    let gauges = async {
        let text = scrape_metrics(addr).await?;
        let gauge = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|value| value.trim().parse::<f64>().ok())
        };
        let age = gauge(names::LAST_CONFIRMATION_AGE)
            .context("its /metrics has no pgoutbox_last_confirmation_age_seconds")?;
        let mut report = json!({
            "http_addr": addr.to_string(),
            "last_confirmation_age_seconds": (age * 10.0).round() / 10.0,
            "stalled": gauge(names::STALLED) == Some(1.0),
            // Events the stream lost after acknowledging them (logged with what came back).
            "stream_lost_events": gauge(names::STREAM_LOST_EVENTS).unwrap_or(0.0) as u64,
            "stream_recreated": gauge(names::STREAM_RECREATED).unwrap_or(0.0) as u64,
            // What the durability horizon holds back to publish again after a power loss.
            "durability_horizon_seconds": gauge(names::DURABILITY_HORIZON_SECONDS),
            "durability_held_bytes": gauge(names::DURABILITY_HELD_BYTES).map(|b| b as u64),
            "tables_not_streamed": gauge(names::TABLES_NOT_STREAMED).unwrap_or(0.0) as u64,
            // A pattern's tables joined without their earlier rows read (owner not trusted),
            // and the rows the adoption under way has read.
            "tables_unread": gauge(names::TABLES_UNREAD).unwrap_or(0.0) as u64,
            "adoption_rows_read": gauge(names::ADOPTION_ROWS_READ).unwrap_or(0.0) as u64,
            // With --object-store: what its bucket holds (null without one).
            "object_store_bytes": gauge(names::OBJECT_STORE_BYTES).map(|b| b as u64),
        });
        // A seed or a replay in progress: rows done, rows left, and the pace.
        let runs = [
            ("seed", names::SEED_ROWS, names::SEED_ROWS_DONE, names::SEED_ROWS_PER_SECOND),
            ("replay", names::REPLAY_ROWS, names::REPLAY_ROWS_DONE, names::REPLAY_ROWS_PER_SECOND),
        ];
        for (what, rows, done, pace) in runs {
            let (rows, done) = (gauge(rows).unwrap_or(0.0), gauge(done).unwrap_or(0.0));
            report[format!("{what}_rows")] = json!(rows as u64);
            report[format!("{what}_rows_done")] = json!(done as u64);
            report[format!("{what}_rows_left")] = json!((rows - done).max(0.0) as u64);
            let pace = gauge(pace).unwrap_or(0.0);
            report[format!("{what}_rows_per_second")] = json!(pace.round() as u64);
        }
        // Moved to the report's `tables` by `tables_report`.
        report["tables"] = table_counters(&text);
        anyhow::Ok(report)
    };
    match tokio::time::timeout(Duration::from_secs(3), gauges).await {
        Ok(Ok(report)) => report,
        Ok(Err(err)) => json!({
            "http_addr": addr.to_string(),
            "error": format!("no running pgoutbox read at {addr}: {err:#} (set --http-addr)"),
        }),
        Err(_) => json!({ "http_addr": addr.to_string(), "error": "no answer within 3 s" }),
    }
}

/// One plain HTTP/1.0 GET of `/metrics`: the body, if the answer is 200.
async fn scrape_metrics(addr: SocketAddr) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.context("connect")?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.context("send")?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.context("read")?;
    let (head, body) = response.split_once("\r\n\r\n").context("not an HTTP response")?;
    let code = head.split_whitespace().nth(1).unwrap_or_default();
    anyhow::ensure!(code == "200", "HTTP status {code}");
    Ok(body.to_owned())
}

fn print_table(report: &serde_json::Value) {
    for line in table_lines(report) {
        println!("{line}");
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
    fn each_tables_counters_are_read_from_metrics_text() {
        let text = "\
# TYPE pgoutbox_rows_published_total counter
pgoutbox_rows_published_total{table=\"public.outbox\"} 5
pgoutbox_rows_published_total{table=\"billing.outbox\"} 3
pgoutbox_rows_published_total{table=\"(emitted)\"} 0
pgoutbox_dead_letters_total{table=\"billing.outbox\"} 1
pgoutbox_dead_letters_total{table=\"odd\\\"na\\\\me\\n\"} 2
pgoutbox_transactions_total 4
";
        let tables = table_counters(text);
        assert_eq!(tables["public.outbox"]["rows_published"], 5);
        assert_eq!(tables["billing.outbox"]["rows_published"], 3);
        assert_eq!(tables["billing.outbox"]["dead_letters"], 1);
        assert_eq!(tables["(emitted)"]["rows_published"], 0);
        assert_eq!(tables["odd\"na\\me\n"]["dead_letters"], 2);
        assert_eq!(tables.as_object().map(|t| t.len()), Some(4));
    }
}
