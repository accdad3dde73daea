//! The command line: clap definitions only. Validation lives in `config`.
//!
//! `-h` is the short help and `--help` the long one: a flag's doc comment's first paragraph
//! (one line) is its `-h` text, the whole its `--help` text. Flags only experts need are
//! `hide_short_help`, so `-h` fits a terminal; `--help`, the man page (`pgoutbox man`), the
//! shell completions (`pgoutbox completions`) and docs/configuration.md show every flag.

use clap::{Args, Parser, Subcommand, ValueEnum};

mod commands;
mod examples;

pub use commands::{
    ObjectStoreArgs, ReplayArgs, RunArgs, SetupArgs, SlotArgs, StatusArgs, VerifyArgs,
};

/// The arguments of one invocation: a command's selection, its confirmation, how it prints.
/// They are flags alone, with no `PGOUTBOX_*` variable and no `--config` key: a file or a
/// variable shared by every run must not select rows, confirm a teardown or change a
/// report's format. Every other flag is a setting: a flag, the variable `PGOUTBOX_<FLAG>`
/// and a key of `--config` (`settings::file`), checked by the tests of `cli`.
pub const ONE_OFF: [(&str, &str); 17] = [
    ("status", "json"),
    ("status", "watch"),
    ("replay", "ids"),
    ("replay", "created_from"),
    ("replay", "created_to"),
    ("replay", "dead_letters"),
    ("replay", "dry_run"),
    ("replay", "rate"),
    ("replay", "replay_id"),
    ("replay", "from_table"),
    ("verify", "created_from"),
    ("verify", "created_to"),
    ("verify", "from_table"),
    ("verify", "replay_missing"),
    ("verify", "json"),
    ("teardown", "yes"),
    ("teardown", "only_table"),
];

/// The settings each `[[table]]` entry of `--config` may set for its table: each defaults
/// to the file's top level, then to the flag (`settings::file`).
pub const PER_TABLE: [&str; 15] = [
    "subject_template",
    "dead_letter_subject",
    "id_column",
    "payload_column",
    "headers_column",
    "aggregate_type_column",
    "aggregate_id_column",
    "event_type_column",
    "created_at_column",
    "cloudevents",
    "cloudevents_source",
    "ttl_column",
    "schedule_column",
    "allow_nats_header",
    "partitions",
];

/// `--help` groups the flags under these headings, in this order in every subcommand:
/// clap lists a heading where its first flag is defined, and a subcommand's own flags come
/// before the shared ones, so each subcommand defines its own in this order too.
const POSTGRES: &str = "Postgres";
const NATS: &str = "NATS";
const TABLE: &str = "Outbox table";
const OPS: &str = "Operations";

/// Under a heading, clap lists flags by this number, then by name. The shared flags are
/// numbered in the order they are defined below, the flags a user needs first first; a
/// subcommand's own are numbered from [`OWN`], after them, and --config and --log-format,
/// set once and forgotten, come last.
const OWN: usize = 100;
const LAST: usize = 900;

