//! The command line: clap definitions only. Validation lives in `config`.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Whether argument `id` was given on the command line or by its variable, before or
/// after the subcommand (a default was not): such a value wins over `--config`'s top level.
pub fn explicit(matches: &clap::ArgMatches, id: &str) -> bool {
    use clap::parser::ValueSource;
    let given = |m: &clap::ArgMatches| {
        let source = m.try_get_raw(id).ok().and_then(|_| m.value_source(id));
        matches!(source, Some(ValueSource::CommandLine | ValueSource::EnvVariable))
    };
    given(matches) || matches.subcommand().is_some_and(|(_, sub)| given(sub))
}

/// `--help` groups the flags under these headings, the same in every subcommand.
const POSTGRES: &str = "Postgres";
const NATS: &str = "NATS";
const TABLE: &str = "Outbox table";
const OPS: &str = "Operations";

#[derive(Parser)]
#[command(
    name = "pgoutbox",
    version,
    about = "Streams committed outbox rows from Postgres to NATS JetStream through logical replication."
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// OpenTelemetry: the standard variables, read by `run` only.
const TRACES_HELP: &str = "\
OpenTelemetry traces (off unless an endpoint is set; OTLP over http/protobuf only):
  OTEL_EXPORTER_OTLP_ENDPOINT         collector base URL, e.g. http://localhost:4318
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT  full traces URL (…/v1/traces), before the above
  OTEL_EXPORTER_OTLP_CERTIFICATE      CA (PEM) for an https:// endpoint [default: system]
  OTEL_SERVICE_NAME                   service.name [default: pgoutbox]
  OTEL_RESOURCE_ATTRIBUTES            key=value,… added to every span's resource
  OTEL_TRACES_SAMPLER, _ARG           e.g. parentbased_traceidratio and 0.01
  OTEL_SDK_DISABLED=true              traces off
