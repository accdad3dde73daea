//! The subject of one row: the template's parts resolved once per version of the table
//! (columns to positions, `{$schema}`/`{$table}` to the table's names, `{$partition}` to the
//! aggregate id's position and the count), then filled from each row's values.

use std::fmt::Write;

use super::partition::partition;
use super::template::{self, Part, check_subject_token};
use super::{
    ColumnRoles, MAX_SUBJECT_BYTES, MappingError, Rejection, RowMapping, SHOWN_VALUE_BYTES,
    SubjectTemplate, dead_letter,
};
use crate::domain::row::{ColumnValue, Relation};

/// One part of a subject, resolved.
#[derive(Clone)]
pub(super) enum SubjectPart {
    Literal(String),
    Column(usize),
    /// `{$schema}` or `{$table}` (the placeholder, without braces) and the table's value.
    Named(&'static str, String),
    /// `{$partition}`: the partition of this column's value (the aggregate id) among so many.
    Partition(usize, u32),
}

/// The role named in errors about the aggregate id column `{$partition}` reads.
pub(super) const PARTITION_ROLE: &str = "aggregate id, which {$partition} reads";

/// The template's parts for rows of `relation`, and why none of its rows can have a subject
/// when none can (its schema's or table's name is no subject token). `require` finds a
/// column the subject needs, or says the table lacks it.
pub(super) fn resolve(
    template: &SubjectTemplate,
    relation: &Relation,
    roles: &ColumnRoles,
    require: impl Fn(&str, &'static str) -> Result<usize, MappingError>,
) -> Result<(Vec<SubjectPart>, Option<String>), MappingError> {
    let mut parts = Vec::with_capacity(template.parts.len());
    let mut unusable = None;
    for part in &template.parts {
        parts.push(match part {
            Part::Literal(l) => SubjectPart::Literal(l.clone()),
            Part::Column(c) if c == template::PARTITION_PLACEHOLDER => SubjectPart::Partition(
                require(&roles.aggregate_id, PARTITION_ROLE)?,
                template.partitions().unwrap_or(0),
            ),
            Part::Column(c)
                if c == template::SCHEMA_PLACEHOLDER || c == template::TABLE_PLACEHOLDER =>
            {
                let (name, placeholder) = match c == template::SCHEMA_PLACEHOLDER {
                    true => (&relation.namespace, template::SCHEMA_PLACEHOLDER),
                    false => (&relation.name, template::TABLE_PLACEHOLDER),
                };
                // Every row of the table would have a bad subject: each becomes a dead
                // letter saying why, the other tables stream on.
                if let Err(why) = check_subject_token(name) {
                    let shown = dead_letter::shorten(name, SHOWN_VALUE_BYTES);
                    unusable = Some(format!("{{{c}}} = {shown:?} {why}"));
                }
                SubjectPart::Named(placeholder, name.clone())
            }
            Part::Column(c) => SubjectPart::Column(require(c, "subject placeholder")?),
        });
    }
    Ok((parts, unusable))
}

impl RowMapping {
    /// The subject of `tuple`, or why it has none: a placeholder's column is NULL, not
    /// UTF-8 or no subject token, or the subject is too long to publish. `{$partition}`
    /// hashes the aggregate id's text, whatever it holds; NULL has no partition.
    pub(super) fn subject_of(&self, tuple: &[ColumnValue]) -> Result<String, Rejection> {
        let mut subject = String::with_capacity(64);
        for part in &self.subject {
            match part {
                SubjectPart::Literal(l) | SubjectPart::Named(_, l) => subject.push_str(l),
                SubjectPart::Column(i) => {
                    let token = self.text(tuple, *i)?;
                    check_subject_token(token).map_err(|why| {
                        // The value is shown cut short: the reason must stay readable and
                        // fit a header, however long the value.
                        let shown = dead_letter::shorten(token, SHOWN_VALUE_BYTES);
                        Rejection(format!("column {} = {shown:?} {why}", self.name(*i)))
                    })?;
                    subject.push_str(token);
                }
                SubjectPart::Partition(i, partitions) => {
                    let key = self.text(tuple, *i).map_err(|Rejection(why)| {
                        Rejection(format!("{why}: {{$partition}} needs the aggregate id"))
                    })?;
                    let _ = write!(subject, "{}", partition(key.as_bytes(), *partitions));
                }
            }
        }
        if subject.len() > MAX_SUBJECT_BYTES {
            return Err(Rejection(format!(
                "the subject is {} bytes: longer than the {MAX_SUBJECT_BYTES} that fit the \
                 NATS control line (nats-server's max_control_line, 4 KiB by default, refuses \
                 the publish and closes the connection)",
                subject.len()
            )));
        }
        Ok(subject)
    }

    /// The partition `{$partition}` puts the row on, when its subject has one: the one
    /// [`Self::subject_of`] writes, `None` when the aggregate id cannot give one.
    pub fn partition_of(&self, tuple: &[ColumnValue]) -> Option<u32> {
        if tuple.len() != self.column_names.len() {
            return None;
        }
        self.subject.iter().find_map(|part| match part {
            SubjectPart::Partition(i, partitions) => {
                Some(partition(self.text(tuple, *i).ok()?.as_bytes(), *partitions))
            }
            _ => None,
        })
    }

    /// The template's text back from the parts, for traces.
    pub(super) fn template_text(&self) -> String {
        let mut template = String::with_capacity(64);
        for part in &self.subject {
            let _ = match part {
                SubjectPart::Literal(l) => template.write_str(l),
                SubjectPart::Named(placeholder, _) => write!(template, "{{{placeholder}}}"),
                SubjectPart::Column(i) => write!(template, "{{{}}}", self.name(*i)),
                SubjectPart::Partition(..) => {
                    write!(template, "{{{}}}", template::PARTITION_PLACEHOLDER)
                }
            };
        }
        template
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::domain::row::Column;

    fn text(s: &str) -> ColumnValue {
        ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn template(partitions: u32) -> SubjectTemplate {
        let template: SubjectTemplate = "orders.{$partition}.{event_type}".parse().unwrap();
        template.with_partitions(partitions)
    }

    #[test]
    fn a_row_is_on_its_aggregate_ids_partition_and_a_null_id_is_refused() {
        let columns = ["id", "aggregate_id", "event_type", "payload"];
        let relation = Relation {
            rel_id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: columns
                .iter()
                .map(|name| Column {
                    flags: 0,
                    name: (*name).into(),
                    type_oid: 25,
                    type_modifier: -1,
                })
                .collect(),
        };
        let mapping = RowMapping::new(&relation, &ColumnRoles::default(), &template(7)).unwrap();
        let row = |id: ColumnValue| vec![text("1"), id, text("placed"), text("{}")];
        // ("ÄÖü-ключ-日本" is 6 of 7, as Go's fnv.New32a gives it.)
        let event = mapping.map(&row(text("ÄÖü-ключ-日本"))).unwrap();
        assert_eq!(event.subject, "orders.6.placed");
        assert_eq!(mapping.subject_template(false), "orders.{$partition}.{event_type}");
        let Rejection(why) = mapping.map(&row(ColumnValue::Null)).unwrap_err();
        assert_eq!(why, "column aggregate_id is NULL: {$partition} needs the aggregate id");
        let roles = ColumnRoles { aggregate_id: "customer".into(), ..ColumnRoles::default() };
        let missing = RowMapping::new(&relation, &roles, &template(7)).err().unwrap();
        assert_eq!((missing.column.as_str(), missing.role), ("customer", PARTITION_ROLE));
    }

    #[test]
    fn an_emitted_event_is_partitioned_by_its_aggregate_id_key() {
        let mapping =
            RowMapping::for_emitted_messages("outbox", &ColumnRoles::default(), &template(4));
        let content =
            br#"{"id":"e1","aggregate_id":"order-42","event_type":"placed","payload":{}}"#;
        let row = mapping.emitted_row(&Bytes::from_static(content)).unwrap();
        assert_eq!(mapping.map(&row).unwrap().subject, "orders.0.placed");
        let content = br#"{"id":"e2","event_type":"placed","payload":{}}"#;
        let row = mapping.emitted_row(&Bytes::from_static(content)).unwrap();
        assert!(mapping.map(&row).unwrap_err().0.contains("aggregate_id is NULL"));
    }

    #[test]
    fn the_placeholder_parses_and_only_schema_and_table_name_the_table() {
        let template = template(3);
        assert!(template.partitioned() && !template.names_table());
        assert_eq!(template.columns().collect::<Vec<_>>(), ["event_type"]);
        let refused = "a.{$tenant}".parse::<SubjectTemplate>().unwrap_err().to_string();
        assert!(refused.contains("{$partition}"), "{refused}");
    }
}
