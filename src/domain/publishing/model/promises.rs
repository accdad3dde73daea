//! What every run must keep, checked after each step and at its end.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use super::jetstream::Message;
use super::{World, end_lsn};

impl World {
    /// The rows the stream holds, as themselves or as their letters, in stream order.
    pub(super) fn rows_stored(&self) -> Vec<usize> {
        self.jetstream.stored.iter().filter_map(|message| message.row()).collect()
    }

    /// Always: each row at most once, in commit order, a row with an id of its own never a
    /// letter, and every confirmed row stored.
    pub(super) fn check_stream(&self) -> Result<(), Broken> {
        let stored = self.rows_stored();
        let all = &self.jetstream.stored;
        if stored.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(Broken::from(format!("stored twice or out of order: {all:?}")));
        }
        for message in all {
            if let Message::Letter(row) = *message
                && self.ids.iter().filter(|&&id| id == self.ids[row]).count() == 1
                && !self.old_ids.contains(&self.ids[row])
            {
                return Err(Broken::from(format!("row {row} has its own id: {all:?}")));
            }
        }
        for (row, &transaction) in self.transaction_of.iter().enumerate() {
            if end_lsn(transaction) <= self.slot_confirmed && !stored.contains(&row) {
                return Err(Broken::from(format!(
                    "confirmed {} past row {row}, which is not stored: {all:?}",
                    self.slot_confirmed
                )));
            }
        }
        Ok(())
    }

    /// At the end: every row stored, none twice, in order.
    pub(super) fn check_done(&self) -> Result<(), Broken> {
        let all: Vec<usize> = (0..self.transaction_of.len()).collect();
        match self.rows_stored() == all {
            true => Ok(()),
            false => Err(Broken::from(format!("the stream holds {:?}", self.jetstream.stored))),
        }
    }

    pub(super) fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        format!("{self:?}").hash(&mut hasher);
        hasher.finish()
    }
}

/// A run that broke a promise, and how.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Broken(pub(super) String);

impl From<String> for Broken {
    fn from(why: String) -> Broken {
        Broken(why)
    }
}

impl From<&str> for Broken {
    fn from(why: &str) -> Broken {
        Broken(why.to_owned())
    }
}
