//! What a stream can lose of what JetStream acknowledged, read from its configuration, for
//! `setup` and `status` (issue 46): an acknowledgement is not durability.

/// The stream's storage and, on nats-server 2.12+, its persistence mode.
pub fn persistence(stream: &async_nats::jetstream::stream::Config) -> String {
    use async_nats::jetstream::stream::{PersistenceMode, StorageType};
    let storage = match stream.storage {
        StorageType::File => "file",
        StorageType::Memory => "memory",
    };
    match stream.persist_mode {
        Some(PersistenceMode::Async) => format!("{storage}, async"),
        _ => storage.to_owned(),
    }
}

/// What the stream can lose of what it acknowledged, what keeps it, and whether pgoutbox's
/// `--durability-horizon` (`horizon`) covers it.
pub fn durability(
    stream: &async_nats::jetstream::stream::Config,
    horizon: std::time::Duration,
) -> String {
    use async_nats::jetstream::stream::{PersistenceMode, StorageType};
    let covered = if horizon.is_zero() {
        "pgoutbox run --durability-horizon <that long> keeps those events in the slot to \
         publish again"
            .to_owned()
    } else {
        format!(
            "pgoutbox's --durability-horizon of {} s keeps that long of events in the slot to \
             publish again",
            horizon.as_secs_f64()
        )
    };
    if stream.storage == StorageType::Memory {
        return "memory storage: a restart of nats-server loses every message; use file \
                storage"
            .to_owned();
    }
    if stream.persist_mode == Some(PersistenceMode::Async) {
        return format!(
            "async persistence: the server acknowledges before it writes, so any crash loses \
             its last writes, on every replica; use the default persist_mode; {covered}"
        );
    }
    match stream.num_replicas {
        0 | 1 => format!(
            "one replica: a power loss of its server loses what it acknowledged since its \
             last sync to disk (every 2 min by default), unless nats-server runs with \
             sync_interval: always (each write waits for the disk); {covered}"
        ),
        n => format!(
            "{n} replicas: an acknowledged write is on a majority; losing power on all of them \
             at once loses what none synced, unless they run with sync_interval: always; \
             {covered}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_nats::jetstream::stream::{Config, PersistenceMode, StorageType};

    use super::{durability, persistence};

    #[test]
    fn what_a_stream_can_lose_is_said_with_the_setting_that_keeps_it() {
        let r1 = Config { num_replicas: 1, ..Default::default() };
        let said = durability(&r1, Duration::ZERO);
        assert!(said.contains("power loss") && said.contains("sync_interval: always"), "{said}");
        assert!(said.contains("run --durability-horizon"), "{said}");
        assert!(durability(&r1, Duration::from_secs(120)).contains("of 120 s keeps"));
        let r3 = Config { num_replicas: 3, ..Default::default() };
        assert!(durability(&r3, Duration::ZERO).starts_with("3 replicas"));
        let lazy = Config { persist_mode: Some(PersistenceMode::Async), ..r3 };
        assert!(durability(&lazy, Duration::ZERO).starts_with("async persistence"));
        assert_eq!(persistence(&lazy), "file, async");
        let memory = Config { storage: StorageType::Memory, ..Default::default() };
        assert!(durability(&memory, Duration::ZERO).starts_with("memory storage"));
        assert_eq!(persistence(&memory), "memory");
    }
}
