//! The flags of one subcommand each (the shared ones are `CommonArgs`). Under a heading
//! they follow the shared flags ([`OWN`]); each struct defines its flags in the order of
//! the headings (Postgres, NATS, Outbox table, Operations), since clap lists the headings
//! in the order their first flags are defined.

use clap::Args;

use super::{NATS, OPS, OWN, POSTGRES, TABLE};

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The rows created at or after this time (a timestamptz) [default: every row]
    #[arg(long, allow_hyphen_values = true, value_name = "TIME")]
    pub created_from: Option<String>,
    /// The rows created before this time
    #[arg(long, allow_hyphen_values = true, value_name = "TIME")]
    pub created_to: Option<String>,
    /// The configured table to verify [default: the one table]
    ///
    /// Schema-qualified (schema.table); needed with several tables or a pattern
    #[arg(long, value_name = "TABLE")]
    pub from_table: Option<String>,
    /// Hand the rows the stream lacks to `pgoutbox replay`
    ///
    /// Through the running pgoutbox when one streams into the stream
    #[arg(long)]
    pub replay_missing: bool,
    /// Print the findings as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The rows with these ids (comma-separated)
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["created_from", "created_to", "dead_letters"], value_name = "IDS")]
    pub ids: Vec<String>,
    /// The rows created at or after this time (a timestamptz)
    ///
    /// E.g. '2026-11-25 07:00+00', or -infinity
    #[arg(long, conflicts_with = "dead_letters", allow_hyphen_values = true, value_name = "TIME")]
    pub created_from: Option<String>,
    /// The rows created before this time
    #[arg(long, conflicts_with = "dead_letters", allow_hyphen_values = true, value_name = "TIME")]
    pub created_to: Option<String>,
    /// The rows named by the stream's dead letters (fixed in the table since)
    ///
    /// They go out again on their own subjects, at the stream's end
    #[arg(long)]
    pub dead_letters: bool,
    /// Count what would be published; publish nothing
    #[arg(long)]
    pub dry_run: bool,
    /// At most this many rows a second [default: as fast as acks come]
    #[arg(long, value_name = "ROWS")]
    pub rate: Option<std::num::NonZeroU32>,
    /// Go on with the replay of this id (printed when a replay starts)
    ///
    /// Storing nothing it stored already
    #[arg(long, value_name = "ID")]
    pub replay_id: Option<String>,
    /// The configured table whose rows are replayed [default: the one table]
    ///
    /// Schema-qualified (schema.table); needed with several tables, one table per replay
    #[arg(long, value_name = "TABLE")]
    pub from_table: Option<String>,
    #[command(flatten)]
    pub objects: ObjectStoreArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// Refresh in place every second, with the lag's trend and rows/s, until Ctrl-C
    #[arg(long)]
    pub watch: bool,
    /// Lag above this many bytes is a warning (exit 1)
    #[arg(long, env = "PGOUTBOX_MAX_LAG_BYTES", default_value_t = 1 << 30, value_name = "BYTES")]
    pub max_lag_bytes: i64,
    /// Where the running pgoutbox serves /metrics, read for its stalls
    ///
    /// Read for the age of its last confirmation and whether it is stalled [default: the
    /// address the slot's holder advertises in its application_name, else 127.0.0.1:9717]
    #[arg(long, env = "PGOUTBOX_HTTP_ADDR", value_name = "ADDR")]
    pub http_addr: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub slot: SlotArgs,
    /// Address for /metrics, /healthz and /readyz [default: 127.0.0.1:9717]
    ///
    /// If that default is taken, e.g. by a standby on the same host, HTTP is skipped with a
    /// warning
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_HTTP_ADDR", value_name = "ADDR")]
    pub http_addr: Option<std::net::SocketAddr>,
    /// First publish the table's rows the stream lacks (no slot yet, or a new stream)
    ///
    /// Every row of the outbox table the stream lacks, in order, when there is no slot yet
    /// or the stream is new and empty; then new ones, without a gap or a repeat. Does
    /// nothing once the slot exists and the stream holds messages
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_BACKFILL")]
    pub backfill: bool,
    /// After the slot or the stream lost events: publish what the stream lacks from the table
    ///
    /// When the slot was dropped or lost: every row of the outbox table the stream lacks
    /// (those committed while no slot existed), in order, before streaming from the new
    /// slot; see docs/runbooks/slot-lost.md. When the stream forgot events its slot
    /// confirmed past (its server lost power; known from the record pgoutbox keeps in
    /// Postgres): the slot is made again the same way. Otherwise does nothing
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_RECOVER", conflicts_with = "backfill")]
    pub recover: bool,
    /// With --recover: how far back the table is compared with the stream
    ///
    /// Rows are looked for in the table from this long before the row of the stream's last
    /// message (clock differences; without track_commit_timestamp, the longest a
    /// transaction stays open)
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_RECOVER_MARGIN", default_value = "10m", value_parser = crate::settings::units::parse_duration_or_zero, value_name = "DURATION", hide_short_help = true)]
    pub recover_margin: std::time::Duration,
    /// Delete outbox rows this long after they were published (e.g. 7d)
    ///
    /// E.g. 24h, 7d; in batches of 1,000, from every outbox table; needs the created-at
    /// column and DELETE on each [default: keep all]
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_RETENTION", value_parser = crate::settings::units::parse_duration, value_name = "DURATION")]
    pub retention: Option<std::time::Duration>,
    /// Report a stall when acks stop coming for this long
    ///
    /// /readyz 503, pgoutbox_stalled 1, a warning: when messages wait for acks and neither
    /// an ack came nor anything was confirmed for this long
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_STALL_TIMEOUT", default_value = "60s", value_parser = crate::settings::units::parse_duration, value_name = "DURATION", hide_short_help = true)]
    pub stall_timeout: std::time::Duration,
    /// Check the rows created each period against the stream, as verify does
    ///
    /// Every this long, the rows of each named table created since the last check (and at
    /// least a minute before the newest commit published) are compared with the stream: what
    /// it lacks, holds twice or holds out of commit order goes to /metrics
    /// (pgoutbox_verify_*) and to one warning with the ids to replay. Costs a read of those
    /// rows and of their messages each period (about 12 us a row). 0s: off
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_VERIFY_EVERY", default_value = "0s", value_parser = crate::settings::units::parse_duration_or_zero, value_name = "DURATION", hide_short_help = true)]
    pub verify_every: std::time::Duration,
    /// Stop reading WAL while this many payload bytes await their acks
    ///
    /// E.g. 32MiB, 1GB; besides the cap of 4,096 messages: bounds memory when rows are
    /// large. One message is always let through, whatever its size
    #[arg(help_heading = OPS, long, env = "PGOUTBOX_MAX_IN_FLIGHT_BYTES", default_value = "32MiB", value_parser = crate::settings::units::parse_byte_size, value_name = "BYTES", hide_short_help = true)]
    pub max_in_flight_bytes: usize,
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    #[command(flatten)]
    pub slot: SlotArgs,
    /// As a superuser: stream each new table a --table pattern matches from its first row
    ///
    /// Creates the event trigger that adds each new table a --table pattern matches to the
    /// publication in the transaction that creates it, so a new tenant's rows are streamed
    /// from the first (see docs/operations.md#tenant-tables)
    #[arg(help_heading = TABLE, long, env = "PGOUTBOX_TENANT_TRIGGER")]
    pub tenant_trigger: bool,
}

