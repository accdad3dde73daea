//! What a seeded or replayed message carries (`service::seed`, `commands::replay`): pure
//! names and parsing.

use crate::domain::outbox::DEAD_LETTER_ID_PREFIX;

/// On every seeded message: the consistent point of the snapshot it was read from.
pub const SEED_HEADER: &str = "Pgoutbox-Seed";
/// On every seeded message of a recovery: its bound, in epoch seconds (`service::seed`).
pub const SEED_SINCE_HEADER: &str = "Pgoutbox-Seed-Since";

/// On every message `pgoutbox replay` publishes: the replay's id, by which a replay that
/// was cut short finds what it stored already.
pub const REPLAY_HEADER: &str = "Pgoutbox-Replay";

/// The time a replay id made by `pgoutbox replay` (`r<epoch seconds>`) was made; `None`
/// for an id chosen by hand.
pub fn replay_started(id: &str) -> Option<u64> {
    id.strip_prefix('r')?.parse().ok()
}

/// The row a message was published from, by its `Nats-Msg-Id`: the id itself, or the id a
/// dead letter is named after (a letter named by position names no row id).
pub fn row_id_of(msg_id: &str) -> &str {
    msg_id.strip_prefix(DEAD_LETTER_ID_PREFIX).unwrap_or(msg_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_names_its_row() {
        assert_eq!(row_id_of("42"), "42");
        assert_eq!(row_id_of("dead-letter:42"), "42");
        assert_eq!(row_id_of("dead-letter:dead-letter:1"), "dead-letter:1");
    }

    #[test]
    fn a_made_replay_id_says_when_it_began() {
        assert_eq!(replay_started("r1764050000"), Some(1_764_050_000));
        assert_eq!(replay_started("nightly"), None);
        assert_eq!(replay_started("r12x"), None);
    }
}
