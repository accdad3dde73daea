//! What a message says of its transaction (issue 48): whether it is the transaction's last,
//! and there how many messages the transaction has, so that a consumer knows it has seen a
//! whole transaction without waiting for the next one. Messages of one transaction share
//! the commit LSN of their `Pgoutbox-Position`.
//!
//! With `--transaction-subject`, each transaction also ends with a message of its own
//! ([`Counts::end_message`]), as Debezium's transaction metadata does: what the transaction
//! holds in its place in the stream, by partition, and what it holds elsewhere (dead
//! letters, scheduled rows), so that a consumer of any part knows when its part is whole.

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

/// On a transaction's end message: the commit LSN of the transaction it ends.
pub const END_HEADER: &str = "Pgoutbox-Transaction-End";
/// The `Nats-Msg-Id` of an end message begins with this, then `<source>/<commit LSN>`.
pub const END_ID_PREFIX: &str = "transaction:";

/// What one of a transaction's rows became in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Became {
    /// A message in the transaction's place on an event subject, on this partition when
    /// its subject has `{$partition}`.
    Event { partition: Option<u32> },
    /// A schedule: delivered by nats-server at its time, an event of its own then.
    Scheduled,
    /// A dead letter, on the dead-letter subject, in the row's place.
    DeadLetter,
}

/// What a transaction's rows became, counted as they go out: a few numbers, however many
/// rows the transaction has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    events: u32,
    scheduled: u32,
    dead_letters: u32,
    /// Events by partition, in partition order.
    partitions: std::collections::BTreeMap<u32, u32>,
}

impl Counts {
    pub fn add(&mut self, became: Became) {
        match became {
            Became::Event { partition } => {
                self.events += 1;
                if let Some(partition) = partition {
                    *self.partitions.entry(partition).or_default() += 1;
                }
            }
            Became::Scheduled => self.scheduled += 1,
            Became::DeadLetter => self.dead_letters += 1,
        }
    }

    /// A row counted as `was` became its dead letter after all (its id was another
    /// message's, answered while the transaction was still going out).
    pub fn became_dead_letter(&mut self, was: Became) {
        match was {
            Became::Event { partition } => {
                self.events = self.events.saturating_sub(1);
                if let Some(n) = partition.and_then(|p| self.partitions.get_mut(&p)) {
                    *n = n.saturating_sub(1);
                }
            }
            Became::Scheduled => self.scheduled = self.scheduled.saturating_sub(1),
            Became::DeadLetter => return,
        }
        self.dead_letters += 1;
    }

    /// The end message's id and JSON body for the transaction committed at `commit_lsn`
    /// (as `X/Y`) from `source`: the id is unique to the transaction in every history of
    /// every database, so the duplicate window never takes another's end for its own.
    pub fn end_message(&self, source: &str, commit_lsn: &str) -> (String, Vec<u8>) {
        let partitions: serde_json::Map<String, serde_json::Value> =
            self.partitions.iter().map(|(p, n)| (p.to_string(), (*n).into())).collect();
        let body = serde_json::json!({
            "commit_lsn": commit_lsn,
            "events": self.events,
            "partitions": partitions,
            "dead_letters": self.dead_letters,
            "scheduled": self.scheduled,
        });
        (format!("{END_ID_PREFIX}{source}/{commit_lsn}"), body.to_string().into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_message_counts_each_row_where_it_went() {
        let mut counts = Counts::default();
        for became in [
            Became::Event { partition: Some(3) },
            Became::Event { partition: Some(0) },
            Became::Event { partition: Some(3) },
            Became::Scheduled,
            Became::DeadLetter,
        ] {
            counts.add(became);
        }
        let (id, body) = counts.end_message("7/1/db/slot", "0/16B3748");
        assert_eq!(id, "transaction:7/1/db/slot/0/16B3748");
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"commit_lsn": "0/16B3748", "events": 3,
                "partitions": {"0": 1, "3": 2}, "dead_letters": 1, "scheduled": 1})
        );
        counts.became_dead_letter(Became::Event { partition: Some(0) });
        let body: serde_json::Value =
            serde_json::from_slice(&counts.end_message("s", "0/1").1).unwrap();
        assert_eq!((body["events"].as_u64(), body["dead_letters"].as_u64()), (Some(2), Some(2)));
        assert_eq!(body["partitions"], serde_json::json!({"0": 0, "3": 2}));
        let mut unpartitioned = Counts::default();
        unpartitioned.add(Became::Event { partition: None });
        let (_, body) = unpartitioned.end_message("s", "0/1");
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (body["events"].as_u64(), body["partitions"].as_object().map(|p| p.len())),
            (Some(1), Some(0))
        );
    }

    #[test]
    fn only_the_last_message_counts_its_transaction() {
        assert_eq!((InTransaction::NotLast.last(), InTransaction::NotLast.rows()), ("false", None));
        let last = InTransaction::Last { rows: 3 };
        assert_eq!((last.last(), last.rows()), ("true", Some(3)));
    }
}
