//! The NATS half of `status`: the server, the stream and who writes it, judged.
//!
//! pgoutbox confirms nothing it cannot store, so a NATS it cannot reach, a stream that is
//! not there, or a stream another source writes means nothing flows: each is critical, as
//! a missing slot is. A stream that exists while the slot exists but is not claimed by this
//! source is critical too: `run` and `setup` claim the stream before the slot is made and
//! on every connection, so such a stream is not the one this source writes (status is
//! pointed at another NATS, or one with the same stream name), or its claim was released
//! (`nats kv del`) and the next start takes it again; either way the figures shown are not
//! this pipeline's. Every error is said once, as a problem; the report's fields say what
//! was reached (`nats.connected`, `nats.jetstream_answered`, `stream.exists`).

use std::time::Duration;

use serde_json::json;

use super::{Health, replay_report};
use crate::nats::claim::{self, Claim};
use crate::nats::durability;
use crate::nats::publisher::{Publisher, PublisherError};
use crate::settings::config::Config;

/// How long NATS has to answer everything `status` asks it.
const DEADLINE: Duration = Duration::from_secs(5);

/// What `status` reads from NATS and what it makes of it.
pub(super) struct NatsReport {
    pub nats: serde_json::Value,
    pub stream: serde_json::Value,
    pub replay: Option<serde_json::Value>,
    /// The messages on each dead-letter subject, when they could be counted.
    pub dead_letters_by_subject: Vec<(String, u64)>,
    pub health: Health,
    pub problems: Vec<String>,
}

impl NatsReport {
    fn critical(&mut self, problem: String) {
        self.problems.push(problem);
        self.health = Health::Critical;
    }

    fn warning(&mut self, problem: String) {
        self.problems.push(problem);
        self.health = self.health.max(Health::Warning);
    }
}

/// `slot_in_use`: the slot (or a seed's) exists, so this source has claimed its stream.
pub(super) async fn report(config: &Config, slot_in_use: bool) -> NatsReport {
    let mut report = NatsReport {
        nats: json!({ "url": config.nats.describe(), "connected": false, "jetstream_answered": false }),
        stream: json!({ "name": config.stream }),
        replay: None,
        dead_letters_by_subject: Vec::new(),
        health: Health::Healthy,
        problems: Vec::new(),
    };
    if tokio::time::timeout(DEADLINE, read(config, slot_in_use, &mut report)).await.is_err() {
        report.critical(format!("NATS at {} did not answer within 5 s", config.nats.describe()));
    }
    report
}

async fn read(config: &Config, slot_in_use: bool, report: &mut NatsReport) {
    let client = match crate::nats::connect::connect_nats(&config.nats).await {
        Ok(client) => client,
        Err(err) => return report.critical(format!("NATS is unreachable: {err:#}")),
    };
    let info = client.server_info();
    report.nats["connected"] = json!(true);
    report.nats["version"] = json!(info.version);
    report.nats["server_name"] = json!(info.server_name);
    report.nats["supported"] =
        json!(crate::nats::server_version::unsupported(&info.version).is_none());
    let publisher = Publisher::new(client, &config.stream, Duration::from_secs(2));
    let info = match publisher.stream_info().await {
        Ok(info) => info,
        Err(err) => {
            // A refusal is an answer; silence and "not enabled" are not.
            let answered = !err.is_transient() && !matches!(err, PublisherError::JetStreamDisabled);
            report.nats["jetstream_answered"] = json!(answered);
            return report.critical(format!("stream {}: {err}", config.stream));
        }
    };
    report.nats["jetstream_answered"] = json!(true);
    let Some(info) = info else {
        report.stream["exists"] = json!(false);
        return report.critical(format!(
            "stream {} does not exist on NATS at {}: is this the NATS pgoutbox writes to? \
             (pgoutbox run and setup create it)",
            config.stream,
            config.nats.describe()
        ));
    };
    report.stream["exists"] = json!(true);
    report.stream["messages"] = json!(info.state.messages);
    report.stream["bytes"] = json!(info.state.bytes);
    report.stream["last_sequence"] = json!(info.state.last_sequence);
    report.stream["created_unix_ns"] = json!(info.created.unix_timestamp_nanos().to_string());
    report.stream["duplicate_window_seconds"] = json!(info.config.duplicate_window.as_secs_f64());
    report.stream["replicas"] = json!(info.config.num_replicas);
    report.stream["persistence"] = json!(durability::persistence(&info.config));
    report.stream["durability"] =
        json!(durability::durability(&info.config, config.pipeline.durability_horizon));
    servers_sync(config, report).await;
    // Counted by subject (the server counts a subject filter's messages in one request,
    // without reading them): each table's own when it has one, else shared.
    let mut counted = Vec::new();
    for subject in config.dead_letter_subjects() {
        match publisher.count_on_subject(subject).await {
            Ok(count) => counted.push((subject.to_owned(), count)),
            Err(err) => {
                report.critical(format!("counting the dead letters: {err}"));
                counted.clear();
                break;
            }
        }
    }
    if !counted.is_empty() {
        report.stream["dead_letters"] = json!(counted.iter().map(|(_, n)| n).sum::<u64>());
    }
    report.dead_letters_by_subject = counted;
    report.replay = publisher.last_replay().await.ok().flatten().map(replay_report);
    judge_writer(config, &publisher, slot_in_use, report).await;
}

