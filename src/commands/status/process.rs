//! The running pgoutbox's own view, read from its `/metrics`: how long since it last
//! confirmed, whether it is stalled, a seed's or replay's progress, and each table's counters.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::service::telemetry;
use crate::service::telemetry::names;
use crate::settings::config::Config;

/// The running process's view, from its `/metrics`; never fails the command.
pub(super) async fn process_report(addr: SocketAddr) -> serde_json::Value {
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
            // Since when the oldest held position waits, when it is due, and what the horizon
            // holds once full at the current write rate.
            "durability_held_seconds": gauge(names::DURABILITY_HELD_SECONDS).map(round),
            "durability_next_release_seconds":
                gauge(names::DURABILITY_NEXT_RELEASE_SECONDS).map(round),
            "durability_needed_bytes": gauge(names::DURABILITY_NEEDED_BYTES).map(|b| b as u64),
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

/// To a tenth of a second.
fn round(seconds: f64) -> f64 {
    (seconds * 10.0).round() / 10.0
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
pub(super) fn tables_report(
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
