//! All partitions in one process: one ordered reader of the whole stream, each event put
//! on its partition's lane (the dead letters on a lane of their own); a transaction is
//! applied once all its events arrived (its last says how many) and it is the oldest
//! waiting on every lane it touches. Read in stream order, every event stored before a
//! seeded row has arrived when the seeded row does: the transactions still waiting then
//! without their last event were cut by a lost slot.
//!
//! A scheduled row is told by its headers first (docs/reference/message.md): its schedule
//! (`Nats-Schedule`, on `schedules.<stream>.…`, in its transaction's place) counts in its
//! transaction and is never applied; its delivery (`Nats-Scheduler`, stored at its time) is
//! an event of its own, applied alone, never added to the transaction whose marks it copies.
//! The schedule is removed once delivered: a reader that comes to its place after that
//! counts the row by its delivery instead, whose copied position names it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::{self, stream::Stream};
use futures_util::StreamExt;

use crate::Error;
use crate::message::{Event, event, fetched};
use crate::store::{applied_before, record, resume_point};

/// Reads `partitions` partitions under `root`, and `<root>.dead_letter`, applying each
/// transaction whole, in order; says which transaction waited `report_after` for the rest
/// of its events.
pub async fn consume(
    db: &mut tokio_postgres::Client,
    js: &jetstream::Context,
    stream: Stream,
    (root, partitions, report_after): (&str, usize, Duration),
) -> Result<(), Error> {
    // The reader's progress is kept as a lane of its own, after the partitions' and the
    // dead letters'.
    let reader = partitions + 1;
    // The whole stream: the events, the dead letters and the schedules (on their own
    // subjects, `schedules.<stream>.…`), which count in their transactions.
    let config = OrderedConfig {
        deliver_policy: resume_point(db, &stream, reader).await?,
        ..Default::default()
    };
    let mut messages = stream.create_consumer(config).await?.messages().await?;
    println!("consumer: reading {partitions} partitions and the dead letters");
    let mut waiting = Waiting::new(partitions + 1);
    let mut read = ReadThrough::default();
    let mut check = tokio::time::interval(Duration::from_secs(1));
    loop {
        let message = tokio::select! {
            message = messages.next() => message,
            _ = check.tick() => {
                waiting.report_stuck(report_after);
                continue;
            }
        };
        let Some(message) = message else { return Ok(()) };
        let message = message?;
        let info = message.info()?;
        read.read(info.stream_sequence, info.published.unix_timestamp_nanos() as i64);
        // What the message is, by one check in message.md's order: a schedule and a
        // delivery before the marks they carry copies of.
        let has = |name| message.headers.as_ref().is_some_and(|h| h.get(name).is_some());
        let (schedule, delivery) = (has("Nats-Schedule"), has("Nats-Scheduler"));
        let target = message.headers.as_ref().and_then(|h| h.get("Nats-Schedule-Target"));
        // A schedule is on its own subject: its lane is the event's, which it targets.
        let subject = target.filter(|_| schedule).map_or(message.subject.as_str(), |t| t.as_str());
        // The transactions' ends and anything else outside the lanes: read past.
        let Some(lane) = lane_of(subject, root, partitions) else { continue };
        let event = match event(lane, &message) {
            Ok(event) => event,
            Err(why) => {
                eprintln!("consumer: a message skipped: {why}");
                continue;
            }
        };
        if schedule || delivery {
            // The row counts in its transaction by its schedule, or by its delivery when the
            // schedule was removed before this reader came to it; never applied with it.
            let name = &event.transaction;
            if !name.starts_with("seed:")
                && (waiting.knows(name) || !applied_before(db, name).await?)
            {
                read.waits();
                for transaction in waiting.count_scheduled(&event) {
                    let through = read.safe(&transaction, waiting.oldest_sequence());
                    apply(db, transaction, through.map(|at| (reader, at))).await?;
                }
            }
            if delivery {
                // An event of its own, by its event id.
                let name = format!("delivery:{}", event.id);
                if !applied_before(db, &name).await? {
                    let event =
                        fetched(js, Event { transaction: name, rows: Some(1), ..event }).await?;
                    let alone =
                        Transaction { events: [(event.index, event)].into(), ..Default::default() };
                    let through = read.safe(&alone, waiting.oldest_sequence());
                    apply(db, alone, through.map(|at| (reader, at))).await?;
                }
            }
            continue;
        }
        // Read again after a rewind: applied before, it is nothing.
        if !waiting.knows(&event.transaction) && applied_before(db, &event.transaction).await? {
            continue;
        }
        let event = fetched(js, event).await?;
        read.waits();
        for transaction in waiting.add(event) {
            let through = read.safe(&transaction, waiting.oldest_sequence());
            apply(db, transaction, through.map(|at| (reader, at))).await?;
        }
    }
}

