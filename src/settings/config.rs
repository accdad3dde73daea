//! Command-line arguments → validated settings. Every user mistake is caught here, with a
//! message that says what to change.

use anyhow::{Context, anyhow};

use crate::domain::outbox::{
    CloudEvents, ColumnRoles, ContentMode, MessageId, ScheduleColumn, SubjectTemplate, TableEntry,
    TablePattern, subjects_overlap,
};
use crate::nats::connect::NatsSettings;

use crate::postgres::admin::TableName;

use crate::postgres::libpq_env::Files;
pub use crate::postgres::libpq_env::{Env, ProcessEnv};
use crate::settings::cli::{CloudEventsMode, CommonArgs};
use tables::{NamedTable, replay_table, table_names};

/// Where the Postgres settings come from, for errors in them.
const SETTINGS: &str =
    "the Postgres connection settings (--database-url, PG* variables, service file)";

pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
/// `run --max-in-flight-bytes`'s default; other commands never publish.
const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 32 << 20;

/// Validated settings. Holds no raw URL: the Postgres config's `Debug` hides the password.
pub struct Config {
    pub database: tokio_postgres::Config,
    pub pg_tls: crate::postgres::tls::PgTls,
    pub nats: NatsSettings,
    /// The first outbox table named exactly: the one whose replay table `replay` hands
    /// rows over through.
    pub table: TableName,
    /// `--messages-only`: no table is read or checked.
    pub messages_only: bool,
    pub slot: String,
    pub publication: String,
    /// `--own-schema`: where pgoutbox keeps its own objects (`postgres::own_schema`).
    pub own_schema: String,
    /// `--nats-monitor-url`: where the stream's servers say how often they sync
    /// (`nats::monitor`).
    pub nats_monitor_urls: Vec<String>,
    pub stream: String,
    /// Replicas of a stream pgoutbox creates: `run` and `setup` take `--stream-replicas`
    /// ([`Config::with_slot_args`]); `replay` creates a missing stream with one.
    pub stream_replicas: usize,
    pub pipeline: PipelineConfig,
    /// The roles besides its own and superusers whose tables pgoutbox reads
    /// (`--trusted-owner`, `postgres::trust`).
    pub trusted_owners: crate::postgres::trust::TrustedOwners,
}

/// Where rows come from and how they become messages.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The outbox tables whose rows are streamed, each with its own settings; none with
    /// `--messages-only`.
    pub tables: Vec<TableEntry>,
    /// The settings given for no table in particular: emitted messages are mapped by them.
    pub defaults: TableEntry,
    /// Stop reading WAL while this many payload bytes wait for acks (`--max-in-flight-bytes`).
    pub max_in_flight_bytes: usize,
    /// How long after JetStream's acknowledgement a position may be confirmed
    /// (`--durability-horizon`, `domain::horizon`).
    pub durability_horizon: std::time::Duration,
    /// Stream `pg_logical_emit_message` events with this prefix (`--message-prefix`), if any.
    pub message_prefix: Option<String>,
    /// The table `pgoutbox replay` hands rows over through, one for every table:
    /// `--replay-table`, or beside the first table named exactly, `<table>_replay`; with
    /// table patterns alone (no one schema to put it in), `public.<publication>_replay`.
    pub replay_table: TableName,
    /// Where payloads too large for a message go (`--object-store`); `None`: dead letters.
    pub large_payloads: Option<crate::nats::large_payloads::LargePayloads>,
    /// Where each transaction's end message goes (`--transaction-subject`), if anywhere.
    pub transaction_subject: Option<String>,
}

impl PipelineConfig {
    /// Every dead-letter subject, each once: the tables' and the emitted messages'.
    pub fn dead_letter_subjects(&self) -> Vec<&str> {
        let mut subjects: Vec<&str> = Vec::new();
        for entry in self.tables.iter().chain([&self.defaults]) {
            if !subjects.contains(&entry.dead_letter_subject.as_str()) {
                subjects.push(&entry.dead_letter_subject);
            }
        }
        subjects
    }

    /// The first table's entry, the defaults with `--messages-only`.
    pub fn first(&self) -> &TableEntry {
        self.tables.first().unwrap_or(&self.defaults)
    }
}

impl Config {
    /// Where an adoption hands a new table's rows over: the replay table, for this slot.
    pub fn adoption(&self) -> crate::postgres::adoption::Handover {
        crate::postgres::adoption::Handover {
            publication: self.publication.clone(),
            replay_table: self.pipeline.replay_table.clone(),
            slot: self.slot.clone(),
            trusted: self.trusted_owners.clone(),
        }
    }

