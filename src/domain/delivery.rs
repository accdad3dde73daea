//! What `pgoutbox verify` finds when it compares the outbox table with the stream: rows the
//! stream lacks, rows it holds twice, and messages out of commit order. Pure: the command
//! reads the stream (`nats::publisher::read_back`) and the table, and this judges.

use std::collections::HashMap;

use crate::domain::progress::Position;

/// How many examples of each finding are kept to show.
pub const SHOWN: usize = 20;

/// Whether the stream's messages are in commit order: along the stream, each source's
/// positions only grow. Seeded messages (`0/0:<index>`, read from the table ahead of the
/// slot's), replays' copies and the messages the server delivers for schedules (placed at
/// their time, not their commit) are not checked.
#[derive(Debug, Default)]
pub struct OrderCheck {
    last: HashMap<String, (Position, u64)>,
    pub violations: u64,
    pub examples: Vec<String>,
}

impl OrderCheck {
    /// The message at stream `sequence`, written by `source` from `position`.
    pub fn see(&mut self, source: &str, position: Position, sequence: u64) {
        if position.commit_lsn == 0 {
            return;
        }
        match self.last.get_mut(source) {
            Some((last, at)) if position < *last => {
                self.violations += 1;
                if self.examples.len() < SHOWN {
                    self.examples.push(format!(
                        "sequence {sequence} (position {position}) after sequence {at} \
                         (position {last})"
                    ));
                }
            }
            Some(last) => *last = (position, sequence),
            None => {
                self.last.insert(source.to_owned(), (position, sequence));
            }
        }
    }
}

/// What the table's rows found in the stream.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    pub rows: u64,
    pub missing: u64,
    pub duplicated: u64,
    /// Ids of missing rows (the first [`SHOWN`]), and all of them for a replay when asked.
    pub missing_ids: Vec<String>,
    pub duplicated_ids: Vec<String>,
}

impl Findings {
    /// One row of the table: `held` whether the stream holds it (as itself, a copy or its
    /// dead letter), `copies` how many messages of it there are.
    pub fn row(&mut self, id: &str, held: bool, copies: usize, keep_all_missing: bool) {
        self.rows += 1;
        if !held {
            self.missing += 1;
            if keep_all_missing || self.missing_ids.len() < SHOWN {
                self.missing_ids.push(id.to_owned());
            }
        }
        if copies > 1 {
            self.duplicated += 1;
            if self.duplicated_ids.len() < SHOWN {
                self.duplicated_ids.push(id.to_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(commit_lsn: u64, index: u32) -> Position {
        Position { commit_lsn, index }
    }

    #[test]
    fn a_position_going_back_is_out_of_order_per_source_and_seeds_are_not_checked() {
        let mut order = OrderCheck::default();
        order.see("a", at(0x10, 0), 1);
        order.see("a", at(0x10, 1), 2);
        order.see("a", at(0, 5), 3);
        order.see("b", at(0x05, 0), 4);
        order.see("a", at(0x20, 0), 5);
        assert_eq!(order.violations, 0);
        order.see("a", at(0x10, 2), 6);
        assert_eq!(order.violations, 1);
        assert!(order.examples[0].starts_with("sequence 6 (position 0/10:2) after sequence 5"));
        order.see("a", at(0x30, 0), 7);
        assert_eq!(order.violations, 1, "the next one in order is fine");
    }

    #[test]
    fn missing_and_duplicated_rows_are_counted_with_examples() {
        let mut findings = Findings::default();
        findings.row("1", true, 1, false);
        findings.row("2", false, 0, false);
        findings.row("3", true, 2, false);
        findings.row("4", true, 0, false);
        assert_eq!((findings.rows, findings.missing, findings.duplicated), (4, 1, 1));
        assert_eq!(
            (findings.missing_ids, findings.duplicated_ids),
            (vec!["2".into()], vec!["3".into()])
        );
    }
}