/// The slot and stream flags of `run` and `setup`, which create them.
#[derive(Debug, Args)]
#[command(next_display_order = OWN)]
pub struct SlotArgs {
    /// PostgreSQL 17+: make the slot a failover slot, kept on standbys
    ///
    /// Synchronised to standbys that set sync_replication_slots, so streaming goes on from
    /// a promoted standby; turned on for an existing slot (see
    /// docs/runbooks/failover.md#failover-postgresql-17-failover-slots)
    #[arg(help_heading = POSTGRES, long, env = "PGOUTBOX_FAILOVER", hide_short_help = true)]
    pub failover: bool,
    /// PostgreSQL 16+: keep the slot on the standby the URL names, decode there
    ///
    /// The database URL names a physical standby on purpose; keep the slot there and decode
    /// on it (needs hot_standby_feedback and the publication, made on the primary; see
    /// docs/runbooks/failover.md#streaming-from-a-standby-postgresql-16)
    #[arg(help_heading = POSTGRES, long, env = "PGOUTBOX_FROM_STANDBY", conflicts_with = "failover", hide_short_help = true)]
    pub from_standby: bool,
    /// Create a new slot though the stream shows pgoutbox ran before
    ///
    /// The old slot was dropped or lost: events committed in between are not recovered
    /// (--recover publishes them from the table).
    #[arg(help_heading = POSTGRES, long, env = "PGOUTBOX_RECREATE_SLOT", hide_short_help = true)]
    pub recreate_slot: bool,
    /// Replicas of the stream when pgoutbox creates it
    ///
    /// An existing stream is never changed
    #[arg(help_heading = NATS, long, env = "PGOUTBOX_STREAM_REPLICAS", default_value_t = 1, value_name = "N")]
    pub stream_replicas: usize,
    #[command(flatten)]
    pub objects: ObjectStoreArgs,
    /// Also stream events emitted with pg_logical_emit_message and this prefix [default: off]
    ///
    /// `pg_logical_emit_message(true, '<prefix>', '<json>')`, interleaved with the table's
    /// rows in commit order; messages with other prefixes are ignored. Off by default:
    /// every role that may execute the function may then hand pgoutbox an event, and PUBLIC
    /// may unless revoked (`setup` and `run` say so; docs/runbooks/emitted-events.md)
    #[arg(help_heading = TABLE, long, env = "PGOUTBOX_MESSAGE_PREFIX", default_value = "", hide_default_value = true, value_name = "PREFIX", hide_short_help = true)]
    pub message_prefix: String,
}

