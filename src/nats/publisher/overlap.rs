//! JetStream refuses to create a stream whose subjects overlap another stream's with API
//! error 10065, "subjects overlap with an existing stream", naming neither the subjects
//! nor the stream. pgoutbox then lists the account's streams, finds those in the way
//! (`subjects_overlap`, as nats-server matches filters) and says, in one line, which of
//! its subjects which stream holds, and the ways out.

use std::fmt;

use async_nats::jetstream;
use futures_util::TryStreamExt;

use super::subject_covers;
use crate::domain::outbox::subjects_overlap;

/// Another stream holds subjects the stream pgoutbox would create needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectsTaken {
    /// The stream pgoutbox would create, and the subjects it needs.
    pub stream: String,
    pub ours: Vec<String>,
    /// Each stream whose subjects overlap ours: its name and every subject it has.
    pub others: Vec<(String, Vec<String>)>,
    /// Why the account's streams could not be listed, if they could not.
    pub unlisted: Option<String>,
}

impl SubjectsTaken {
    /// Lists the streams of `js`'s account to find those holding `ours`.
    pub async fn find(js: &jetstream::Context, stream: &str, ours: &[String]) -> SubjectsTaken {
        let mut taken = SubjectsTaken {
            stream: stream.to_owned(),
            ours: ours.to_vec(),
            others: Vec::new(),
            unlisted: None,
        };
        match js.streams().try_collect::<Vec<_>>().await {
            Ok(infos) => {
                for info in infos {
                    let theirs = info.config.subjects;
                    let overlaps = |t: &String| ours.iter().any(|o| subjects_overlap(o, t));
                    if info.config.name != stream && theirs.iter().any(overlaps) {
                        taken.others.push((info.config.name, theirs));
                    }
                }
            }
            Err(err) => taken.unlisted = Some(err.to_string()),
        }
        taken
    }

    /// Which of `subjects` overlap one of `with`.
    fn overlapping<'a>(subjects: &'a [String], with: &[String]) -> Vec<&'a str> {
        subjects
            .iter()
            .filter(|s| with.iter().any(|w| subjects_overlap(s, w)))
            .map(String::as_str)
            .collect()
    }
}

impl fmt::Display for SubjectsTaken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stream = &self.stream;
        let theirs: Vec<String> = self.others.iter().flat_map(|(_, s)| s.clone()).collect();
        let ours = match Self::overlapping(&self.ours, &theirs) {
            taken if taken.is_empty() => self.ours.join(", "),
            taken => taken.join(", "),
        };
        write!(f, "stream {stream} cannot be created: its subjects {ours} overlap ")?;
        if self.others.is_empty() {
            write!(f, "another stream's (JetStream error 10065)")?;
            if let Some(why) = &self.unlisted {
                write!(f, ", and the streams could not be listed ({why})")?;
            }
            return write!(
                f,
                "; a subject belongs to one stream only: find that stream (`nats stream \
                 info` shows a stream's subjects) and take them from it, or give pgoutbox \
                 others (--subject-template, --dead-letter-subject)"
            );
        }
        let held: Vec<String> = (self.others.iter())
            .map(|(name, subjects)| {
                format!("stream {name}'s {}", Self::overlapping(subjects, &self.ours).join(", "))
            })
            .collect();
        write!(f, "{}; a subject belongs to one stream only: ", held.join(" and "))?;
        // A stream of ours, under another name: it takes all our subjects and nothing else
        // (pgoutbox must be the only writer of its stream).
        if let [(name, subjects)] = &self.others[..]
            && self.ours.iter().all(|o| subjects.iter().any(|s| subject_covers(s, o)))
            && subjects.iter().all(|s| self.ours.iter().any(|o| subjects_overlap(o, s)))
        {
            write!(f, "write into {name} if it is meant for these events (--stream {name}), ")?;
        }
        write!(
            f,
            "give pgoutbox subjects no stream holds (--subject-template, --dead-letter-subject)"
        )?;
        for (name, subjects) in &self.others {
            let keep: Vec<&str> = (subjects.iter())
                .filter(|s| !self.ours.iter().any(|o| subjects_overlap(o, s)))
                .map(String::as_str)
                .collect();
            match &keep[..] {
                [] => write!(
                    f,
                    ", or give {name} other subjects (nats stream edit {name} --subjects ...)"
                )?,
                keep => write!(
                    f,
                    ", or take them from {name} (nats stream edit {name} --subjects '{}')",
                    keep.join(",")
                )?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn taken(others: &[(&str, &[&str])]) -> SubjectsTaken {
        SubjectsTaken {
            stream: "OUTBOX".into(),
            ours: strings(&["outbox.*.*", "outbox.dead_letter"]),
            others: others.iter().map(|(n, s)| (n.to_string(), strings(s))).collect(),
            unlisted: None,
        }
    }

    #[test]
    fn a_stream_of_our_subjects_alone_is_offered_as_the_stream_to_write() {
        let said = taken(&[("OTHER", &["outbox.>"])]).to_string();
        assert_eq!(
            said,
            "stream OUTBOX cannot be created: its subjects outbox.*.*, outbox.dead_letter \
             overlap stream OTHER's outbox.>; a subject belongs to one stream only: write into \
             OTHER if it is meant for these events (--stream OTHER), give pgoutbox subjects no \
             stream holds (--subject-template, --dead-letter-subject), or give OTHER other \
             subjects (nats stream edit OTHER --subjects ...)"
        );
        // One that takes other subjects too is written by others: only its own are kept.
        let mixed = taken(&[("OTHER", &["outbox.>", "billing.>"])]).to_string();
        assert!(!mixed.contains("--stream OTHER"), "{mixed}");
        assert!(
            mixed.ends_with("take them from OTHER (nats stream edit OTHER --subjects 'billing.>')")
        );
    }

    #[test]
    fn only_the_subjects_that_overlap_are_named() {
        let said = taken(&[("A", &["outbox.orders.*"]), ("B", &["outbox.dead_letter"])]);
        let said = said.to_string();
        assert!(said.contains("its subjects outbox.*.*, outbox.dead_letter overlap"), "{said}");
        assert!(said.contains("stream A's outbox.orders.* and stream B's outbox.dead_letter"));
        assert!(!said.contains("--stream A") && !said.contains("--stream B"), "{said}");
        assert!(said.contains("give A other subjects (nats stream edit A --subjects ...)"));
        let one = taken(&[("C", &["outbox.dead_letter", "c.x"])]).to_string();
        assert!(one.contains("its subjects outbox.dead_letter overlap stream C's"), "{one}");
        assert!(one.contains("--subjects 'c.x'") && !one.contains("--stream C"), "{one}");
    }

    #[test]
    fn streams_that_cannot_be_listed_still_name_our_subjects() {
        let mut unlisted = taken(&[]);
        unlisted.unlisted = Some("permissions violation".into());
        let said = unlisted.to_string();
        assert!(said.contains("outbox.*.*, outbox.dead_letter overlap another stream's"));
        assert!(said.contains("could not be listed (permissions violation)"), "{said}");
    }
}
