//! A subject template such as `outbox.{aggregate_type}.{event_type}`: parsed once, checked
//! so that every subject it can make is valid, and its wildcard for the stream.
//!
//! `{$schema}` and `{$table}` stand for the row's table (a `$` cannot start an unquoted
//! column name): with a table pattern, `tenants.{$schema}.{event_type}` gives each tenant
//! its own subjects. `{$partition}` stands for the partition of the row's aggregate id
//! among `--partitions` (see `partition.rs`).

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Part {
    Literal(String),
    Column(String),
}

/// The placeholder of the row's schema's name.
pub const SCHEMA_PLACEHOLDER: &str = "$schema";
/// The placeholder of the row's table's name.
pub const TABLE_PLACEHOLDER: &str = "$table";
/// The placeholder of the partition of the row's aggregate id.
pub const PARTITION_PLACEHOLDER: &str = "$partition";

/// A subject such as `outbox.{aggregate_type}.{event_type}`: placeholders name columns, or
/// the row's table (`{$schema}`, `{$table}`), or the partition of its aggregate id
/// (`{$partition}`, among [`SubjectTemplate::partitions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectTemplate {
    pub(super) parts: Vec<Part>,
    source: String,
    /// `--partitions`: set by the settings, which refuse `{$partition}` without it.
    partitions: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid subject template {template:?}: {reason}")]
pub struct TemplateError {
    template: String,
    reason: &'static str,
}

impl FromStr for SubjectTemplate {
    type Err = TemplateError;

    fn from_str(template: &str) -> Result<Self, Self::Err> {
        let fail = |reason| TemplateError { template: template.to_owned(), reason };
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_owned()));
            }
            let close = rest[open..].find('}').ok_or_else(|| fail("a `{` is never closed"))?;
            let column = &rest[open + 1..open + close];
            if column.is_empty() || column.contains('{') {
                return Err(fail("a placeholder must be a column name, as in {event_type}"));
            }
            let named = [SCHEMA_PLACEHOLDER, TABLE_PLACEHOLDER, PARTITION_PLACEHOLDER];
            if column.starts_with('$') && !named.contains(&column) {
                return Err(fail(
                    "the placeholders that start with `$` are {$schema}, {$table} and \
                     {$partition}",
                ));
            }
            parts.push(Part::Column(column.to_owned()));
            rest = &rest[open + close + 1..];
        }
        if rest.contains('}') {
            return Err(fail("a `}` has no matching `{`"));
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        let template = SubjectTemplate { parts, source: template.to_owned(), partitions: None };
        // Every token must be valid once each placeholder holds a valid token.
        let sample = template.wildcard();
        // Any whitespace or control character, not only ' ' and '\t': NATS splits a protocol
        // line on them, and `\0` is `wildcard`'s own placeholder mark (found by fuzzing).
        let bad = |c: char| c.is_whitespace() || c.is_control() || c == '>';
        if template.parts.iter().any(|p| matches!(p, Part::Literal(l) if l.contains(bad)))
            || sample.split('.').any(|t| t.is_empty() || t.contains('>'))
        {
            return Err(fail(
                "it must be dot-separated, non-empty tokens without whitespace, control \
                 characters or `>`",
            ));
        }
        if template.parts.iter().any(|p| matches!(p, Part::Literal(l) if l.contains('*'))) {
            return Err(fail("`*` is a wildcard and cannot appear in a subject"));
        }
        Ok(template)
    }
}

impl fmt::Display for SubjectTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl SubjectTemplate {
    /// The subject filter that covers every subject this template can produce
    /// (each token holding a placeholder becomes `*`). The stream is created with it.
    pub fn wildcard(&self) -> String {
        let mut rendered = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(l) => rendered.push_str(l),
                Part::Column(_) => rendered.push('\u{0}'),
            }
        }
        rendered
            .split('.')
            .map(|token| if token.contains('\u{0}') { "*" } else { token })
            .collect::<Vec<_>>()
            .join(".")
    }

    /// Whether the template names the row's table (`{$schema}`, `{$table}`): only a row
    /// decoded from a table has one.
    pub fn names_table(&self) -> bool {
        self.parts.iter().any(
            |p| matches!(p, Part::Column(c) if c == SCHEMA_PLACEHOLDER || c == TABLE_PLACEHOLDER),
        )
    }

    /// Whether the template holds `{$partition}`.
    pub fn partitioned(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Column(c) if c == PARTITION_PLACEHOLDER))
    }

    /// How many partitions `{$partition}` spreads aggregates over (`--partitions`).
    pub fn partitions(&self) -> Option<u32> {
        self.partitions
    }

    /// The same template, `{$partition}` taking values in `0..partitions`.
    pub fn with_partitions(mut self, partitions: u32) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// The columns the template reads (not `{$schema}`, `{$table}` nor `{$partition}`).
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Column(c) if !c.starts_with('$') => Some(c.as_str()),
            Part::Column(_) | Part::Literal(_) => None,
        })
    }
}

/// Whether some subject matches both filters (`*` one token, `>` one or more at the end).
pub fn subjects_overlap(a: &str, b: &str) -> bool {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
    for (x, y) in a.iter().zip(&b) {
        if *x == ">" || *y == ">" {
            return true;
        }
        if x != y && *x != "*" && *y != "*" {
            return false;
        }
    }
    a.len() == b.len()
}

/// The longest subject published: the `HPUB` line also holds the reply subject (about 50
/// bytes) and two lengths, and nats-server refuses a line over its `max_control_line`
/// (4,096 bytes by default) with `-ERR 'Maximum Control Line Exceeded'`, closing the
/// connection, so such a row would be retried forever.
pub const MAX_SUBJECT_BYTES: usize = 3_968;

/// Why a value cannot be one subject token, if it cannot.
pub(super) fn check_subject_token(token: &str) -> Result<(), &'static str> {
    if token.is_empty() {
        Err("is empty and cannot be a subject token")
    } else if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Err("contains whitespace and cannot be a subject token")
    } else if token.contains(['.', '*', '>']) {
        Err("contains `.`, `*` or `>` and cannot be a subject token")
    } else {
        Ok(())
    }
}
