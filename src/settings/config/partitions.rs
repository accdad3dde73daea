//! `--partitions`: how many partitions `{$partition}` in the subject template spreads
//! aggregates over. Each goes without the other only by mistake, refused at start.

use anyhow::anyhow;

use crate::domain::outbox::SubjectTemplate;

/// The template with `--partitions`, which `{$partition}` needs and nothing else uses.
pub(super) fn partitioned(
    template: SubjectTemplate,
    partitions: Option<u32>,
) -> anyhow::Result<SubjectTemplate> {
    match (template.partitioned(), partitions) {
        (_, Some(0)) => Err(anyhow!(
            "--partitions 0: {{$partition}} needs at least one partition; give how many \
             partitions the consumers share, e.g. --partitions 8"
        )),
        (true, Some(n)) => Ok(template.with_partitions(n)),
        (true, None) => Err(anyhow!(
            "--subject-template {template} holds {{$partition}} but --partitions is not set: \
             give how many partitions the consumers share, e.g. --partitions 8"
        )),
        (false, Some(n)) => Err(anyhow!(
            "--partitions {n} is set but --subject-template {template} has no {{$partition}}: \
             put it where the partition goes (e.g. orders.{{$partition}}.{{event_type}}) or \
             drop --partitions"
        )),
        (false, None) => Ok(template),
    }
}
