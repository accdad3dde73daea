//! The soak's checker: the whole stream (but the tenants' messages, `tenants::check`'s) held
//! against what the writer committed and what the nemesis replayed. Every committed event
//! exactly once (as its message or as its dead letter), maybe-events at most once, each
//! replayed row once per replay, live events in commit order; events a truncate removed
//! while the slot was dropped may be missing.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::SlotDrop;
use super::tenants::check::is_tenants;
use super::writer::{Event, Ledger};
use crate::support::stream::Stored;

/// One `pgoutbox replay` the nemesis ran.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// The id it printed (`Pgoutbox-Replay` on its messages).
    pub id: String,
    /// The events of the rows it was given.
    pub events: Vec<u64>,
    /// It did not finish (killed after a timeout, or failed): each row at most once.
    pub unfinished: bool,
    /// pgoutbox was down when it ran.
    pub while_down: bool,
    /// When it ended (Unix nanoseconds), if it said its rows wait in a slot no pgoutbox
    /// streamed from: a slot drop after that takes them along, as it takes any WAL
    /// (docs/runbooks/replay.md), and the replay said to run it again then.
    pub left_in_slot_at: Option<i128>,
}

/// The violations found, by kind, each with what happened.
#[derive(Debug, Default)]
pub struct Verdict {
    /// By kind: how many, and what happened (a run of lost events is one example).
    pub violations: BTreeMap<&'static str, (usize, Vec<String>)>,
    pub stored: usize,
    pub dead_letters: usize,
    pub seeded: usize,
    pub replayed: usize,
    pub lost_with_slot: usize,
    pub maybe_stored: usize,
    /// Of the lost events, those whose id was never used before (issue 28: "rows with fresh
    /// ids among them").
    pub lost_fresh: usize,
    /// The lost events by the last fault that began before their commit.
    pub lost_after: BTreeMap<&'static str, usize>,
}

impl Verdict {
    pub fn add(&mut self, kind: &'static str, what: String) {
        self.add_many(kind, 1, what);
    }

    pub fn add_many(&mut self, kind: &'static str, count: usize, what: String) {
        let entry = self.violations.entry(kind).or_default();
        entry.0 += count;
        entry.1.push(what);
    }

    /// Adds `other`'s violations to these.
    pub fn absorb(&mut self, other: Verdict) {
        for (kind, (count, examples)) in other.violations {
            let entry = self.violations.entry(kind).or_default();
            entry.0 += count;
            entry.1.extend(examples);
        }
    }

    pub fn count(&self) -> usize {
        self.violations.values().map(|(count, _)| count).sum()
    }

    /// By kind, with the first few examples.
    pub fn summary(&self) -> String {
        let mut text = format!(
            "stream: {} messages ({} dead letters, {} seeded by a recovery, {} replayed); \
             {} maybe-events stored; {} events lost with the slot (allowed)\n",
            self.stored,
            self.dead_letters,
            self.seeded,
            self.replayed,
            self.maybe_stored,
            self.lost_with_slot
        );
        if self.violations.is_empty() {
            text.push_str("violations: none\n");
        }
        for (kind, (count, examples)) in &self.violations {
            let fresh = match *kind {
                "lost" => {
                    let after: Vec<String> =
                        self.lost_after.iter().map(|(f, n)| format!("{f}={n}")).collect();
                    let after = after.join(" ");
                    format!(
                        " ({} with fresh ids; by the last fault before: {after})",
                        self.lost_fresh
                    )
                }
                _ => String::new(),
            };
            text.push_str(&format!("violation {kind}: {count}{fresh}\n"));
            for example in examples.iter().take(8) {
                text.push_str(&format!("    {example}\n"));
            }
        }
        text
    }
}

