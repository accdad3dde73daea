//! What a message says of its transaction (issue 48): whether it is the transaction's last,
//! and there how many messages the transaction has, so that a consumer knows it has seen a
//! whole transaction without waiting for the next one. Messages of one transaction share
//! the commit LSN of their `Pgoutbox-Position`.

/// On every message of a transaction: `true` on its last, `false` on the others.
pub const LAST_HEADER: &str = "Pgoutbox-Transaction-Last";
/// On a transaction's last message: how many messages the transaction has in the stream
/// (rows and dead letters in their place, emitted and replayed rows included).
pub const ROWS_HEADER: &str = "Pgoutbox-Transaction-Rows";

/// A message's place in its transaction, as far as its headers tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InTransaction {
    NotLast,
    /// The last, of `rows` messages.
    Last {
        rows: u32,
    },
}

impl InTransaction {
    /// The `Pgoutbox-Transaction-Last` value.
    pub fn last(self) -> &'static str {
        match self {
            InTransaction::NotLast => "false",
            InTransaction::Last { .. } => "true",
        }
    }

    /// The `Pgoutbox-Transaction-Rows` value, on the last message only.
    pub fn rows(self) -> Option<u32> {
        match self {
            InTransaction::NotLast => None,
            InTransaction::Last { rows } => Some(rows),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_message_counts_its_transaction() {
        assert_eq!((InTransaction::NotLast.last(), InTransaction::NotLast.rows()), ("false", None));
        let last = InTransaction::Last { rows: 3 };
        assert_eq!((last.last(), last.rows()), ("true", Some(3)));
    }
}