#[derive(Parser)]
#[command(
    name = "pgoutbox",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("PGOUTBOX_COMMIT"), ")"),
    max_term_width = 100,
    about = "Streams committed outbox rows from Postgres to NATS JetStream through logical replication.",
    after_help = examples::SHORT,
    after_long_help = examples::PGOUTBOX,
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stream outbox inserts to JetStream until SIGINT/SIGTERM
    ///
    /// Runs `setup` first: creates what is missing, then streams each committed insert
    /// into the outbox tables, in commit order, confirming a position to Postgres once
    /// JetStream acknowledged every message up to it. SIGINT or SIGTERM drains: it waits
    /// for the acks of what was sent, confirms, and exits 0.
    #[command(after_help = examples::SHORT, after_long_help = examples::RUN)]
    Run(RunArgs),
    /// Create the publication, the slot and the stream (idempotent)
    ///
    /// Each is created only when missing; an existing stream is checked, never changed.
    /// Before the slot exists, adds the tables a --table pattern matches that the
    /// publication lacks (once it exists, run adopts them with their rows).
    #[command(after_help = examples::SHORT, after_long_help = examples::SETUP)]
    Setup(SetupArgs),
    /// Show the slot's lag and the stream; exit 0, 1 or 2 by health
    ///
    /// The slot's position and lag, the stream, the rows per table and the running
    /// pgoutbox's last confirmation. Exits 0 healthy, 1 on a warning, 2 critical (slot
    /// missing or lost, database or NATS unreachable, the stream missing or not this
    /// source's).
    #[command(after_help = examples::SHORT, after_long_help = examples::STATUS)]
    Status(StatusArgs),
    /// Publish chosen rows again: by id, by time or dead letters
    ///
    /// Chosen rows of the outbox table: by id, by created-at time, or the rows of the
    /// stream's dead letters once fixed in the table; through the running pgoutbox when
    /// one streams into the stream; resumable with --replay-id. Exits 0 when done, 3 when
    /// no row of the table is selected (saying how its ids look), 1 on an error.
    #[command(after_help = examples::SHORT, after_long_help = examples::REPLAY)]
    Replay(ReplayArgs),
    /// Find rows the stream lacks, holds twice or holds out of order
    ///
    /// Compares the outbox table's rows (all, or those created in a range) with the
    /// stream: reports rows the stream lacks, rows it holds twice and messages out of
    /// commit order. Exits 0 when every row is there once and in order, 2 when something
    /// is not, 1 when the check could not be made; with --replay-missing, hands the
    /// missing rows to replay.
    #[command(after_help = examples::SHORT, after_long_help = examples::VERIFY)]
    Verify(VerifyArgs),
    /// Drop the slot and the publication (the stream is kept)
    ///
    /// Drops the replication slot, the publication, and the event trigger of `setup
    /// --tenant-trigger`; with --only-table, drops only that table from the publication.
    #[command(after_help = examples::SHORT, after_long_help = examples::TEARDOWN)]
    Teardown {
        /// Confirm that the slot and publication (or the table) should be dropped
        #[arg(long)]
        yes: bool,
        /// Drop only this table from the publication, keeping the slot and stream
        ///
        /// ALTER PUBLICATION … DROP TABLE, keeping the slot, the publication's other
        /// tables and the stream: a table no longer streamed (remove it from --table or
        /// --config too)
        #[arg(long, value_name = "SCHEMA.TABLE")]
        only_table: Option<String>,
    },
    /// Print the shell completion script for SHELL
    ///
    /// Made from the same definitions as --help, so it offers every command and flag.
    #[command(help_template = examples::REFERENCE_TEMPLATE, after_help = examples::COMPLETIONS)]
    Completions {
        /// The shell to complete pgoutbox's commands and flags in
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff)
    ///
    /// pgoutbox's own page, or one command's (pgoutbox-run, ...), made from the same
    /// definitions as --help.
    #[command(help_template = examples::REFERENCE_TEMPLATE, after_help = examples::MAN)]
    Man {
        /// The command whose page to print, e.g. run [default: pgoutbox's own page]
        #[arg(value_name = "COMMAND")]
        command: Option<String>,
    },
}

/// `--cloudevents`'s content modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CloudEventsMode {
    Binary,
    Structured,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Settings shared by every subcommand. `DATABASE_URL` and `NATS_URL` are read as
