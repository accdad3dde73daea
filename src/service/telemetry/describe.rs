//! Every metric's help line and starting value.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge};

use super::{NatsFailureKind, ReconnectTarget, names};

/// Gives every metric its `# HELP` line, puts every counter (each label value too) at 0 so
/// that `rate()` and `increase()` alerts work before the first event, and sets
/// `pgoutbox_build_info`. Gauges whose value is unknown until streaming starts (confirmed
/// LSN, lag) stay absent until then rather than claim 0.
pub(super) fn describe() {
    // Per table (the `table` label): put at 0 for each table by `Metrics::tables`, once the
    // configuration is known.
    for (name, help) in PER_TABLE_COUNTERS {
        describe_counter!(name, help);
    }
    for (name, help) in COUNTERS {
        describe_counter!(name, help);
        counter!(name).increment(0);
    }
    describe_counter!(names::PUBLISH_ERRORS, "Publishes JetStream did not acknowledge, by kind.");
    for kind in NatsFailureKind::ALL.into_iter().filter_map(NatsFailureKind::publish_error_label) {
        counter!(names::PUBLISH_ERRORS, "kind" => kind).increment(0);
    }
    describe_counter!(names::RECONNECTS, "Reconnections after a failure, by target.");
    for target in [ReconnectTarget::Postgres, ReconnectTarget::Nats] {
        counter!(names::RECONNECTS, "target" => target.as_str()).increment(0);
    }
    for (name, help) in GAUGES {
        describe_gauge!(name, help);
    }
    for name in GAUGES_AT_ZERO {
        gauge!(name).set(0.0);
    }
    for (name, help) in HISTOGRAMS {
        describe_histogram!(name, metrics::Unit::Seconds, help);
    }
    gauge!(
        names::BUILD_INFO,
        "version" => env!("CARGO_PKG_VERSION"),
        "target" => format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS),
    )
    .set(1.0);
}

/// Counters by table (the `table` label).
const PER_TABLE_COUNTERS: [(&str, &str); 4] = [
    (
        names::ROWS_PUBLISHED,
        "Messages acknowledged by JetStream (dead letters included), by table.",
    ),
    (names::BYTES_PUBLISHED, "Payload bytes acknowledged by JetStream, by table."),
    (names::DEAD_LETTERS, "Rows sent to the dead-letter subject, by table."),
    (
        names::DUPLICATES,
        "Rows not stored because an older message in the stream has their id (not counted \
         as published), by table.",
    ),
];

/// Counters without labels.
const COUNTERS: [(&str, &str); 8] = [
    (names::TRANSACTIONS, "Transactions decoded."),
    (
        names::NON_TRANSACTIONAL_MESSAGES,
        "Non-transactional pg_logical_emit_message messages with the outbox prefix, not published.",
    ),
    (names::RETENTION_DELETED, "Outbox rows deleted by --retention."),
    (names::OBJECTS_STORED, "Payloads stored as objects in the --object-store bucket."),
    (
        names::TABLES_UNREAD,
        "Tables of a --table pattern that joined the publication without the rows they \
         held being read: an owner pgoutbox does not trust (--trusted-owner).",
    ),
    (
        names::STREAM_LOST_EVENTS,
        "Messages the stream lost after acknowledging them, found at a reconnection \
         (each also logged, saying whether the slot still holds them).",
    ),
    (
        names::STREAM_RECREATED,
        "Times the stream was found deleted and created again since pgoutbox recorded \
         it: its history is gone from it (each also a warning naming run --backfill).",
    ),
    (
        names::REPLAYED_ROWS_UNREADABLE,
        "Rows inserted into the replay table that pgoutbox may not publish (unreadable, \
         of a newer version, or for another relation): published as dead letters.",
    ),
];