    /// The settings `args` give, with libpq's environment read through `env` and its files
    /// (service and password files) through `files`. Warnings (an ignored password file)
    /// are logged here, once.
    pub fn from_args(
        args: &CommonArgs,
        env: &dyn Env,
        files: &dyn Files,
    ) -> anyhow::Result<Config> {
        Self::load(args, &[], env, files)
    }

    /// The settings `args` give, and `per_table` the arguments of each `[[table]]` entry of
    /// `--config` (none: `--table` names the tables, which share `args`), as
    /// `settings::file::resolve` gives them.
    pub fn load(
        args: &CommonArgs,
        per_table: &[CommonArgs],
        env: &dyn Env,
        files: &dyn Files,
    ) -> anyhow::Result<Config> {
        refuse_former_variables(env)?;
        let (database, pg_tls) = database::settings(args, env, files)?;
        let nats = nats_auth::settings(args, env)?;
        check_name("--slot", &args.slot, |c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
        })?;
        check_name("--stream", &args.stream, |c| !c.is_whitespace() && !".*>/\\".contains(c))?;
        // libpq's default database is the user's name.
        let database_name = database.get_dbname().or(database.get_user()).unwrap_or("");
        let (names, defaults, tables) = table_entries(args, per_table, database_name)?;
        let (table, replay_table) = replay_table(args, &names)?;
        let transaction_subject = transaction_subject::checked(args, &tables, &defaults)?;
        Ok(Config {
            database,
            pg_tls,
            nats,
            pipeline: PipelineConfig {
                tables,
                defaults,
                max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
                durability_horizon: args.durability_horizon,
                message_prefix: None,
                replay_table,
                large_payloads: None,
                transaction_subject,
            },
            table,
            messages_only: args.messages_only,
            slot: args.slot.clone(),
            publication: args.publication.clone(),
            own_schema: args.own_schema.clone(),
            nats_monitor_urls: args.nats_monitor_url.iter().map(|u| u.trim().to_owned()).collect(),
            stream: args.stream.clone(),
            stream_replicas: 1,
            trusted_owners: crate::postgres::trust::TrustedOwners::new(
                args.trusted_owner.iter().map(|role| role.trim().to_owned()),
            ),
        })
    }

    /// `run`'s and `setup`'s stream replicas (at least one) and Object Store bucket.
    pub fn with_slot_args(mut self, args: &crate::settings::cli::SlotArgs) -> Self {
        self.stream_replicas = args.stream_replicas.max(1);
        self.pipeline.large_payloads = args.objects.large_payloads();
        self
    }

    /// The first table's entry (the defaults with `--messages-only`).
    pub fn entry(&self) -> &TableEntry {
        self.pipeline.first()
    }

    /// The entry whose rows `replay --from-table` replays: the one named, which must be
    /// configured or match a configured pattern (then under that pattern's settings), or
    /// the one table; several tables, or a pattern, and none named is refused, rather than
    /// replaying the first of them.
    pub fn replay_entry(&self, named: Option<&str>) -> anyhow::Result<TableEntry> {
        let tables = &self.pipeline.tables;
        let list = || tables.iter().map(|e| e.table.to_string()).collect::<Vec<_>>().join(", ");
        let Some(named) = named else {
            return match tables.as_slice() {
                [one] if one.pattern.is_none() => Ok(one.clone()),
                [one] => Err(anyhow!(
                    "with a table pattern ({}), --from-table <schema.table> names the one \
                     table it matches whose rows to read",
                    one.table
                )),
                _ => Err(anyhow!("with several tables, --from-table names one of: {}", list())),
            };
        };
        if named.contains('*') {
            return Err(anyhow!(
                "--from-table {named}: names one table, not a pattern: name a table the \
                 pattern matches (such as {})",
                named.replacen('*', "1", 1)
            ));
        }
        let table: TableName = named.parse()?;
        if let Some(exact) = tables.iter().find(|e| e.pattern.is_none() && e.table == table) {
            return Ok(exact.clone());
        }
        let matching = tables.iter().find(|e| {
            e.pattern.as_ref().is_some_and(|pattern| pattern.matches(&table.schema, &table.name))
        });
        match matching {
            Some(entry) => Ok(entry.for_table(table)),
            None => Err(anyhow!(
                "--from-table {table}: not a configured table and matched by no configured \
                 pattern (those are: {})",
                list()
            )),
        }
    }

    /// Every entry: each table's, or the defaults alone with `--messages-only`.
    fn entries(&self) -> &[TableEntry] {
        match self.pipeline.tables.is_empty() {
            true => std::slice::from_ref(&self.pipeline.defaults),
            false => &self.pipeline.tables,
        }
    }

    /// The subjects the stream must cover: each entry's wildcard and dead-letter subject,
    /// and the defaults' (emitted messages), each once and none covered by another.
    pub fn stream_subjects(&self) -> Vec<String> {
        let defaults = std::iter::once(&self.pipeline.defaults);
        let mut wanted = Vec::new();
        for entry in self.entries().iter().chain(defaults) {
            wanted.push(entry.template.wildcard());
            wanted.push(entry.dead_letter_subject.clone());
            wanted.extend(self.pipeline.transaction_subject.clone());
            if let Some(schedule) = &entry.roles.schedule {
                wanted.push(format!("{}.>", schedule.subject_prefix));
            }
        }
        let covers = crate::nats::publisher::subject_covers;
        let mut subjects: Vec<String> = Vec::new();
        for (i, subject) in wanted.iter().enumerate() {
            let covered_by_other = wanted.iter().enumerate().any(|(j, other)| {
                j != i && covers(other, subject) && (!covers(subject, other) || j < i)
            });
            if !covered_by_other {
                subjects.push(subject.clone());
            }
        }
        subjects
    }

    /// Every dead-letter subject, each once: the tables' and the emitted messages'.
    pub fn dead_letter_subjects(&self) -> Vec<&str> {
        self.pipeline.dead_letter_subjects()
    }

    /// Columns that must exist in `entry`'s table, with their role.
    pub fn required_columns(entry: &TableEntry) -> Vec<(&str, &str)> {
        let roles = &entry.roles;
        let mut columns =
            vec![("id column", roles.id.as_str()), ("payload column", roles.payload.as_str())];
        columns.extend(entry.template.columns().map(|c| ("subject placeholder", c)));
        if entry.template.partitioned() {
            columns.push(("aggregate id column, which {$partition} reads", &roles.aggregate_id));
        }
        if let Some(ttl) = &roles.ttl {
            columns.push(("TTL column", ttl));
        }
        if let Some(schedule) = &roles.schedule {
            columns.push(("schedule column", &schedule.column));
        }
        if roles.cloudevents.is_some() {
            columns.push(("event type column (the CloudEvents type)", roles.event_type.as_str()));
        }
        columns
    }

    /// What the stream must allow for the messages the settings make.
    pub fn stream_features(&self) -> crate::nats::publisher::StreamFeatures {
        let message_ttl = self.entries().iter().any(|entry| entry.roles.ttl.is_some());
        let message_schedules = self.schedules().next().is_some();
        crate::nats::publisher::StreamFeatures { message_ttl, message_schedules }
    }

    /// Each table's `--schedule-column`, where it has one.
    pub fn schedules(&self) -> impl Iterator<Item = &ScheduleColumn> {
        self.entries().iter().filter_map(|entry| entry.roles.schedule.as_ref())
    }
}