/// fallbacks in `config`, since clap reads one environment variable per argument.
#[derive(Args, Clone)]
pub struct CommonArgs {
    /// A TOML file of settings, keys spelled as the flags: retention = "7d"
    ///
    /// Every setting of every command is a key (one file serves them all; each command reads
    /// its own); a command's one-off flags are not. [[table]] entries name several tables,
    /// each with its own subject-template, dead-letter-subject, column roles, cloudevents,
    /// ttl-column, schedule-column, allow-nats-header and partitions. A flag or variable
    /// given wins over the file's top level, never over a [[table]] key (see
    /// docs/operations.md#several-tables)
    #[arg(long, global = true, env = "PGOUTBOX_CONFIG", value_name = "FILE", display_order = LAST)]
    pub config: Option<std::path::PathBuf>,
    /// Postgres connection string (or DATABASE_URL)
    ///
    /// A URL or key=value, as libpq reads it; unset parameters come from a service
    /// (service=, PGSERVICE), then libpq's PG* variables (PGHOST, PGPORT, PGUSER,
    /// PGDATABASE, PGSSLMODE, ...), the password from ~/.pgpass or PGPASSFILE if none is
    /// given
    #[arg(help_heading = POSTGRES, long, global = true, env = "PGOUTBOX_DATABASE_URL", hide_env_values = true, value_name = "URL")]
    pub database_url: Option<String>,
    /// Logical replication slot name
    #[arg(help_heading = POSTGRES, long, global = true, env = "PGOUTBOX_SLOT", default_value = "pgoutbox", value_name = "NAME")]
    pub slot: String,
    /// Publication name
    #[arg(help_heading = POSTGRES, long, global = true, env = "PGOUTBOX_PUBLICATION", default_value = "pgoutbox", value_name = "NAME")]
    pub publication: String,
    /// Schema of pgoutbox's own objects
    ///
    /// Its record of what JetStream acknowledged and the tenant trigger's function; setup
    /// creates it, and pgoutbox uses it only while its role (or a superuser) owns it and no
    /// other role may create in it
    #[arg(help_heading = POSTGRES, long, global = true, env = "PGOUTBOX_OWN_SCHEMA", default_value = "pgoutbox", value_name = "NAME", hide_short_help = true)]
    pub own_schema: String,
    /// Shell command whose output is the Postgres password
    ///
    /// Run with sh -c at every new connection, e.g. `aws rds generate-db-auth-token ...`;
    /// its password comes before any other
    #[arg(help_heading = POSTGRES, long, global = true, env = "PGOUTBOX_DATABASE_PASSWORD_COMMAND", hide_env_values = true, value_name = "COMMAND", hide_short_help = true)]
    pub database_password_command: Option<String>,
    /// How long --database-password-command may take before it is killed
    #[arg(help_heading = POSTGRES, long, global = true, env = "PGOUTBOX_DATABASE_PASSWORD_COMMAND_TIMEOUT", default_value = "10s", value_parser = crate::settings::units::parse_duration, value_name = "DURATION", hide_short_help = true)]
    pub database_password_command_timeout: std::time::Duration,
    /// NATS server URL(s), comma-separated (or NATS_URL)
    ///
    /// nats://user:password@host or nats://token@host for those methods [default:
    /// nats://127.0.0.1:4222]
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_URL", hide_env_values = true, value_name = "URL")]
    pub nats_url: Option<String>,
    /// nats-server monitoring URL(s) of the stream's servers, comma-separated
    ///
    /// Such as http://nats:8222: pgoutbox reads each server's sync_interval from /varz and
    /// warns, saying what to set, when --durability-horizon is shorter than it plus a sync
    /// pass (a power loss could then take back events the slot no longer holds); without
    /// it, the horizon assumes nats-server's default of 2 minutes
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_MONITOR_URL", value_delimiter = ',', value_name = "URL", hide_short_help = true)]
    pub nats_monitor_url: Vec<String>,
    /// JetStream stream name
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_STREAM", default_value = "OUTBOX", value_name = "NAME")]
    pub stream: String,
    /// Subject of each message; placeholders are column names
    #[arg(
        help_heading = NATS,
        long,
        global = true,
        env = "PGOUTBOX_SUBJECT_TEMPLATE",
        default_value = "outbox.{aggregate_type}.{event_type}",
        value_name = "TEMPLATE"
    )]
    pub subject_template: String,
    /// Subject for rows that cannot be published as they are (with the reason)
    #[arg(
        help_heading = NATS,
        long,
        global = true,
        env = "PGOUTBOX_DEAD_LETTER_SUBJECT",
        default_value = "outbox.dead_letter",
        value_name = "SUBJECT"
    )]
    pub dead_letter_subject: String,
    /// Also publish each transaction's end, with what it holds, on this subject
    ///
    /// One message after each committed transaction's messages, in its place in the stream:
    /// JSON counting its events there, by partition, its dead letters and its scheduled
    /// rows, so that a consumer of one partition knows when its part is whole (see
    /// docs/how-to/consume.md). Like Debezium's transaction metadata; off by default
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_TRANSACTION_SUBJECT", value_name = "SUBJECT", hide_short_help = true)]
    pub transaction_subject: Option<String>,
    /// NATS credentials file (JWT and NKey seed, as issued by nsc)
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<std::path::PathBuf>,
    /// File holding an NKey user seed (SU...) for NATS
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_NKEY", value_name = "FILE", hide_short_help = true)]
    pub nats_nkey: Option<std::path::PathBuf>,
    /// CA certificate (PEM) to verify the NATS server with; requires TLS
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_TLS_CA", value_name = "FILE", hide_short_help = true)]
    pub nats_tls_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for NATS mutual TLS, with --nats-tls-key
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_TLS_CERT", requires = "nats_tls_key", value_name = "FILE", hide_short_help = true)]
    pub nats_tls_cert: Option<std::path::PathBuf>,
    /// Client key (PEM) for NATS mutual TLS, with --nats-tls-cert
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_TLS_KEY", requires = "nats_tls_cert", value_name = "FILE", hide_short_help = true)]
    pub nats_tls_key: Option<std::path::PathBuf>,
    /// The outbox table(s), schema.table; repeatable; `*` matches many
    ///
    /// Schema-qualified or in `public`; repeatable (or comma-separated) for several tables
    /// that share every other setting, streamed into one stream in commit order, each
    /// message naming its table in Pgoutbox-Table and, with several tables, in its
    /// Nats-Msg-Id (<schema>.<table>:<id>). A `*` in either part names every table that
    /// matches, now and later (e.g. 'tenant_*.outbox'; {$schema} and {$table} in
    /// --subject-template; see docs/operations.md#tenant-tables)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_TABLE", value_delimiter = ',', default_value = "public.outbox", value_name = "SCHEMA.TABLE")]
    pub table: Vec<String>,
    /// Column holding the message id (becomes Nats-Msg-Id)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_ID_COLUMN", default_value = "id", value_name = "COLUMN", hide_short_help = true)]
    pub id_column: String,
    /// Column holding the message body (json, jsonb, text or bytea)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_PAYLOAD_COLUMN", default_value = "payload", value_name = "COLUMN", hide_short_help = true)]
    pub payload_column: String,
    /// Column holding a JSON object of extra headers (optional column)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_HEADERS_COLUMN", default_value = "headers", value_name = "COLUMN", hide_short_help = true)]
    pub headers_column: String,
    /// Column sent as Outbox-Aggregate-Type (optional column)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_AGGREGATE_TYPE_COLUMN", default_value = "aggregate_type", value_name = "COLUMN", hide_short_help = true)]
    pub aggregate_type_column: String,
    /// Column sent as Outbox-Aggregate-Id (optional column)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_AGGREGATE_ID_COLUMN", default_value = "aggregate_id", value_name = "COLUMN", hide_short_help = true)]
    pub aggregate_id_column: String,
    /// How many partitions {$partition} in --subject-template spreads aggregates over
    ///
    /// {$partition} becomes the partition of the row's aggregate id column, 0 to N-1:
    /// FNV-1a 32 of its text modulo N, exactly what nats-server's mapping
    /// {{partition(N, token)}} gives for the same token, so consumers partitioned by the
    /// server (consumer groups, 2.11+) and by subject agree. A NULL aggregate id makes the
    /// row a dead letter. Required by {$partition}, refused without it (see
    /// docs/operations.md#partitions-for-parallel-consumers)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_PARTITIONS", value_name = "N", hide_short_help = true)]
    pub partitions: Option<u32>,
    /// Column sent as Outbox-Event-Type (optional column)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_EVENT_TYPE_COLUMN", default_value = "event_type", value_name = "COLUMN", hide_short_help = true)]
    pub event_type_column: String,
    /// Column sent as Outbox-Created-At (optional column)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_CREATED_AT_COLUMN", default_value = "created_at", value_name = "COLUMN", hide_short_help = true)]
    pub created_at_column: String,
    /// Stream only the events emitted with pg_logical_emit_message, no table
    ///
    /// No outbox table is needed or read (--table is ignored), the publication is created
    /// without tables
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_MESSAGES_ONLY", hide_short_help = true)]
    pub messages_only: bool,
    /// The table `pgoutbox replay` hands rows to the running pgoutbox through
    ///
    /// Made and published by setup. Default: beside the first table named exactly,
    /// <table>_replay; with table patterns alone, public.<publication>_replay. Set it where
    /// that schema is not writable by setup or not yours to write in
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_REPLAY_TABLE", value_name = "SCHEMA.TABLE", hide_short_help = true)]
    pub replay_table: Option<String>,
    /// Confirm a position only once JetStream acknowledged it this long ago
    ///
    /// A position is confirmed to Postgres once JetStream acknowledged everything up to it
    /// this long ago and the stream, looked at since, still holds the newest of those
    /// messages: a restart then reads again from the WAL what a nats-server that lost power
    /// forgot, in commit order, emitted events included. The default covers nats-server's
    /// default sync_interval (2m) and the sync pass that re-arms its timer. 0s: the stream's
    /// servers run with sync_interval: always, or losing their unsynced writes is accepted
    /// (run --recover then refills table rows). Costs the WAL of that long, re-read at start;
    /// setup and status judge the stream by it (see docs/guarantees.md)
    #[arg(help_heading = OPS, long, global = true, env = "PGOUTBOX_DURABILITY_HORIZON", default_value = crate::domain::horizon::DEFAULT, value_parser = crate::settings::units::parse_duration_or_zero, value_name = "DURATION", hide_short_help = true)]
    pub durability_horizon: std::time::Duration,
    /// A role whose tables pgoutbox may read; repeatable (or comma-separated)
    ///
    /// Reading a table runs its owner's index expressions, policies and casts as the
    /// reader, so pgoutbox reads rows (adoption, seed, --recover, --backfill, verify,
    /// replay) only from tables owned by its own login role, a superuser, or a role named
    /// here. Other tables still stream from the WAL (see docs/security.md)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_TRUSTED_OWNER", value_delimiter = ',', value_name = "ROLE", hide_short_help = true)]
    pub trusted_owner: Vec<String>,
    /// Send each row as a CloudEvent 1.0: binary or structured
    ///
    /// The NATS binding: binary puts the attributes in ce- headers and keeps the payload as
    /// the body, structured sends the JSON event as the body; id is the row's id (qualified
    /// by its table when one --cloudevents-source serves several tables), type the
    /// event type column, time the created-at column, subject the aggregate id (see
    /// docs/operations.md#cloudevents)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_CLOUDEVENTS", value_enum, num_args = 0..=1, require_equals = true, default_missing_value = "binary", value_name = "MODE", hide_short_help = true)]
    pub cloudevents: Option<CloudEventsMode>,
    /// The CloudEvents source attribute [default: /postgres/<database>/<schema>.<table>]
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_CLOUDEVENTS_SOURCE", requires = "cloudevents", value_name = "URI", hide_short_help = true)]
    pub cloudevents_source: Option<String>,
    /// Column whose value becomes the message's Nats-TTL (nats-server 2.11+)
    ///
    /// Whole seconds, a duration such as 90s, 10m or 1h30m, or never; NULL for none (a
    /// stream that allows per-message TTLs); a value that is not a TTL makes the row a
    /// dead letter
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_TTL_COLUMN", value_name = "COLUMN", hide_short_help = true)]
    pub ttl_column: Option<String>,
    /// Column holding when to deliver the row (nats-server 2.12+)
    ///
    /// A timestamptz; a timestamp is read as UTC: the stream holds its message and
    /// delivers it to its subject then, once; NULL for now (a stream that allows message
    /// schedules, see docs/operations.md#delayed-delivery---schedule-column); a value that
    /// is not a time makes the row a dead letter
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_SCHEDULE_COLUMN", value_name = "COLUMN", hide_short_help = true)]
    pub schedule_column: Option<String>,
    /// Where scheduled rows wait until their time
    ///
    /// <prefix>.<Nats-Msg-Id>.<position>, outside the events' and the dead letters'
    /// subjects (an overlap is refused) so that no consumer sees a row before its time
    /// [default: schedules.<stream>]
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_SCHEDULE_SUBJECT_PREFIX", value_name = "PREFIX", hide_short_help = true)]
    pub schedule_subject_prefix: Option<String>,
    /// A Nats- header the headers column may set (repeatable)
    ///
    /// Repeatable, or comma-separated; any other Nats- header makes the row a dead letter.
    /// Those pgoutbox's ordering relies on (Nats-Msg-Id, Nats-Expected-*, Nats-Rollup,
    /// Nats-Schedule*, ...) are refused
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_ALLOW_NATS_HEADER", value_delimiter = ',', value_name = "HEADER", hide_short_help = true)]
    pub allow_nats_header: Vec<String>,
    /// Log format
    #[arg(help_heading = OPS, long, global = true, env = "PGOUTBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT", display_order = LAST)]
    pub log_format: LogFormat,
}

#[cfg(test)]
mod tests;