/// The event a stored message carries: `n` in a message's payload, the row's
/// `aggregate_id` in a dead letter's body.
fn event_of(message: &Stored) -> Option<(u64, bool)> {
    let body: serde_json::Value = serde_json::from_slice(&message.payload).ok()?;
    if message.subject.ends_with("dead_letter") {
        let id = body["row"]["aggregate_id"].as_str()?;
        return Some((id.parse().ok()?, true));
    }
    Some((body["n"].as_u64()?, false))
}

/// Where an event came from, for the examples.
fn describe(event: Option<&Event>, max_id_before: &[i64]) -> String {
    match event {
        Some(e) => {
            let reused = max_id_before.get(e.epoch as usize).is_some_and(|max| e.id <= *max);
            let kind = if reused { "reused" } else { "fresh" };
            format!("id {} ({kind}), after truncate {}, committed at {:.1}s", e.id, e.epoch, e.at)
        }
        None => "never committed".to_owned(),
    }
}

/// `faults` are the nemesis's, as (seconds from the start, kind), in order: a lost event is
/// told with the last fault that began before its commit. An event missing from the stream
/// is lost with the slot when a truncate removed it from the table before a slot drop that
/// came while it was not in the stream yet (`drops`), or after the drop
/// (`Ledger::lost_with_slot_allowed`).
pub fn check(
    messages: &[Stored],
    ledger: &Ledger,
    replays: &[Replayed],
    faults: &[(f32, &'static str)],
    drops: &[SlotDrop],
) -> Verdict {
    // The highest live event the stream held at each drop (it holds them in commit order).
    let held_at_drop: Vec<(u64, u32)> = drops
        .iter()
        .map(|drop| {
            let through = messages
                .iter()
                .take_while(|m| m.stored_at_nanos < drop.at_nanos)
                .filter(|m| m.header("Pgoutbox-Replay").is_none() && !is_tenants(m))
                .filter_map(|m| event_of(m).map(|(n, _)| n))
                .max()
                .unwrap_or(0);
            (through, drop.epoch)
        })
        .collect();
    let gone_with_a_drop =
        |e: &Event| held_at_drop.iter().any(|&(through, epoch)| e.n > through && e.epoch < epoch);
    let stored = messages.iter().filter(|m| !is_tenants(m)).count();
    let mut verdict = Verdict { stored, ..Verdict::default() };
    let committed: HashMap<u64, &Event> = ledger.committed.iter().map(|e| (e.n, e)).collect();
    let maybe: HashMap<u64, &Event> = ledger.maybe.iter().map(|e| (e.n, e)).collect();
    // The highest id used before each epoch: an id at or below it is a reused one.
    let epochs = ledger.committed.iter().chain(&ledger.maybe).map(|e| e.epoch).max().unwrap_or(0);
    let mut max_id_before = vec![0i64; epochs as usize + 1];
    for e in ledger.committed.iter().chain(&ledger.maybe) {
        for max in max_id_before.iter_mut().skip(e.epoch as usize + 1) {
            *max = (*max).max(e.id);
        }
    }
    let known = |n: u64| describe(committed.get(&n).or(maybe.get(&n)).copied(), &max_id_before);

    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut by_replay: HashMap<&str, HashMap<u64, usize>> = HashMap::new();
    let mut highest: Option<(u64, usize)> = None;
    for (seq, message) in messages.iter().enumerate() {
        let seq = seq + 1;
        if is_tenants(message) {
            continue;
        }
        let Some((n, dead)) = event_of(message) else {
            verdict.add("unreadable", format!("stream seq {seq}: subject {}", message.subject));
            continue;
        };
        verdict.dead_letters += usize::from(dead);
        if let Some(replay) = message.header("Pgoutbox-Replay") {
            verdict.replayed += 1;
            *by_replay.entry(replay).or_default().entry(n).or_default() += 1;
            continue;
        }
        verdict.seeded += usize::from(message.header("Pgoutbox-Seed").is_some());
        let seen = live.entry(n).or_default();
        *seen += 1;
        if *seen > 1 {
            let how = match message.header("Pgoutbox-Seed") {
                Some(_) => "seeded by a recovery",
                None => "streamed",
            };
            verdict.add(
                "duplicate",
                format!("event {n} stored again at seq {seq} ({how}): {}", known(n)),
            );
            continue;
        }
        if !committed.contains_key(&n) && !maybe.contains_key(&n) {
            verdict.add("never committed", format!("event {n} at seq {seq}"));
        }
        match highest {
            Some((top, at)) if n < top => verdict.add(
                "out of order",
                format!("event {n} ({}) at seq {seq}, after event {top} at seq {at}", known(n)),
            ),
            _ => highest = Some((n, seq)),
        }
    }
    let mut lost = Vec::new();
    for e in &ledger.committed {
        if live.contains_key(&e.n) {
            continue;
        }
        if ledger.lost_with_slot_allowed.contains(&e.n) || gone_with_a_drop(e) {
            verdict.lost_with_slot += 1;
        } else {
            lost.push(e.n);
            let reused = max_id_before.get(e.epoch as usize).is_some_and(|max| e.id <= *max);
            verdict.lost_fresh += usize::from(!reused);
        }
    }
    let fault_before = |n: u64| {
        let at = committed.get(&n).map_or(0.0, |e| e.at);
        match faults.iter().rev().find(|(start, _)| *start <= at) {
            Some((start, kind)) => (*kind, format!("{kind} at {start:.1}s")),
            None => ("none", "no fault yet".to_owned()),
        }
    };
    for run in runs(&lost) {
        let (first, last) = (run[0], run[run.len() - 1]);
        for n in &run {
            *verdict.lost_after.entry(fault_before(*n).0).or_default() += 1;
        }
        let what = match first == last {
            true => format!("event {first}: {}", known(first)),
            false => format!(
                "events {first}..={last} ({} events; first {}, last {})",
                run.len(),
                known(first),
                known(last)
            ),
        };
        let what = format!("{what}; last fault before: {}", fault_before(first).1);
        verdict.add_many("lost", run.len(), what);
    }
    verdict.maybe_stored = ledger.maybe.iter().filter(|e| live.contains_key(&e.n)).count();

    let empty = HashMap::new();
    for replay in replays {
        let seen = by_replay.get(replay.id.as_str()).unwrap_or(&empty);
        let asked: HashSet<u64> = replay.events.iter().copied().collect();
        let down = if replay.while_down { " (pgoutbox down)" } else { "" };
        let dropped_after = |at: i128| drops.iter().any(|drop| drop.at_nanos > at);
        for n in &asked {
            match seen.get(n).copied().unwrap_or(0) {
                0 if replay.left_in_slot_at.is_some_and(dropped_after) => {
                    verdict.lost_with_slot += 1;
                }
                0 if !replay.unfinished => verdict.add(
                    "replay lost",
                    format!("replay {}{down}: event {n} not stored", replay.id),
                ),
                0 | 1 => {}
                k => verdict.add(
                    "replay doubled",
                    format!("replay {}{down}: event {n} stored {k} times", replay.id),
                ),
            }
        }
        for n in seen.keys().filter(|n| !asked.contains(n)) {
            verdict.add("replay of a row not asked", format!("replay {}: event {n}", replay.id));
        }
    }
    for id in by_replay.keys().filter(|id| !replays.iter().any(|r| r.id == **id)) {
        verdict.add("unknown replay", format!("messages of replay {id}"));
    }
    verdict
}

/// Consecutive runs of event numbers (the writer's numbers, so a transaction is a run).
fn runs(numbers: &[u64]) -> Vec<Vec<u64>> {
    let mut runs: Vec<Vec<u64>> = Vec::new();
    for &n in numbers {
        match runs.last_mut() {
            Some(run) if run.last().is_some_and(|last| last + 1 == n) => run.push(n),
            _ => runs.push(vec![n]),
        }
    }
    runs
}
