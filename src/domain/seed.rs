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

/// The time a replay id made by `pgoutbox replay` (`r<epoch seconds>-<random>`, or
/// `r<epoch seconds>` before) was made; `None` for an id chosen by hand.
pub fn replay_started(id: &str) -> Option<u64> {
    let made = id.strip_prefix('r')?;
    let seconds = made.split_once('-').map_or(made, |(seconds, _)| seconds);
    seconds.parse().ok()
}

/// Whether `id` may name a replay: letters, digits, '.', '_' and '-', so that
/// [`row_id_of`] reads a replayed message's id back without doubt.
pub fn is_replay_id(id: &str) -> bool {
    !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// What a replay puts before a row's id in its `Nats-Msg-Id`, `replay:<replay id>/<index>:`:
/// a replayed row is a message of its own, stored even while JetStream still holds the
/// first one's id in its duplicate window; the row's place in the replay's selection keeps
/// two rows that share an id (a non-unique id column) apart; and it is the same in every
/// run of one replay over the same rows, so a resumed replay stores it once.
pub fn replay_id_prefix(replay_id: &str, index: u64) -> String {
    format!("{REPLAY_ID_PREFIX}{replay_id}/{index}:")
}

const REPLAY_ID_PREFIX: &str = "replay:";

/// The row a message was published from, by its `Nats-Msg-Id`: the id itself, or the id a
/// dead letter or a replay is named after (a letter named by position names no row id).
/// A replay id has no `:` and no `/` ([`is_replay_id`]), so both `replay:<id>/<index>:<row>`
/// and the older `replay:<id>:<row>` read back.
pub fn row_id_of(msg_id: &str) -> &str {
    let id = msg_id.strip_prefix(DEAD_LETTER_ID_PREFIX).unwrap_or(msg_id);
    match id.strip_prefix(REPLAY_ID_PREFIX).and_then(|rest| rest.split_once(':')) {
        Some((_, row)) => row,
        None => id,
    }
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
    fn a_replayed_row_and_its_dead_letter_name_the_row() {
        let msg_id = format!("{}7f0c:1", replay_id_prefix("r1764050000", 12));
        assert_eq!(msg_id, "replay:r1764050000/12:7f0c:1");
        assert_eq!(row_id_of(&msg_id), "7f0c:1");
        assert_eq!(row_id_of("replay:r1764050000:7f0c:1"), "7f0c:1", "the older form");
        assert_eq!(row_id_of(&format!("dead-letter:{msg_id}")), "7f0c:1");
        assert_eq!(row_id_of("replay:"), "replay:", "no replay id: taken as it is");
    }

    #[test]
    fn a_replay_id_holds_no_separator() {
        assert!(is_replay_id("r1764050000") && is_replay_id("night.ly_2-b"));
        for bad in ["", "a:b", "a/b", "a b", "é"] {
            assert!(!is_replay_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_made_replay_id_says_when_it_began() {
        assert_eq!(replay_started("r1764050000"), Some(1_764_050_000));
        assert_eq!(replay_started("r1764050000-0f3a9c2b7d4e5a61"), Some(1_764_050_000));
        assert_eq!(replay_started("nightly"), None);
        assert_eq!(replay_started("r12x"), None);
    }
}
