//! The consumer soak's writer and checker (`cases::consumer_soak`, issue 57): transactions of
//! numbered events over 41 aggregates, some too large for a message, some held for a few
//! seconds by a schedule; and the judgement of what the example consumer applied to its
//! own database: every event once, every transaction's part whole, every aggregate in
//! commit order.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Rng;
use super::check::Verdict;

pub const AGGREGATES: u64 = 41;

/// One event of a committed transaction.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub n: u64,
    pub aggregate: u64,
    /// Held by a schedule: delivered at its time, an event of its own.
    pub scheduled: bool,
}

/// What the writer committed, and what it may have (its commit's answer was lost).
#[derive(Debug, Default)]
pub struct Ledger {
    pub committed: Vec<Vec<Written>>,
    pub maybe: Vec<Vec<Written>>,
    pub failed: u64,
}

impl Ledger {
    /// Every event committed or maybe committed, in commit order: the writer numbers its
    /// events as it goes and commits one transaction at a time.
    pub fn in_commit_order(&self) -> Vec<Written> {
        let mut all: Vec<Written> =
            self.committed.iter().chain(&self.maybe).flatten().copied().collect();
        all.sort_by_key(|w| w.n);
        all
    }
}

pub struct ConsumerWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Ledger>,
}

impl ConsumerWriter {
    /// Commits transactions of 1-6 events into `outbox` until stopped, reconnecting after
    /// any error. One event in 37 is large (70 KB), one in 29 scheduled 1-4 s ahead when
    /// `schedules`.
    pub fn start(url: String, mut rng: Rng, schedules: bool) -> ConsumerWriter {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let (mut ledger, mut n) = (Ledger::default(), 0u64);
            while !stopped.load(Ordering::Relaxed) {
                let Ok((mut db, connection)) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                tokio::spawn(connection);
                while !stopped.load(Ordering::Relaxed) {
                    let events: Vec<Written> = (0..rng.between(1, 6))
                        .map(|_| {
                            n += 1;
                            let aggregate = rng.between(0, AGGREGATES - 1);
                            Written { n, aggregate, scheduled: schedules && rng.chance(1.0 / 29.0) }
                        })
                        .collect();
                    let large: Vec<bool> = events.iter().map(|_| rng.chance(1.0 / 37.0)).collect();
                    match commit(&mut db, &events, &large, &mut rng).await {
                        Ok(()) => ledger.committed.push(events),
                        Err(Outcome::Maybe) => ledger.maybe.push(events),
                        Err(Outcome::Failed) => ledger.failed += 1,
                    }
                    if db.is_closed() {
                        break;
                    }
                    tokio::time::sleep(rng.millis(2, 20)).await;
                }
            }
            ledger
        });
        ConsumerWriter { stop, task }
    }

    pub async fn finish(self) -> Ledger {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the writer")
    }
}

enum Outcome {
    /// The commit's answer was lost: committed or not.
    Maybe,
    Failed,
}

async fn commit(
    db: &mut tokio_postgres::Client,
    events: &[Written],
    large: &[bool],
    rng: &mut Rng,
) -> Result<(), Outcome> {
    let tx = db.transaction().await.map_err(|_| Outcome::Failed)?;
    for (event, large) in events.iter().zip(large) {
        let pad = if *large { 70_000 } else { 0 };
        let at = match event.scheduled {
            true => format!("now() + interval '{} ms'", rng.between(1_000, 4_000)),
            false => "NULL".to_owned(),
        };
        let sql = format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, deliver_at) \
             VALUES ('order', 'a{}', 'placed', jsonb_build_object('n', {}, 'pad', \
             repeat('x', {pad})), {at})",
            event.aggregate, event.n
        );
        tx.batch_execute(&sql).await.map_err(|_| Outcome::Failed)?;
    }
    tx.commit().await.map_err(|_| Outcome::Maybe)
}

/// One event as the consumer applied it.
#[derive(Debug)]
pub struct Applied {
    pub n: u64,
    /// The consumer's database transaction that applied it.
    pub applied_in: u64,
    pub order: u64,
    pub partition: String,
    /// Its transaction as the consumer names it: the commit LSN, `seed:<id>` when seeded.
    pub transaction: String,
    /// Its event id, and the stream sequence it was applied from.
    pub id: String,
    pub sequence: u64,
}