/// The tables named (`--table`, or each `[[table]]` entry's), the first one's entry (the
/// defaults of tables a pattern finds later) and each table's entry (none with
/// `--messages-only`).
fn table_entries(
    args: &CommonArgs,
    per_table: &[CommonArgs],
    database_name: &str,
) -> anyhow::Result<(Vec<NamedTable>, TableEntry, Vec<TableEntry>)> {
    let names = match per_table.is_empty() {
        true => table_names(&args.table)?,
        false => table_names(&per_table.iter().flat_map(|a| a.table.clone()).collect::<Vec<_>>())?,
    };
    // Ids of two tables, or of two tenants, collide: each is qualified by its table.
    let message_id = match (names.len(), names[0].1.is_some()) {
        (1, false) => MessageId::Row,
        _ => MessageId::Qualified,
    };
    let entry = table_entry(args, names[0].clone(), database_name, message_id)?;
    let tables = match (args.messages_only, per_table.is_empty()) {
        (true, _) => Vec::new(),
        (false, true) => names
            .iter()
            .map(|(table, pattern)| TableEntry {
                table: table.clone(),
                pattern: pattern.clone(),
                ..entry.clone()
            })
            .collect(),
        (false, false) => per_table
            .iter()
            .zip(&names)
            .map(|(args, named)| {
                table_entry(args, named.clone(), database_name, message_id)
                    .with_context(|| format!("[[table]] {} in --config", named.0))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    Ok((names, entry, tables))
}

/// One table's entry from its arguments.
fn table_entry(
    args: &CommonArgs,
    (table, pattern): (TableName, Option<TablePattern>),
    database: &str,
    message_id: MessageId,
) -> anyhow::Result<TableEntry> {
    let template: SubjectTemplate = args.subject_template.parse().context("--subject-template")?;
    let template = partitions::partitioned(template, args.partitions)?;
    check_subject("--dead-letter-subject", &args.dead_letter_subject)?;
    let roles = ColumnRoles {
        id: args.id_column.clone(),
        payload: args.payload_column.clone(),
        headers: args.headers_column.clone(),
        aggregate_type: args.aggregate_type_column.clone(),
        aggregate_id: args.aggregate_id_column.clone(),
        event_type: args.event_type_column.clone(),
        created_at: args.created_at_column.clone(),
        ttl: args.ttl_column.clone(),
        schedule: match &args.schedule_column {
            None => None,
            Some(column) => {
                let subject_prefix = match &args.schedule_subject_prefix {
                    Some(prefix) => prefix.clone(),
                    None => format!("schedules.{}", args.stream),
                };
                check_subject("--schedule-subject-prefix", &subject_prefix)?;
                Some(ScheduleColumn { column: column.clone(), subject_prefix })
            }
        },
        allowed_nats_headers: allowed_nats_headers(&args.allow_nats_header)?,
        cloudevents: args.cloudevents.map(|mode| CloudEvents {
            mode: match mode {
                CloudEventsMode::Binary => ContentMode::Binary,
                CloudEventsMode::Structured => ContentMode::Structured,
            },
            source: args.cloudevents_source.clone(),
            database: database.to_owned(),
        }),
    };
    let dead_letter_subject = args.dead_letter_subject.clone();
    if let Some(schedule) = &roles.schedule {
        // A held message on an event's subject would be seen before its time, and one on
        // the dead-letter subject read as a letter.
        let held = format!("{}.>", schedule.subject_prefix);
        let events = template.wildcard();
        for (what, subject) in
            [("--subject-template", &events), ("the dead-letter subject", &dead_letter_subject)]
        {
            if subjects_overlap(&held, subject) {
                anyhow::bail!(
                    "--schedule-subject-prefix {}: its subjects ({held}) overlap {what}'s \
                     ({subject}); held rows must wait on subjects of their own: choose \
                     another prefix",
                    schedule.subject_prefix
                );
            }
        }
    }
    Ok(TableEntry { table, pattern, roles, template, dead_letter_subject, message_id })
}

/// A variable of a former name, which clap would ignore: rows whose headers it allowed
/// would become dead letters.
fn refuse_former_variables(env: &dyn Env) -> anyhow::Result<()> {
    if env.var("PGOUTBOX_ALLOW_NATS_HEADERS").is_some() {
        return Err(anyhow!(
            "PGOUTBOX_ALLOW_NATS_HEADERS is now PGOUTBOX_ALLOW_NATS_HEADER, named after its \
             flag --allow-nats-header: rename the variable"
        ));
    }
    Ok(())
}

/// `--allow-nats-header`, lowercase, each checked.
fn allowed_nats_headers(names: &[String]) -> anyhow::Result<Vec<String>> {
    names
        .iter()
        .map(|name| match crate::domain::outbox::refuse_allowed(name) {
            Some(why) => Err(anyhow!("--allow-nats-header: {why}")),
            None => Ok(name.to_ascii_lowercase()),
        })
        .collect()
}

fn check_name(flag: &str, value: &str, allowed: impl Fn(char) -> bool) -> anyhow::Result<()> {
    if value.is_empty() || !value.chars().all(allowed) {
        return Err(anyhow!("{flag} {value:?} is not a valid name"));
    }
    Ok(())
}

fn check_subject(flag: &str, subject: &str) -> anyhow::Result<()> {
    let valid = subject
        .split('.')
        .all(|t| !t.is_empty() && !t.contains(|c: char| c.is_whitespace() || c == '*' || c == '>'));
    if !valid {
        return Err(anyhow!("{flag} {subject:?} is not a valid NATS subject"));
    }
    Ok(())
}

mod database;
mod nats_auth;
mod partitions;
mod tables;
#[cfg(test)]
mod tests;
mod transaction_subject;
