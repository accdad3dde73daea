//! What a seeded message carries (see `service::seed`): pure names and parsing.

use crate::domain::outbox::DEAD_LETTER_ID_PREFIX;

/// On every seeded message: the consistent point of the snapshot it was read from.
pub const SEED_HEADER: &str = "Pgoutbox-Seed";
/// On every seeded message of a recovery: its bound, in epoch seconds (`service::seed`).
pub const SEED_SINCE_HEADER: &str = "Pgoutbox-Seed-Since";

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
}