/// Gauges with their help lines.
const GAUGES: [(&str, &str); 29] = [
    (names::MESSAGES_IN_FLIGHT, "Publishes waiting for their JetStream ack."),
    (names::CONFIRMED_LSN, "The LSN last confirmed to Postgres, as a number."),
    (names::REPLICATION_LAG_BYTES, "Server WAL end minus the confirmed LSN, in bytes."),
    (
        names::DURABILITY_HORIZON_SECONDS,
        "--durability-horizon: how long an acknowledged position waits before it is \
         confirmed, so that the WAL brings back what a nats-server that lost power forgot.",
    ),
    (
        names::DURABILITY_HELD_BYTES,
        "WAL acknowledged by JetStream and held unconfirmed by the durability horizon, in \
         bytes (part of the replication lag).",
    ),
    (
        names::DURABILITY_HELD_SECONDS,
        "How long the oldest position the durability horizon holds has waited; 0 when it \
         holds none.",
    ),
    (
        names::DURABILITY_NEXT_RELEASE_SECONDS,
        "Seconds until the oldest held position is due to be confirmed (once a look finds \
         its message still in the stream); 0 when due or none is held.",
    ),
    (
        names::DURABILITY_NEEDED_BYTES,
        "The WAL the durability horizon holds once full at the current write rate (held \
         bytes scaled to the whole horizon): compare with max_slot_wal_keep_size.",
    ),
    (
        names::OBJECT_STORE_BYTES,
        "With --object-store: the bytes its bucket holds, read after each object stored.",
    ),
    (
        names::ADOPTION_ROWS_READ,
        "Rows the adoption of a pattern's new table under way has read and handed over; \
         0 when none is under way.",
    ),
    (names::STREAMING, "1 while the replication stream is open (0 for a hot standby)."),
    (
        names::STALLED,
        "1 while messages wait and no ack came and nothing was confirmed for --stall-timeout.",
    ),
    (
        names::LAST_CONFIRMATION_AGE,
        "Seconds since the confirmed position last advanced while something waited.",
    ),
    (names::BUILD_INFO, "Always 1; the labels say which pgoutbox this is."),
    (
        names::TABLES_NOT_STREAMED,
        "Tables a --table pattern matches that pgoutbox may not add to the publication \
         (each named in a warning with what to run); the other tables stream on.",
    ),
    (
        names::VERIFY_MISSING_ROWS,
        "Rows created in the last --verify-every period that the stream lacks, by table.",
    ),
    (
        names::VERIFY_DUPLICATED_ROWS,
        "Rows created in the last --verify-every period that the stream holds twice.",
    ),
    (names::VERIFY_OUT_OF_ORDER, "Messages of the last --verify-every period out of commit order."),
    (
        names::VERIFY_CHECKED_TO,
        "The end of the last period --verify-every found clean, in epoch seconds.",
    ),
    (names::SEED_ROWS, "Rows a seed from the table reads (--recover, --backfill); 0: none runs."),
    (names::SEED_ROWS_DONE, "Of those, rows published or found in the stream already."),
    (names::SEED_ROWS_LEFT, "Of those, rows still to read."),
    (names::SEED_ROWS_PER_SECOND, "The seed's rows per second over the last 10 s."),
    (
        names::REPLAY_ROWS,
        "Rows the last pgoutbox replay into this stream hands over through the WAL; 0: none.",
    ),
    (names::REPLAY_ROWS_DONE, "Of those, rows JetStream acknowledged."),
    (names::REPLAY_ROWS_LEFT, "Of those, rows not acknowledged yet."),
    (names::REPLAY_ROWS_PER_SECOND, "The replay's rows per second over the last 10 s."),
    (
        names::POSTGRES_INFO,
        "Always 1; the labels say which Postgres is streamed from and how the slot is kept.",
    ),
    (
        names::NATS_INFO,
        "1 for the nats-server pgoutbox is connected to (its version, and whether \
         JetStream answered it), 0 for one it was connected to before.",
    ),
];

/// Gauges whose 0 is true from the start: nothing waits, nothing runs.
const GAUGES_AT_ZERO: [&str; 13] = [
    names::MESSAGES_IN_FLIGHT,
    names::TABLES_NOT_STREAMED,
    names::STREAMING,
    names::STALLED,
    names::SEED_ROWS,
    names::SEED_ROWS_DONE,
    names::SEED_ROWS_LEFT,
    names::SEED_ROWS_PER_SECOND,
    names::REPLAY_ROWS,
    names::REPLAY_ROWS_DONE,
    names::REPLAY_ROWS_LEFT,
    names::REPLAY_ROWS_PER_SECOND,
    names::LAST_CONFIRMATION_AGE,
];

/// Latencies, in seconds.
const HISTOGRAMS: [(&str, &str); 4] = [
    (names::COMMIT_TO_ACK, "From a transaction's commit to the JetStream ack of its last message."),
    (
        names::COMMIT_TO_RECEIVE,
        "From a transaction's commit to pgoutbox receiving its Commit message.",
    ),
    (
        names::RECEIVE_TO_ACK,
        "From receiving a transaction's Commit to the ack of its last message.",
    ),
    (
        names::ACK_TO_CONFIRM,
        "From the ack that made a transaction confirmable to the status update confirming it.",
    ),
];