A producer span per message (child of the row's traceparent; the message carries the
span's traceparent) and a span per transaction, from its decoding to its confirmation.";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stream outbox inserts to JetStream until SIGINT/SIGTERM (runs `setup` first).
    #[command(after_help = TRACES_HELP)]
    Run(RunArgs),
    /// Create the publication, the replication slot and the stream (idempotent); before the
    /// slot exists, add the tables a --table pattern matches that the publication lacks
    /// (once it exists, run adopts them with their rows).
    Setup(SetupArgs),
    /// Show the slot's position and lag, and the stream; exit 0 healthy, 1 warning, 2
    /// critical (slot missing or lost, database or NATS unreachable, the stream missing or
    /// not this source's).
    Status(StatusArgs),
    /// Publish chosen rows of the outbox table again: by id, by created-at time, or the
    /// rows of the stream's dead letters once fixed in the table; through the running
    /// pgoutbox when one streams into the stream; resumable with --replay-id. Exits 0 when
    /// done, 3 when no row of the table is selected (saying how its ids look), 1 on an
    /// error.
    Replay(ReplayArgs),
    /// Compare the outbox table's rows (all, or those created in a range) with the stream:
    /// report rows it lacks, rows it holds twice and messages out of commit order. Exits 0
    /// when every row is there once and in order, 2 when something is not, 1 when the
    /// check could not be made; with --replay-missing, hands the missing rows to replay.
    Verify(VerifyArgs),
    /// Drop the replication slot and the publication, and the event trigger of `setup
    /// --tenant-trigger` (the stream is kept); with --only-table, drop only that table from
    /// the publication.
    Teardown {
        /// Confirm that the slot and publication (or the table) should be dropped.
        #[arg(long)]
        yes: bool,
        /// Drop only this table from the publication (ALTER PUBLICATION … DROP TABLE),
        /// keeping the slot, the publication's other tables and the stream: a table no
        /// longer streamed (remove it from --table or --config too)
        #[arg(long, value_name = "SCHEMA.TABLE")]
        only_table: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The rows created at or after this time (a timestamptz) [default: every row]
    #[arg(long, allow_hyphen_values = true)]
    pub created_from: Option<String>,
    /// The rows created before this time
    #[arg(long, allow_hyphen_values = true)]
    pub created_to: Option<String>,
    /// The configured table to verify (schema.table); needed with several tables or a
    /// pattern [default: the one table]
    #[arg(long, value_name = "SCHEMA.TABLE")]
    pub from_table: Option<String>,
    /// Hand the rows the stream lacks to `pgoutbox replay` (through the running pgoutbox
    /// when one streams into the stream)
    #[arg(long)]
    pub replay_missing: bool,
    /// Print the findings as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The rows with these ids (comma-separated)
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["created_from", "created_to", "dead_letters"])]
    pub ids: Vec<String>,
    /// The rows created at or after this time (a timestamptz, e.g. '2026-11-25 07:00+00',
    /// or -infinity)
    #[arg(long, conflicts_with = "dead_letters", allow_hyphen_values = true)]
    pub created_from: Option<String>,
    /// The rows created before this time
    #[arg(long, conflicts_with = "dead_letters", allow_hyphen_values = true)]
    pub created_to: Option<String>,
    /// The rows named by the dead letters in the stream (fixed in the table since): they
    /// go out again on their own subjects, at the stream's end
    #[arg(long)]
    pub dead_letters: bool,
    /// Count what would be published; publish nothing
    #[arg(long)]
    pub dry_run: bool,
    /// At most this many rows a second [default: as fast as acks come]
    #[arg(long)]
    pub rate: Option<std::num::NonZeroU32>,
    /// Go on with the replay of this id (printed when a replay starts), storing nothing
    /// it stored already
    #[arg(long)]
    pub replay_id: Option<String>,
    /// The configured table whose rows are replayed (schema.table); needed with several
    /// tables, one table per replay [default: the one table]
    #[arg(long, value_name = "SCHEMA.TABLE")]
    pub from_table: Option<String>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// Refresh in place every second, with the lag's trend and rows/s, until Ctrl-C.
    #[arg(long)]
    pub watch: bool,
    /// Lag above this many bytes is a warning (exit 1).
    #[arg(long, env = "PGOUTBOX_MAX_LAG_BYTES", default_value_t = 1 << 30)]
    pub max_lag_bytes: i64,
    /// Where the running pgoutbox serves /metrics, read for the age of its last
    /// confirmation and whether it is stalled [default: the address the slot's holder
    /// advertises in its application_name, else 127.0.0.1:9717]
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_HTTP_ADDR")]
    pub http_addr: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub slot: SlotArgs,
    /// Address for /metrics, /healthz and /readyz [default: 127.0.0.1:9717; if that
    /// default is taken, e.g. by a standby on the same host, HTTP is skipped with a warning]
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_HTTP_ADDR")]
    pub http_addr: Option<std::net::SocketAddr>,
    /// Delete outbox rows this long after they were published (e.g. 24h, 7d), in batches
    /// of 1,000, from every outbox table; needs the created-at column and DELETE on each
    /// [default: keep all]
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_RETENTION", value_parser = crate::settings::units::parse_duration)]
    pub retention: Option<std::time::Duration>,
    /// Report a stall (/readyz 503, pgoutbox_stalled 1, a warning) when messages wait for
    /// acks and neither an ack came nor anything was confirmed for this long
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_STALL_TIMEOUT", default_value = "60s", value_parser = crate::settings::units::parse_duration)]
    pub stall_timeout: std::time::Duration,
    /// Confirm a position to Postgres only once JetStream acknowledged everything up to it
    /// this long ago: as long as the stream may still lose an acknowledged write (an R1
    /// stream's sync interval, 2m by nats-server's default), so that a restart reads again
    /// from the WAL what a server that lost power forgot. 0s: the stream syncs every write
    /// (sync_interval: always) or is replicated. Costs the WAL of that long, re-read at start
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_DURABILITY_HORIZON", default_value = "0s", value_parser = crate::settings::units::parse_duration_or_zero)]
    pub durability_horizon: std::time::Duration,
    /// Stop reading WAL while this many payload bytes await their acks (e.g. 32MiB, 1GB),
    /// besides the cap of 4,096 messages: bounds memory when rows are large. One message is
    /// always let through, whatever its size
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_MAX_IN_FLIGHT_BYTES", default_value = "32MiB", value_parser = crate::settings::units::parse_byte_size)]
    pub max_in_flight_bytes: usize,
    /// Also stream the events an application emits with
    /// `pg_logical_emit_message(true, '<prefix>', '<json>')`, interleaved with the table's
    /// rows in commit order; messages with other prefixes are ignored; empty turns it off
    #[arg(help_heading = TABLE, long, env = "PGOUTBOX_MESSAGE_PREFIX", default_value = "outbox")]
    pub message_prefix: String,
    /// When the slot was dropped or lost: create it again, and first publish from the
    /// outbox table, in order, every row the stream lacks (those committed while no slot
    /// existed); see docs/operations.md, slot lost. Does nothing while the slot exists
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_RECOVER", conflicts_with = "backfill")]
    pub recover: bool,
    /// When there is no slot yet, or the stream is new and empty: first publish every row
    /// of the outbox table the stream lacks, in order, then stream new ones without a gap
    /// or a repeat. Does nothing once the slot exists and the stream holds messages
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_BACKFILL")]
    pub backfill: bool,
    /// With --recover: rows are looked for in the table from this long before the row of
    /// the stream's last message (clock differences; without track_commit_timestamp, the
    /// longest a transaction stays open)
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_RECOVER_MARGIN", default_value = "10m", value_parser = crate::settings::units::parse_duration_or_zero)]
    pub recover_margin: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    #[command(flatten)]
    pub slot: SlotArgs,
    /// As a superuser: create the event trigger that adds each new table a --table
    /// pattern matches to the publication in the transaction that creates it, so a new
    /// tenant's rows are streamed from the first (see docs/operations.md, Tenant tables)
    #[arg(help_heading = TABLE, long)]
    pub tenant_trigger: bool,
}

