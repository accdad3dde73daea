//! `--transaction-subject`: where each transaction's end message goes, on a subject of its
//! own.

use super::check_subject;
use crate::domain::outbox::{TableEntry, subjects_overlap};
use crate::settings::cli::CommonArgs;

/// `--transaction-subject`, checked: a subject of its own, which no event, dead letter or
/// schedule can have, so that an end message is never read as one of them.
pub(super) fn checked(
    args: &CommonArgs,
    tables: &[TableEntry],
    defaults: &TableEntry,
) -> anyhow::Result<Option<String>> {
    let Some(subject) = &args.transaction_subject else { return Ok(None) };
    check_subject("--transaction-subject", subject)?;
    for entry in tables.iter().chain([defaults]) {
        let mut theirs = vec![
            ("--subject-template", entry.template.wildcard()),
            ("--dead-letter-subject", entry.dead_letter_subject.clone()),
        ];
        if let Some(schedule) = &entry.roles.schedule {
            theirs.push(("--schedule-subject-prefix", format!("{}.>", schedule.subject_prefix)));
        }
        if let Some((flag, other)) =
            theirs.iter().find(|(_, other)| subjects_overlap(subject, other))
        {
            anyhow::bail!(
                "--transaction-subject {subject} overlaps {flag}'s subjects ({other}): an end \
                 message must have a subject of its own; choose another, e.g. outbox.transactions"
            );
        }
    }
    Ok(Some(subject.clone()))
}