/// The query [`Applied`] rows are read with, `|`-separated.
pub const APPLIED: &str = "SELECT (convert_from(payload, 'UTF8')::json->>'n'), applied_in, \
    applied_order, split_part(subject, '.', 2), transaction, id, stream_sequence \
    FROM consumer_events";

pub fn parse_applied(rows: &str) -> Vec<Applied> {
    rows.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split('|').collect();
            Some(Applied {
                n: f.first()?.trim().parse().ok()?,
                applied_in: f.get(1)?.trim().parse().ok()?,
                order: f.get(2)?.trim().parse().ok()?,
                partition: f.get(3)?.trim().to_owned(),
                transaction: f.get(4)?.trim().to_owned(),
                id: f.get(5)?.trim().to_owned(),
                sequence: f.get(6)?.trim().parse().ok()?,
            })
        })
        .collect()
}

/// Holds what the consumer applied against what was committed. `by_partition`: a
/// transaction's part on each partition is applied whole (one process per partition);
/// else the whole transaction is. A seeded row, and by partition a scheduled row's delivery,
/// is exempt from wholeness (the contract: each is a transaction of its own).
pub fn judge(applied: &[Applied], ledger: &Ledger, by_partition: bool) -> Verdict {
    let mut verdict = Verdict::default();
    let mut by_n: HashMap<u64, &Applied> = HashMap::new();
    for event in applied {
        if let Some(before) = by_n.insert(event.n, event) {
            let how = |e: &Applied| format!("{} as {} from {}", e.id, e.transaction, e.sequence);
            let what = format!("event {}: {} and {}", event.n, how(before), how(event));
            verdict.add("applied twice", what);
        }
    }
    let committed: BTreeSet<u64> = ledger.committed.iter().flatten().map(|w| w.n).collect();
    let maybe: BTreeSet<u64> = ledger.maybe.iter().flatten().map(|w| w.n).collect();
    for n in &committed {
        if !by_n.contains_key(n) {
            verdict.add("committed, never applied", format!("event {n}"));
        }
    }
    for n in by_n.keys() {
        if !committed.contains(n) && !maybe.contains(n) {
            verdict.add("applied, never committed", format!("event {n}"));
        }
    }
    let mut sizes: BTreeMap<u64, usize> = BTreeMap::new();
    for event in applied {
        *sizes.entry(event.applied_in).or_default() += 1;
    }
    for transaction in ledger.committed.iter().chain(&ledger.maybe) {
        let mut parts: BTreeMap<&str, Vec<&Applied>> = BTreeMap::new();
        for written in transaction {
            let Some(event) = by_n.get(&written.n) else { continue };
            // One process per partition applies a delivery alone, at its time; one for all
            // holds its transaction for it.
            let alone =
                event.transaction.starts_with("seed:") || (by_partition && written.scheduled);
            if !alone {
                let part = if by_partition { event.partition.as_str() } else { "" };
                parts.entry(part).or_default().push(event);
            }
        }
        for (partition, part) in parts {
            let applied_in = part[0].applied_in;
            let together = part.iter().all(|e| e.applied_in == applied_in);
            if !together || sizes[&applied_in] != part.len() {
                let how: Vec<String> = part
                    .iter()
                    .map(|e| format!("{} in {} as {}", e.n, e.applied_in, e.transaction))
                    .collect();
                let with = sizes[&applied_in];
                verdict.add("transaction not whole", format!("on {partition:?}: {how:?} ({with})"));
            }
        }
    }
    // The writer commits one transaction at a time: its ledger is commit order, a commit
    // whose answer was lost in its place among the others.
    let mut last: HashMap<u64, &Applied> = HashMap::new();
    for written in ledger.in_commit_order() {
        let Some(event) = by_n.get(&written.n).filter(|_| !written.scheduled) else { continue };
        if let Some(before) = last.get(&written.aggregate)
            && before.order > event.order
        {
            let how = |e: &Applied| {
                format!("{} (as {} in {} from {})", e.n, e.transaction, e.applied_in, e.sequence)
            };
            let what = format!(
                "a{}: event {} applied before {}",
                written.aggregate,
                how(event),
                how(before)
            );
            verdict.add("aggregate out of commit order", what);
        }
        last.insert(written.aggregate, event);
    }
    verdict
}