/// How each server of `--nats-monitor-url` syncs, beside the durability horizon
/// (`stream.servers_sync`): a warning when the horizon is shorter than an interval and a
/// pass (issue 70). Without the setting, `null`: the horizon assumes nats-server's default.
async fn servers_sync(config: &Config, report: &mut NatsReport) {
    use crate::nats::monitor::{self, Verdict};
    let horizon = config.pipeline.durability_horizon;
    report.stream["durability_horizon_seconds"] = json!(horizon.as_secs_f64());
    if config.nats_monitor_urls.is_empty() {
        report.stream["servers_sync"] = serde_json::Value::Null;
        return;
    }
    let mut servers = Vec::new();
    for url in &config.nats_monitor_urls {
        let server = match monitor::read(url).await {
            Err(err) => {
                report.warning(format!("could not read how the server syncs: {err}"));
                servers.push(json!({ "url": url, "error": err.to_string() }));
                continue;
            }
            Ok(server) => server,
        };
        let verdict = server.sync.judge(horizon);
        if let Verdict::Short { needed } = verdict {
            report.warning(format!(
                "server {url} syncs to disk every {}: --durability-horizon {} s is shorter than \
                 that and a sync pass; set it to {}s or more",
                server.sync,
                horizon.as_secs_f64(),
                needed.as_secs()
            ));
        }
        servers.push(json!({
            "url": url,
            "version": server.version,
            "sync_interval": server.sync.to_string(),
            "covered_by_horizon": match verdict {
                Verdict::Covered => json!(true),
                Verdict::Short { .. } => json!(false),
                Verdict::Unknown => serde_json::Value::Null,
            },
        }));
    }
    report.stream["servers_sync"] = json!(servers);
}

/// Whether the stream is the one this source writes, by its claim.
async fn judge_writer(
    config: &Config,
    publisher: &Publisher,
    slot_in_use: bool,
    report: &mut NatsReport,
) {
    let ours = match crate::commands::setup::identify_source(config).await {
        Ok(source) => source,
        Err(err) => {
            report.problems.push(format!(
                "cannot tell whether stream {} is this source's: identifying the database \
                 failed ({err})",
                config.stream
            ));
            report.health = report.health.max(Health::Warning);
            return;
        }
    };
    let stream = &config.stream;
    match claim::holder_if_any(publisher.context(), stream, &ours).await {
        Ok(Claim::Ours { .. }) => report.stream["writer"] = json!(ours.writer()),
        Ok(Claim::Theirs(writer)) => {
            report.stream["writer"] = json!(writer);
            report.critical(format!(
                "stream {stream} is written by another source ({writer}), not by this one \
                 ({}): give this source a stream of its own (--stream, --subject-template, \
                 --dead-letter-subject), or point status at the right database",
                ours.writer()
            ));
        }
        Ok(Claim::Free) => {
            report.stream["writer"] = json!(null);
            if slot_in_use {
                report.critical(format!(
                    "stream {stream} on NATS at {} is not claimed by this source ({}) though \
                     its slot {} exists: this is not the NATS (or the stream) pgoutbox writes \
                     to, or the claim was released and the next start takes it again",
                    config.nats.describe(),
                    ours.writer(),
                    config.slot
                ));
            }
        }
        Err(err) => report.critical(format!("reading who writes stream {stream}: {err}")),
    }
}
