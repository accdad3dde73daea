//! Every metric's name, defined once: the instruments in `telemetry`, `retention` and
//! `status` (which reads some of them back from a running pgoutbox) use these.

pub const ROWS_PUBLISHED: &str = "pgoutbox_rows_published_total";
pub const BYTES_PUBLISHED: &str = "pgoutbox_bytes_published_total";
pub const TRANSACTIONS: &str = "pgoutbox_transactions_total";
pub const DEAD_LETTERS: &str = "pgoutbox_dead_letters_total";
pub const DUPLICATES: &str = "pgoutbox_duplicates_total";
pub const MESSAGES_IN_FLIGHT: &str = "pgoutbox_messages_in_flight";
pub const CONFIRMED_LSN: &str = "pgoutbox_confirmed_lsn";
pub const REPLICATION_LAG_BYTES: &str = "pgoutbox_replication_lag_bytes";
pub const PUBLISH_ERRORS: &str = "pgoutbox_publish_errors_total";
pub const RECONNECTS: &str = "pgoutbox_reconnects_total";
pub const STREAMING: &str = "pgoutbox_streaming";
pub const STALLED: &str = "pgoutbox_stalled";
pub const LAST_CONFIRMATION_AGE: &str = "pgoutbox_last_confirmation_age_seconds";
pub const RETENTION_DELETED: &str = "pgoutbox_retention_deleted_total";
/// Messages the stream was found to have lost after acknowledging them (a nats-server that
/// lost power with writes not yet synced), found when pgoutbox reconnects.
pub const STREAM_LOST_EVENTS: &str = "pgoutbox_stream_lost_events_total";
/// Streams found deleted and created again since pgoutbox recorded them (their history
/// is gone from them): each also has a warning.
pub const STREAM_RECREATED: &str = "pgoutbox_stream_recreated_total";
/// The durability horizon `run` keeps (`--durability-horizon`), and the WAL it holds: the
/// bytes between what JetStream acknowledged and what is confirmed to Postgres for it.
pub const DURABILITY_HORIZON_SECONDS: &str = "pgoutbox_durability_horizon_seconds";
pub const DURABILITY_HELD_BYTES: &str = "pgoutbox_durability_held_bytes";
/// How long the oldest position the horizon holds has waited, and until it is due to be
/// released (once a look finds its message): what `status` shows beside the held bytes.
pub const DURABILITY_HELD_SECONDS: &str = "pgoutbox_durability_held_seconds";
pub const DURABILITY_NEXT_RELEASE_SECONDS: &str = "pgoutbox_durability_next_release_seconds";
/// The WAL the horizon holds once it is full at the current write rate: the held bytes
/// scaled from how long they were held to the whole horizon (rate × horizon).
pub const DURABILITY_NEEDED_BYTES: &str = "pgoutbox_durability_needed_bytes";
/// With `--object-store`: the bytes its bucket holds (chunks and names, as JetStream
/// counts its stream), read after each object stored and at start; and the objects stored.
pub const OBJECT_STORE_BYTES: &str = "pgoutbox_object_store_bytes";
pub const OBJECTS_STORED: &str = "pgoutbox_objects_stored_total";
/// Tables a `--table` pattern matches that pgoutbox cannot stream (out of the publication,
/// and pgoutbox may not add them): each also has a warning naming it and what to run.
pub const TABLES_NOT_STREAMED: &str = "pgoutbox_tables_not_streamed";
/// Tables a `--table` pattern matches that joined the publication without the rows they
/// held being read: their owner is not trusted (`--trusted-owner`, docs/security.md).
pub const TABLES_UNREAD: &str = "pgoutbox_tables_unread_total";
/// Rows the adoption of a pattern's table under way has read and handed over so far; 0
/// when none is under way (`service::liveness::adopter`).
pub const ADOPTION_ROWS_READ: &str = "pgoutbox_adoption_rows_read";
/// What the last `run --verify-every` check found, by table (`service::delivery_check`):
/// rows created in its period the stream lacks, holds twice, and messages out of order;
/// and the end of the period it checked, in epoch seconds.
pub const VERIFY_MISSING_ROWS: &str = "pgoutbox_verify_missing_rows";
pub const VERIFY_DUPLICATED_ROWS: &str = "pgoutbox_verify_duplicated_rows";
pub const VERIFY_OUT_OF_ORDER: &str = "pgoutbox_verify_out_of_order_messages";
pub const VERIFY_CHECKED_TO: &str = "pgoutbox_verify_checked_to_timestamp_seconds";
/// `pg_logical_emit_message(false, ...)` messages with the outbox prefix: not published,
/// since they are sent even when their transaction rolls back.
pub const NON_TRANSACTIONAL_MESSAGES: &str = "pgoutbox_non_transactional_messages_total";
/// Seconds from a transaction's commit (its Begin message's timestamp) to the JetStream
/// ack of its last message.
pub const COMMIT_TO_ACK: &str = "pgoutbox_commit_to_ack_seconds";
/// The stages of that latency: commit → its Commit message received from the walsender
/// (Postgres's share), → the ack of its last message (the NATS hop and pgoutbox's
/// queue); and then the ack → the status update that confirmed it to Postgres.
pub const COMMIT_TO_RECEIVE: &str = "pgoutbox_commit_to_receive_seconds";
pub const RECEIVE_TO_ACK: &str = "pgoutbox_receive_to_ack_seconds";
pub const ACK_TO_CONFIRM: &str = "pgoutbox_ack_to_confirm_seconds";
pub const BUILD_INFO: &str = "pgoutbox_build_info";
/// 1, labelled with the server's version and (17+) whether the slot is a failover
/// slot and a synchronised copy; "unknown" before 17.
pub const POSTGRES_INFO: &str = "pgoutbox_postgres_info";
pub const NATS_INFO: &str = "pgoutbox_nats_info";
/// A seed from the table (`--recover`, `--backfill`): the rows it reads, and how many
/// of them were published or found in the stream already; both 0 when none runs.
pub const SEED_ROWS: &str = "pgoutbox_seed_rows";
pub const SEED_ROWS_DONE: &str = "pgoutbox_seed_rows_done";
pub const SEED_ROWS_LEFT: &str = "pgoutbox_seed_rows_left";
pub const SEED_ROWS_PER_SECOND: &str = "pgoutbox_seed_rows_per_second";
/// A replay handed over through the WAL (`pgoutbox replay` into the live stream): the
/// rows it hands over, how many of them JetStream acknowledged, and the pace.
pub const REPLAY_ROWS: &str = "pgoutbox_replay_rows";
pub const REPLAY_ROWS_DONE: &str = "pgoutbox_replay_rows_done";
pub const REPLAY_ROWS_LEFT: &str = "pgoutbox_replay_rows_left";
pub const REPLAY_ROWS_PER_SECOND: &str = "pgoutbox_replay_rows_per_second";
pub const REPLAYED_ROWS_UNREADABLE: &str = "pgoutbox_replayed_rows_unreadable_total";