#[derive(Debug, Args)]
pub struct SlotArgs {
    /// Create a new slot even though the stream shows pgoutbox ran before (the old slot was
    /// dropped or lost): events committed in between are not recovered.
    #[arg(help_heading = POSTGRES, long, env = "PGOUTBOX_RECREATE_SLOT")]
    pub recreate_slot: bool,
    /// Replicas of the stream when pgoutbox creates it (an existing stream is never changed)
    #[arg(help_heading = NATS, long, env = "PGOUTBOX_STREAM_REPLICAS", default_value_t = 1)]
    pub stream_replicas: usize,
    /// PostgreSQL 17+: make the slot a failover slot, synchronised to standbys that set
    /// sync_replication_slots, so streaming goes on from a promoted standby; turned on for
    /// an existing slot (see docs/operations.md, failover)
    #[arg(help_heading = POSTGRES, long, env = "PGOUTBOX_FAILOVER")]
    pub failover: bool,
    /// PostgreSQL 16+: the database URL names a physical standby on purpose; keep the slot
    /// there and decode on it (needs hot_standby_feedback and the publication, made on the
    /// primary; see docs/operations.md, streaming from a standby)
    #[arg(help_heading = POSTGRES, long, env = "PGOUTBOX_FROM_STANDBY", conflicts_with = "failover")]
    pub from_standby: bool,
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
    /// A TOML file of settings, keys spelled as these flags (database-url, stream, ...);
    /// [[table]] entries name several tables, each with its own subject-template,
    /// dead-letter-subject, column roles, cloudevents and ttl-column. A flag or variable
    /// given wins over the file's top level, never over a [[table]] key (see
    /// docs/operations.md, Several tables)
    #[arg(long, global = true, env = "PGOUTBOX_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Postgres connection string, URL or key=value, as libpq reads it; unset parameters
    /// come from a service (service=, PGSERVICE), then libpq's PG* variables (PGHOST,
    /// PGPORT, PGUSER, PGDATABASE, PGSSLMODE, ...), the password from ~/.pgpass or
    /// PGPASSFILE if none is given [env: PGOUTBOX_DATABASE_URL, DATABASE_URL]
    #[arg(help_heading = POSTGRES, long, global = true)]
    pub database_url: Option<String>,
    /// Shell command (run with sh -c) whose output is the Postgres password, run at every
    /// new connection, e.g. `aws rds generate-db-auth-token ...`; its password comes before
    /// any other
    #[arg(help_heading = POSTGRES, long, global = true, env = "PGOUTBOX_DATABASE_PASSWORD_COMMAND", hide_env_values = true)]
    pub database_password_command: Option<String>,
    /// How long --database-password-command may take before it is killed
    #[arg(help_heading = POSTGRES, long, global = true, env = "PGOUTBOX_DATABASE_PASSWORD_COMMAND_TIMEOUT", default_value = "10s", value_parser = crate::settings::units::parse_duration)]
    pub database_password_command_timeout: std::time::Duration,
    /// NATS server URL(s), comma-separated; nats://user:password@host or nats://token@host
    /// for those methods [env: PGOUTBOX_NATS_URL, NATS_URL] [default: nats://127.0.0.1:4222]
    #[arg(help_heading = NATS, long, global = true)]
    pub nats_url: Option<String>,
    /// NATS credentials file (JWT and NKey seed, as issued by nsc)
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_CREDS")]
    pub nats_creds: Option<std::path::PathBuf>,
    /// File holding an NKey user seed (SU...) for NATS
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_NKEY")]
    pub nats_nkey: Option<std::path::PathBuf>,
    /// CA certificate (PEM) to verify the NATS server with; requires TLS
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_TLS_CA")]
    pub nats_tls_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for NATS mutual TLS, with --nats-tls-key
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_TLS_CERT", requires = "nats_tls_key")]
    pub nats_tls_cert: Option<std::path::PathBuf>,
    /// Client key (PEM) for NATS mutual TLS, with --nats-tls-cert
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_NATS_TLS_KEY", requires = "nats_tls_cert")]
    pub nats_tls_key: Option<std::path::PathBuf>,
    /// The outbox table, schema-qualified or in `public`; repeatable (or comma-separated)
    /// for several tables that share every other setting, streamed into one stream in
    /// commit order, each message naming its table in Pgoutbox-Table and, with several
    /// tables, in its Nats-Msg-Id (<schema>.<table>:<id>). A `*` in either part names
    /// every table that matches, now and later (e.g. 'tenant_*.outbox'; {$schema} and
    /// {$table} in --subject-template; see docs/operations.md, Tenant tables)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_TABLE", value_delimiter = ',', default_value = "public.outbox")]
    pub table: Vec<String>,
    /// The table `pgoutbox replay` hands rows to the running pgoutbox through, made and
    /// published by setup. Default: beside the first table named exactly, <table>_replay;
    /// with table patterns alone, public.<publication>_replay. Set it where that schema is
    /// not writable by setup or not yours to write in
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_REPLAY_TABLE")]
    pub replay_table: Option<String>,
    /// Logical replication slot name.
    #[arg(help_heading = POSTGRES, long, global = true, env = "PGOUTBOX_SLOT", default_value = "pgoutbox")]
    pub slot: String,
    /// Publication name.
    #[arg(help_heading = POSTGRES, long, global = true, env = "PGOUTBOX_PUBLICATION", default_value = "pgoutbox")]
    pub publication: String,
    /// JetStream stream name.
    #[arg(help_heading = NATS, long, global = true, env = "PGOUTBOX_STREAM", default_value = "OUTBOX")]
    pub stream: String,
    /// Subject of each message; placeholders are column names.
    #[arg(
        help_heading = NATS,
        long,
        global = true,
        env = "PGOUTBOX_SUBJECT_TEMPLATE",
        default_value = "outbox.{aggregate_type}.{event_type}"
    )]
    pub subject_template: String,
    /// Subject for rows that cannot be published as they are (with the reason).
    #[arg(
        help_heading = NATS,
        long,
        global = true,
        env = "PGOUTBOX_DEAD_LETTER_SUBJECT",
        default_value = "outbox.dead_letter"
    )]
    pub dead_letter_subject: String,
    /// Stream only the events emitted with pg_logical_emit_message: no outbox table is
    /// needed or read (--table is ignored), the publication is created without tables
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_MESSAGES_ONLY")]
    pub messages_only: bool,
    /// Column holding the message id (becomes Nats-Msg-Id).
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_ID_COLUMN", default_value = "id")]
    pub id_column: String,
    /// Column holding the message body (json, jsonb, text or bytea).
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_PAYLOAD_COLUMN", default_value = "payload")]
    pub payload_column: String,
    /// Column holding a JSON object of extra headers (optional column).
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_HEADERS_COLUMN", default_value = "headers")]
    pub headers_column: String,
    /// Column sent as Outbox-Aggregate-Type (optional column).
    #[arg(
        help_heading = TABLE,
        long,
        global = true,
        env = "PGOUTBOX_AGGREGATE_TYPE_COLUMN",
        default_value = "aggregate_type"
    )]
    pub aggregate_type_column: String,
    /// Column sent as Outbox-Aggregate-Id (optional column).
    #[arg(
        help_heading = TABLE,
        long,
        global = true,
        env = "PGOUTBOX_AGGREGATE_ID_COLUMN",
        default_value = "aggregate_id"
    )]
    pub aggregate_id_column: String,
    /// Column sent as Outbox-Event-Type (optional column).
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_EVENT_TYPE_COLUMN", default_value = "event_type")]
    pub event_type_column: String,
    /// Column sent as Outbox-Created-At (optional column).
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_CREATED_AT_COLUMN", default_value = "created_at")]
    pub created_at_column: String,
    /// Send each row as a CloudEvent 1.0 (NATS binding): binary puts the attributes in
    /// ce- headers and keeps the payload as the body, structured sends the JSON event as
    /// the body; id is the row's id, type the event type column, time the created-at
    /// column, subject the aggregate id (see docs/operations.md, CloudEvents)
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_CLOUDEVENTS", value_enum, num_args = 0..=1, require_equals = true, default_missing_value = "binary")]
    pub cloudevents: Option<CloudEventsMode>,
    /// The CloudEvents source attribute [default: /postgres/<database>/<schema>.<table>]
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_CLOUDEVENTS_SOURCE", requires = "cloudevents")]
    pub cloudevents_source: Option<String>,
    /// Column whose value becomes the message's Nats-TTL: whole seconds, a duration such as
    /// 90s, 10m or 1h30m, or never; NULL for none (nats-server 2.11+, a stream that allows
    /// per-message TTLs); a value that is not a TTL makes the row a dead letter
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_TTL_COLUMN")]
    pub ttl_column: Option<String>,
    /// Column holding when to deliver the row (a timestamptz; a timestamp is read as UTC):
    /// the stream holds its message and delivers it to its subject then, once; NULL for
    /// now (nats-server 2.12+, a stream that allows message schedules, see
    /// docs/operations.md); a value that is not a time makes the row a dead letter
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_SCHEDULE_COLUMN")]
    pub schedule_column: Option<String>,
    /// Where scheduled rows wait: <prefix>.<Nats-Msg-Id>.<position>, outside the events' and
    /// the dead letters' subjects (an overlap is refused) so that no consumer sees a row
    /// before its time [default: schedules.<stream>]
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_SCHEDULE_SUBJECT_PREFIX")]
    pub schedule_subject_prefix: Option<String>,
    /// A Nats- header the headers column may set (repeatable, or comma-separated); any
    /// other Nats- header makes the row a dead letter. Those pgoutbox's ordering relies
    /// on (Nats-Msg-Id, Nats-Expected-*, Nats-Rollup, Nats-Schedule*, ...) are refused
    #[arg(help_heading = TABLE, long, global = true, env = "PGOUTBOX_ALLOW_NATS_HEADERS", value_delimiter = ',')]
    pub allow_nats_header: Vec<String>,
    /// Log format.
    #[arg(help_heading = OPS, long, global = true, env = "PGOUTBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}