/// The lane of a message on `subject`: `<root>.<p>.<type>.<event>` is partition `p`'s,
/// `<root>.dead_letter` the last; `None` for any other (the transactions' ends).
fn lane_of(subject: &str, root: &str, partitions: usize) -> Option<usize> {
    let rest = subject.strip_prefix(root)?.strip_prefix('.')?;
    if rest == "dead_letter" {
        return Some(partitions);
    }
    let tokens: Vec<&str> = rest.split('.').collect();
    let partition: usize = tokens.first()?.parse().ok()?;
    (tokens.len() == 3 && partition < partitions).then_some(partition)
}

/// How far the reader may resume from: after the last message read, or, while events
/// wait, after the message read just before the oldest of them.
#[derive(Default)]
struct ReadThrough {
    /// The last message read and the one before it: stream sequence, when stored.
    last: Option<(u64, i64)>,
    previous: Option<(u64, i64)>,
    /// For each event waiting, by its sequence: the message read just before it.
    before: HashMap<u64, (u64, i64)>,
}

impl ReadThrough {
    fn read(&mut self, sequence: u64, stored_at: i64) {
        self.previous = self.last.replace((sequence, stored_at));
    }

    /// The message just read is an event that waits (for the rest of its transaction).
    fn waits(&mut self) {
        if let (Some((sequence, _)), Some(previous)) = (self.last, self.previous) {
            self.before.insert(sequence, previous);
        }
    }

    /// Where the reader may resume after, once `transaction` is applied, given the oldest
    /// event still waiting.
    fn safe(
        &mut self,
        transaction: &Transaction,
        oldest_waiting: Option<u64>,
    ) -> Option<(u64, i64)> {
        let events = transaction.events.values().map(|event| &event.sequence);
        for sequence in events.chain(transaction.scheduled.values()) {
            self.before.remove(sequence);
        }
        match oldest_waiting {
            Some(oldest) => self.before.get(&oldest).copied(),
            None => self.last,
        }
    }
}

/// The transactions read in part or in whole and not yet applied.
struct Waiting {
    transactions: HashMap<String, Transaction>,
    /// Each lane's transactions, in the order the lane read them (commit order).
    lanes: Vec<VecDeque<String>>,
}

#[derive(Default)]
struct Transaction {
    /// By their index in the transaction.
    events: BTreeMap<u32, Event>,
    /// Its scheduled rows, counted, not applied with it: by index, the stream sequence of
    /// the schedule (or delivery) they were counted by.
    scheduled: BTreeMap<u32, u64>,
    rows: Option<usize>,
    /// When its first event arrived, and whether it was said to wait too long.
    since: Option<Instant>,
    reported: bool,
}

impl Transaction {
    fn is_whole(&self) -> bool {
        self.rows == Some(self.events.len() + self.scheduled.len())
    }
}

impl Waiting {
    fn new(lanes: usize) -> Waiting {
        Waiting { transactions: HashMap::new(), lanes: vec![VecDeque::new(); lanes] }
    }

    /// The stream sequence of the oldest event still waiting, if any.
    fn oldest_sequence(&self) -> Option<u64> {
        let transactions = self.transactions.values();
        let events = transactions.flat_map(|t| t.events.values().map(|event| &event.sequence));
        let scheduled = self.transactions.values().flat_map(|t| t.scheduled.values());
        events.chain(scheduled).min().copied()
    }

    /// Whether events of the transaction `name` are waiting.
    fn knows(&self, name: &str) -> bool {
        self.transactions.contains_key(name)
    }

