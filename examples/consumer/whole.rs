//! All partitions in one process: one ordered reader per partition and one for the dead
//! letters; a transaction is applied once all its events arrived (its last says how many)
//! and it is the oldest waiting on every partition it touches.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
use async_nats::jetstream::{self, stream::Stream};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::Error;
use crate::message::{Event, Malformed, event, fetched};
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
    // One lane per partition, and one for the dead letters.
    let lanes: Vec<String> = (0..partitions)
        .map(|p| format!("{root}.{p}.*.*"))
        .chain([format!("{root}.dead_letter")])
        .collect();
    let (arrived, mut arrivals) = mpsc::channel(10_000);
    for (lane, filter) in lanes.iter().enumerate() {
        let from = resume_point(db, &stream, lane).await?;
        let lane_of = (stream.clone(), lane, filter.clone(), from);
        tokio::spawn(read_lane(lane_of, arrived.clone()));
    }
    drop(arrived);
    println!("consumer: reading {} partitions and the dead letters", partitions);
    let mut waiting = Waiting::new(lanes.len());
    let mut check = tokio::time::interval(Duration::from_secs(1));
    loop {
        let event = tokio::select! {
            event = arrivals.recv() => event,
            _ = check.tick() => {
                waiting.report_stuck(report_after);
                continue;
            }
        };
        let Some(event) = event else { return Ok(()) };
        let event = match event {
            Ok(event) => event,
            Err(Malformed::Skipped(why)) => {
                eprintln!("consumer: a message skipped: {why}");
                continue;
            }
            Err(Malformed::Fatal(err)) => return Err(err),
        };
        // Read again after a rewind: applied before, it is nothing.
        if !waiting.knows(&event.transaction) && applied_before(db, &event.transaction).await? {
            continue;
        }
        let event = fetched(js, event).await?;
        for transaction in waiting.add(event) {
            apply(db, transaction).await?;
        }
    }
}

/// Reads one lane in stream order, from `from`, and hands each event over.
async fn read_lane(
    (stream, lane, filter, from): (Stream, usize, String, DeliverPolicy),
    arrived: mpsc::Sender<Result<Event, Malformed>>,
) {
    let config =
        OrderedConfig { filter_subject: filter, deliver_policy: from, ..Default::default() };
    let messages = match stream.create_consumer(config).await {
        Ok(consumer) => consumer.messages().await.map_err(Error::from),
        Err(err) => Err(Error::from(err)),
    };
    let mut messages = match messages {
        Ok(messages) => messages,
        Err(err) => return drop(arrived.send(Err(Malformed::Fatal(err))).await),
    };
    while let Some(message) = messages.next().await {
        let event = match message {
            Ok(message) => event(lane, &message),
            Err(err) => Err(Malformed::Fatal(Error::from(err))),
        };
        if arrived.send(event).await.is_err() {
            return;
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
    rows: Option<usize>,
    /// When its first event arrived, and whether it was said to wait too long.
    since: Option<Instant>,
    reported: bool,
}

impl Transaction {
    fn is_whole(&self) -> bool {
        self.rows == Some(self.events.len())
    }
}

impl Waiting {
    fn new(lanes: usize) -> Waiting {
        Waiting { transactions: HashMap::new(), lanes: vec![VecDeque::new(); lanes] }
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
            self.cut_before_seed(event.lane);
        }
        let transaction = self.transactions.entry(event.transaction.clone()).or_default();
        transaction.rows = transaction.rows.or(event.rows);
        transaction.since.get_or_insert_with(Instant::now);
        transaction.events.insert(event.index, event);
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

    /// A seed's row arrived on `lane`: a transaction waiting there for its last event will
    /// never get it (the slot was lost and the seed brings its rest, each row alone). It is
    /// taken as whole as it is, and said.
    fn cut_before_seed(&mut self, lane: usize) {
        for name in &self.lanes[lane] {
            if let Some(transaction) = self.transactions.get_mut(name)
                && !transaction.is_whole()
                && !name.starts_with("seed:")
            {
                eprintln!(
                    "consumer: transaction {name} has {} events and no last (its slot was \
                     lost?): applied as it is",
                    transaction.events.len()
                );
                transaction.rows = Some(transaction.events.len());
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

/// Applies a whole transaction, once, with how far its lanes are now applied.
async fn apply(db: &mut tokio_postgres::Client, transaction: Transaction) -> Result<(), Error> {
    let Some(first) = transaction.events.values().next() else { return Ok(()) };
    let name = first.transaction.clone();
    let mut through: BTreeMap<usize, (u64, i64)> = BTreeMap::new();
    for event in transaction.events.values() {
        let lane = through.entry(event.lane).or_default();
        *lane = (*lane).max((event.sequence, event.stored_at));
    }
    let events: Vec<Event> = transaction.events.into_values().collect();
    record(db, &name, &events, through).await?;
    Ok(())
}
