//! `--config <file>`: the settings in a TOML file, keys spelled as the flags.
//!
//! Top-level keys are the flags shared by every command; `[[table]]` entries take the
//! per-table keys, each defaulting to the top level, then to the flag's default. A flag
//! given on the command line or by its `PGOUTBOX_*` variable wins over the file's top
//! level, never over a `[[table]]` key: an entry names one table on purpose. Unknown keys
//! are refused with their line (`deny_unknown_fields`): a misspelt key silently ignored
//! would stream with a default nobody chose.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use serde::Deserialize;

use crate::settings::cli::{CloudEventsMode, CommonArgs};

/// The file's top level: the shared flags, and the tables.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileSettings {
    database_url: Option<String>,
    database_password_command: Option<String>,
    database_password_command_timeout: Option<String>,
    nats_url: Option<String>,
    nats_creds: Option<PathBuf>,
    nats_nkey: Option<PathBuf>,
    nats_tls_ca: Option<PathBuf>,
    nats_tls_cert: Option<PathBuf>,
    nats_tls_key: Option<PathBuf>,
    slot: Option<String>,
    publication: Option<String>,
    replay_table: Option<String>,
    trusted_owner: Option<Vec<String>>,
    durability_horizon: Option<String>,
    stream: Option<String>,
    messages_only: Option<bool>,
    // The per-table keys, as defaults for every entry (serde's `flatten` cannot be
    // combined with `deny_unknown_fields`, so they are spelt twice).
    subject_template: Option<String>,
    dead_letter_subject: Option<String>,
    id_column: Option<String>,
    payload_column: Option<String>,
    headers_column: Option<String>,
    aggregate_type_column: Option<String>,
    aggregate_id_column: Option<String>,
    event_type_column: Option<String>,
    created_at_column: Option<String>,
    cloudevents: Option<CloudEventsMode>,
    cloudevents_source: Option<String>,
    ttl_column: Option<String>,
    schedule_column: Option<String>,
    schedule_subject_prefix: Option<String>,
    allow_nats_header: Option<Vec<String>>,
    partitions: Option<u32>,
    /// `[[table]]` entries.
    #[serde(default)]
    table: Vec<TableSettings>,
}

/// One `[[table]]` entry: its table and the keys that are its own.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct TableSettings {
    table: String,
    subject_template: Option<String>,
    dead_letter_subject: Option<String>,
    id_column: Option<String>,
    payload_column: Option<String>,
    headers_column: Option<String>,
    aggregate_type_column: Option<String>,
    aggregate_id_column: Option<String>,
    event_type_column: Option<String>,
    created_at_column: Option<String>,
    cloudevents: Option<CloudEventsMode>,
    cloudevents_source: Option<String>,
    ttl_column: Option<String>,
    schedule_column: Option<String>,
    allow_nats_header: Option<Vec<String>>,
    partitions: Option<u32>,
}

impl FileSettings {
    /// The file at `path`, parsed; its errors name the file, and the line of a bad key.
    pub fn read(path: &Path) -> anyhow::Result<FileSettings> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --config {}", path.display()))?;
        Self::parse(&text).map_err(|err| anyhow!("--config {}: {err}", path.display()))
    }

    /// The settings in `text`, or one line saying where and why not.
    pub(super) fn parse(text: &str) -> Result<FileSettings, FileError> {
        toml::from_str(text).map_err(|err: toml::de::Error| FileError {
            line: err
                .span()
                .map(|span| text.get(..span.start).unwrap_or(text).matches('\n').count() + 1),
            message: err.message().replace('\n', " "),
        })
    }
}

/// Why the file cannot be read as settings: one line, with the line of the file when known
/// (the toml crate's own rendering spans several, with a snippet).
#[derive(Debug, thiserror::Error)]
#[error("{}{message}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
pub struct FileError {
    line: Option<usize>,
    message: String,
}

/// Sets `target` to `value` when the file has it and `flag` was not given explicitly.
fn take<T: Clone>(target: &mut T, value: &Option<T>, explicit: bool) {
    if let (false, Some(value)) = (explicit, value) {
        *target = value.clone();
    }
}