/// `--object-store` and its settings: `run` and `setup` store large payloads with them;
/// `replay` takes them too, so that it runs with `run`'s settings (the pgoutbox the rows are
/// handed to stores them by its own).
#[derive(Debug, Default, Args)]
#[command(next_display_order = OWN + 4)] // after `SlotArgs`' four before them
pub struct ObjectStoreArgs {
    /// Store payloads too large for a message in this Object Store bucket
    ///
    /// A row whose message would exceed the server's max_payload (or the stream's
    /// max_msg_size) is stored as an object, and its message carries a pointer instead
    /// (headers Pgoutbox-Object-Bucket, -Name, -Size, -Sha256); setup creates the bucket,
    /// with the stream's replicas and expiry. Without it such a row is a dead letter
    #[arg(help_heading = NATS, long, env = "PGOUTBOX_OBJECT_STORE", value_parser = crate::nats::large_payloads::bucket_name, value_name = "BUCKET", hide_short_help = true)]
    pub object_store: Option<String>,
    /// With --object-store: store payloads over this size there too, e.g. 256KiB
    #[arg(help_heading = NATS, long, env = "PGOUTBOX_OBJECT_STORE_OVER", requires = "object_store", value_parser = crate::settings::units::parse_byte_size, value_name = "BYTES", hide_short_help = true)]
    pub object_store_over: Option<usize>,
    /// With --object-store: the largest payload stored as an object, e.g. 64MiB
    ///
    /// A larger row is a dead letter saying so, without its payload (the row stays in the
    /// table). Default: no limit; set it below the memory pgoutbox may use
    #[arg(help_heading = NATS, long, env = "PGOUTBOX_OBJECT_STORE_MAX_SIZE", requires = "object_store", value_parser = crate::settings::units::parse_byte_size, value_name = "BYTES", hide_short_help = true)]
    pub object_store_max_size: Option<usize>,
    /// With --object-store: replicas of a bucket pgoutbox creates (default: the stream's)
    #[arg(help_heading = NATS, long, env = "PGOUTBOX_OBJECT_STORE_REPLICAS", requires = "object_store", value_name = "N", hide_short_help = true)]
    pub object_store_replicas: Option<usize>,
    /// With --object-store: how long a bucket pgoutbox creates keeps objects
    ///
    /// Default: as long as the stream keeps messages (its max_age); never shorter
    #[arg(help_heading = NATS, long, env = "PGOUTBOX_OBJECT_STORE_MAX_AGE", requires = "object_store", value_parser = crate::settings::units::parse_duration_or_zero, value_name = "DURATION", hide_short_help = true)]
    pub object_store_max_age: Option<std::time::Duration>,
}

impl ObjectStoreArgs {
    /// `--object-store` and its settings, when given.
    pub fn large_payloads(&self) -> Option<crate::nats::large_payloads::LargePayloads> {
        Some(crate::nats::large_payloads::LargePayloads {
            bucket: self.object_store.clone()?,
            over: self.object_store_over,
            max_size: self.object_store_max_size,
            replicas: self.object_store_replicas,
            max_age: self.object_store_max_age,
        })
    }
}