    /// Takes `event`; returns the transactions that may be applied now, in order.
    fn add(&mut self, event: Event) -> Vec<Transaction> {
        let lane = &mut self.lanes[event.lane];
        if lane.back() != Some(&event.transaction) {
            lane.push_back(event.transaction.clone());
        }
        if event.transaction.starts_with("seed:") {
            self.cut_before_seed();
        }
        let transaction = self.transactions.entry(event.transaction.clone()).or_default();
        transaction.rows = transaction.rows.or(event.rows);
        transaction.since.get_or_insert_with(Instant::now);
        transaction.events.insert(event.index, event);
        self.ready()
    }

    /// Counts a scheduled row (its schedule, or its delivery) in its transaction, by the
    /// position the schedule has and the delivery copies; returns the transactions that
    /// may be applied now, in order.
    fn count_scheduled(&mut self, row: &Event) -> Vec<Transaction> {
        let transaction = self.transactions.entry(row.transaction.clone()).or_default();
        transaction.rows = transaction.rows.or(row.rows);
        transaction.since.get_or_insert_with(Instant::now);
        transaction.scheduled.entry(row.index).or_insert(row.sequence);
        if transaction.events.is_empty() && transaction.is_whole() {
            // Every row of it scheduled: nothing to apply with it.
            self.transactions.remove(&row.transaction);
        }
        self.ready()
    }

    /// The whole transactions that are the oldest waiting on every lane they touch, taken
    /// out in order.
    fn ready(&mut self) -> Vec<Transaction> {
        let mut ready = Vec::new();
        while let Some(next) = self.next_ready() {
            for lane in &mut self.lanes {
                if lane.front() == Some(&next) {
                    lane.pop_front();
                }
            }
            ready.extend(self.transactions.remove(&next));
        }
        ready
    }

    /// A seed's row arrived: every event stored before it arrived before it, so a
    /// transaction still waiting for its last event will never get it (the slot was lost and
    /// the seed brings its rest, each row alone). It is taken as whole as it is, and said.
    /// One whose last arrived and says more events waits on: for a scheduled row's delivery.
    fn cut_before_seed(&mut self) {
        for (name, transaction) in &mut self.transactions {
            if transaction.rows.is_none() && !name.starts_with("seed:") {
                eprintln!(
                    "consumer: transaction {name} has {} events and no last (its slot was \
                     lost?): applied as it is",
                    transaction.events.len()
                );
                transaction.rows = Some(transaction.events.len() + transaction.scheduled.len());
            }
        }
    }

    /// Says, once for each, which transaction first on a lane waited `after` for the rest
    /// of its events: the marks cannot tell a message still to come from one removed before
    /// it was read (a TTL, the stream's limits), which holds its lanes for good.
    fn report_stuck(&mut self, after: Duration) {
        for name in self.lanes.iter().filter_map(VecDeque::front) {
            let Some(transaction) = self.transactions.get_mut(name) else { continue };
            let waited = transaction.since.is_some_and(|since| since.elapsed() >= after);
            if transaction.reported || transaction.is_whole() || !waited {
                continue;
            }
            transaction.reported = true;
            let rows = transaction.rows.map_or("?".to_owned(), |rows| rows.to_string());
            eprintln!(
                "consumer: transaction {name} has {} of {rows} events after {after:?}: still \
                 waiting; a message removed before it was read (a TTL, the stream's limits) \
                 never comes: read one partition per process with the transactions' ends \
                 (PARTITION), which applies such a part as it is",
                transaction.events.len()
            );
        }
    }

    /// A whole transaction that is the oldest waiting on every lane it touches.
    fn next_ready(&self) -> Option<String> {
        self.lanes.iter().filter_map(VecDeque::front).find_map(|name| {
            let transaction = self.transactions.get(name)?;
            let first_everywhere = transaction
                .events
                .values()
                .all(|event| self.lanes[event.lane].front() == Some(name));
            (transaction.is_whole() && first_everywhere).then(|| name.clone())
        })
    }
}

/// Applies a whole transaction, once, with how far the reader may now resume from
/// (`through`: its lane, and the sequence and stored time of the message to resume after).
async fn apply(
    db: &mut tokio_postgres::Client,
    transaction: Transaction,
    through: Option<(usize, (u64, i64))>,
) -> Result<(), Error> {
    let Some(first) = transaction.events.values().next() else { return Ok(()) };
    let name = first.transaction.clone();
    let events: Vec<Event> = transaction.events.into_values().collect();
    record(db, &name, &events, through.into_iter().collect()).await?;
    Ok(())
}