/// `args` with the file's top level where no flag or variable was given (`given(id)`:
/// whether clap's argument `id` came from the command line or the environment), and the
/// arguments of each `[[table]]` entry, the entry's keys over those (empty: no entries,
/// `--table` names the tables).
pub fn merge(
    mut args: CommonArgs,
    file: &FileSettings,
    given: &dyn Fn(&str) -> bool,
) -> anyhow::Result<(CommonArgs, Vec<CommonArgs>)> {
    if !file.table.is_empty() && given("table") {
        return Err(anyhow!(
            "--table (or PGOUTBOX_TABLE) and [[table]] entries in --config both name tables: \
             name them in one place"
        ));
    }
    let a = &mut args;
    take(&mut a.database_url, &file.database_url.clone().map(Some), given("database_url"));
    take(
        &mut a.database_password_command,
        &file.database_password_command.clone().map(Some),
        given("database_password_command"),
    );
    if let (false, Some(timeout)) =
        (given("database_password_command_timeout"), &file.database_password_command_timeout)
    {
        a.database_password_command_timeout = crate::settings::units::parse_duration(timeout)
            .map_err(|err| anyhow!("--config: database-password-command-timeout: {err}"))?;
    }
    take(&mut a.nats_url, &file.nats_url.clone().map(Some), given("nats_url"));
    take(&mut a.nats_creds, &file.nats_creds.clone().map(Some), given("nats_creds"));
    take(&mut a.nats_nkey, &file.nats_nkey.clone().map(Some), given("nats_nkey"));
    take(&mut a.nats_tls_ca, &file.nats_tls_ca.clone().map(Some), given("nats_tls_ca"));
    take(&mut a.nats_tls_cert, &file.nats_tls_cert.clone().map(Some), given("nats_tls_cert"));
    take(&mut a.nats_tls_key, &file.nats_tls_key.clone().map(Some), given("nats_tls_key"));
    take(&mut a.slot, &file.slot, given("slot"));
    take(&mut a.publication, &file.publication, given("publication"));
    take(&mut a.replay_table, &file.replay_table.clone().map(Some), given("replay_table"));
    take(&mut a.trusted_owner, &file.trusted_owner, given("trusted_owner"));
    if let (false, Some(horizon)) = (given("durability_horizon"), &file.durability_horizon) {
        a.durability_horizon = crate::settings::units::parse_duration_or_zero(horizon)
            .map_err(|err| anyhow!("--config: durability-horizon: {err}"))?;
    }
    take(&mut a.stream, &file.stream, given("stream"));
    take(&mut a.messages_only, &file.messages_only, given("messages_only"));
    take(
        &mut a.schedule_subject_prefix,
        &file.schedule_subject_prefix.clone().map(Some),
        given("schedule_subject_prefix"),
    );
    let top = TableKeys::of_file(file);
    top.apply(a, given);
    let tables = file
        .table
        .iter()
        .map(|entry| {
            let mut own = args.clone();
            own.table = vec![entry.table.clone()];
            TableKeys::of_entry(entry).apply(&mut own, &|_| false);
            own
        })
        .collect();
    Ok((args, tables))
}

/// The per-table keys, from the top level or from an entry.
struct TableKeys<'a> {
    subject_template: &'a Option<String>,
    dead_letter_subject: &'a Option<String>,
    id_column: &'a Option<String>,
    payload_column: &'a Option<String>,
    headers_column: &'a Option<String>,
    aggregate_type_column: &'a Option<String>,
    aggregate_id_column: &'a Option<String>,
    event_type_column: &'a Option<String>,
    created_at_column: &'a Option<String>,
    cloudevents_source: &'a Option<String>,
    ttl_column: &'a Option<String>,
    schedule_column: &'a Option<String>,
    cloudevents: &'a Option<CloudEventsMode>,
    allow_nats_header: &'a Option<Vec<String>>,
    partitions: &'a Option<u32>,
}

impl<'a> TableKeys<'a> {
    fn of_file(f: &'a FileSettings) -> Self {
        TableKeys {
            subject_template: &f.subject_template,
            dead_letter_subject: &f.dead_letter_subject,
            id_column: &f.id_column,
            payload_column: &f.payload_column,
            headers_column: &f.headers_column,
            aggregate_type_column: &f.aggregate_type_column,
            aggregate_id_column: &f.aggregate_id_column,
            event_type_column: &f.event_type_column,
            created_at_column: &f.created_at_column,
            cloudevents_source: &f.cloudevents_source,
            ttl_column: &f.ttl_column,
            schedule_column: &f.schedule_column,
            cloudevents: &f.cloudevents,
            allow_nats_header: &f.allow_nats_header,
            partitions: &f.partitions,
        }
    }

    fn of_entry(t: &'a TableSettings) -> Self {
        TableKeys {
            subject_template: &t.subject_template,
            dead_letter_subject: &t.dead_letter_subject,
            id_column: &t.id_column,
            payload_column: &t.payload_column,
            headers_column: &t.headers_column,
            aggregate_type_column: &t.aggregate_type_column,
            aggregate_id_column: &t.aggregate_id_column,
            event_type_column: &t.event_type_column,
            created_at_column: &t.created_at_column,
            cloudevents_source: &t.cloudevents_source,
            ttl_column: &t.ttl_column,
            schedule_column: &t.schedule_column,
            cloudevents: &t.cloudevents,
            allow_nats_header: &t.allow_nats_header,
            partitions: &t.partitions,
        }
    }

    /// Sets each key `args` did not get explicitly (`given`).
    fn apply(&self, a: &mut CommonArgs, given: &dyn Fn(&str) -> bool) {
        take(&mut a.subject_template, self.subject_template, given("subject_template"));
        take(&mut a.dead_letter_subject, self.dead_letter_subject, given("dead_letter_subject"));
        take(&mut a.id_column, self.id_column, given("id_column"));
        take(&mut a.payload_column, self.payload_column, given("payload_column"));
        take(&mut a.headers_column, self.headers_column, given("headers_column"));
        take(
            &mut a.aggregate_type_column,
            self.aggregate_type_column,
            given("aggregate_type_column"),
        );
        take(&mut a.aggregate_id_column, self.aggregate_id_column, given("aggregate_id_column"));
        take(&mut a.event_type_column, self.event_type_column, given("event_type_column"));
        take(&mut a.created_at_column, self.created_at_column, given("created_at_column"));
        take(&mut a.cloudevents, &self.cloudevents.map(Some), given("cloudevents"));
        let source = self.cloudevents_source.clone().map(Some);
        take(&mut a.cloudevents_source, &source, given("cloudevents_source"));
        take(&mut a.ttl_column, &self.ttl_column.clone().map(Some), given("ttl_column"));
        let schedule = self.schedule_column.clone().map(Some);
        take(&mut a.schedule_column, &schedule, given("schedule_column"));
        take(&mut a.allow_nats_header, self.allow_nats_header, given("allow_nats_header"));
        take(&mut a.partitions, &self.partitions.map(Some), given("partitions"));
    }
}

#[cfg(test)]
mod tests;
