//! A consumer of pgoutbox's stream that applies events to its own database, as a service
//! would: `cargo run --example consumer`. What it shows:
//!
//! - **Parallel, each key in order.** pgoutbox runs with `--partitions N --subject-template
//!   'outbox.{$partition}.{aggregate_type}.{event_type}'`; one reader per partition reads
//!   `outbox.<p>.*.*` in stream order, so each aggregate's events arrive in commit order.
//! - **Whole transactions.** `Pgoutbox-Position` (`<commit LSN>:<index>`) names an event's
//!   transaction; its last event says `Pgoutbox-Transaction-Last: true` and how many events
//!   the transaction has (`Pgoutbox-Transaction-Rows`). A transaction is applied in one
//!   transaction of the consumer's database once all its events arrived and it is the
//!   oldest waiting on every partition it touches. Dead letters are read too: they count.
//! - **Or one process per partition.** With `PARTITION=<p>`, the process reads partition
//!   `p` alone, with the transactions' ends (pgoutbox's `--transaction-subject`, read from
//!   `TRANSACTION_SUBJECT`, `<root>.transactions` by default) in one ordered consumer: a
//!   transaction's part on `p` is the events of its commit LSN before its end, and the end
//!   says how many (`partitions[p]`). Each part is applied in one transaction when its end
//!   arrives; a part short of its count (a message removed before it was read) is reported
//!   and applied as it is. Dead letters are counted by the end, not read: a reader of the
//!   dead-letter subject of its own handles them. A scheduled row's delivery and a seeded
//!   row are each applied alone, when they arrive.
//! - **Payloads of any size.** A payload pgoutbox stored in the Object Store
//!   (`--object-store`) arrives as a pointer (`Pgoutbox-Object-Bucket`, `-Name`, `-Size`,
//!   `-Sha256`) with no payload: the object is fetched and checked against its digest.
//! - **Once, through any crash.** The events, and how far each partition was applied, are
//!   written in that same transaction; a restart (kill -9 included) reads each partition
//!   again after the last sequence applied, and an event id (the primary key) or a
//!   transaction applied before turns whatever is read twice into nothing. The event id is
//!   `Pgoutbox-Event-Id` where a message has it (a scheduled row's delivery, which
//!   nats-server sends without `Nats-Msg-Id`), else `Nats-Msg-Id` without the
//!   `replay:<replay id>/<n>:` a `pgoutbox replay` puts before it: a replayed row is the
//!   same event. A seeded row (`--recover`, `--backfill`: no transaction marks) is a
//!   transaction of its own, named by its id, since every seed numbers its positions from
//!   `0/0:0`.
//! - **Any payload.** Stored as bytes (`bytea` payloads are not text); a message pgoutbox's
//!   headers do not describe is reported on stderr and skipped; a payload that cannot be
//!   fetched stops the consumer, whose restart reads it again.
//!
//! Settings: `NATS_URL`, `PGOUTBOX_STREAM` (OUTBOX), `PARTITIONS` (4) or `PARTITION`, `SUBJECT_ROOT`
//! (`outbox`: the template's first token, and `<root>.dead_letter` the dead letters'), and
//! `CONSUMER_DATABASE_URL`, a libpq connection string for the consumer's own database.

use std::collections::{BTreeMap, HashMap, VecDeque};

use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
use async_nats::jetstream::{self, stream::Stream};
use futures_util::StreamExt;
use sha2::Digest;
use tokio::sync::mpsc;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The consumer's tables: what it applied, and how far it read each lane.
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS consumer_events (
        id text PRIMARY KEY, -- the event id (see above)
        transaction text NOT NULL,
        index int NOT NULL,
        subject text NOT NULL,
        payload bytea NOT NULL,
        stream_sequence bigint NOT NULL,
        applied_in bigint NOT NULL DEFAULT txid_current(),
        applied_order bigserial);
    CREATE TABLE IF NOT EXISTS consumer_transactions (transaction text PRIMARY KEY);
    CREATE TABLE IF NOT EXISTS consumer_lanes (lane int PRIMARY KEY, applied_through bigint);
    -- When the stream stored the message at applied_through (ns): whether it still does.
    ALTER TABLE consumer_lanes ADD COLUMN IF NOT EXISTS applied_at bigint;";

/// How far back a lane reads again when the stream no longer holds the last message it
/// applied: pgoutbox's durability horizon (150 s by default) and nats-server's sync
/// interval (2 min), with room.
const REWIND: std::time::Duration = std::time::Duration::from_secs(300);

/// One event, as a lane's reader hands it over.
struct Event {
    lane: usize,
    sequence: u64,
    /// When the stream stored it, in nanoseconds since the epoch.
    stored_at: i64,
    id: String,
    /// The commit LSN of its transaction (or, for an event outside any, its position).
    transaction: String,
    index: u32,
    /// On the transaction's last event: how many events it has.
    rows: Option<usize>,
    subject: String,
    payload: Vec<u8>,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let setting = |name, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let nats_url = setting("NATS_URL", "nats://127.0.0.1:4222");
    let partitions: usize = setting("PARTITIONS", "4").parse()?;
    let database = setting("CONSUMER_DATABASE_URL", "host=127.0.0.1 user=postgres");
    let (mut db, connection) = tokio_postgres::connect(&database, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            eprintln!("consumer: the database connection ended: {err}");
            std::process::exit(1);
        }
    });
    // One process per partition may start at once: one of them makes the tables.
    db.batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock(5481); {SCHEMA} COMMIT;"))
        .await?;
    // A server that went away may come back without its unsynced tail: start again from the
    // database, which then finds out (`resume_point`).
    let client = async_nats::ConnectOptions::new()
        .event_callback(|event| async move {
            if matches!(event, async_nats::Event::Disconnected) {
                eprintln!("consumer: NATS disconnected: exiting, to resume from the database");
                std::process::exit(75);
            }
        })
        .connect(&nats_url)
        .await?;
    let version = client.server_info().version;
    let js = jetstream::new(client);
    let stream = js.get_stream(setting("PGOUTBOX_STREAM", "OUTBOX")).await?;
    let root = setting("SUBJECT_ROOT", "outbox");
    if let Ok(partition) = std::env::var("PARTITION") {
        // Before 2.10 the server ignores a consumer's several filter subjects: it would
        // read every partition.
        let release: Vec<u32> = version.split('.').take(2).filter_map(|n| n.parse().ok()).collect();
        if release < vec![2, 10] {
            return Err(
                format!("PARTITION needs nats-server 2.10 or later (it is {version})").into()
            );
        }
        let ends = setting("TRANSACTION_SUBJECT", &format!("{root}.transactions"));
        let lane = partition.parse()?;
        println!("consumer: reading partition {lane} and the transactions' ends on {ends}");
        let filters = vec![format!("{root}.{lane}.*.*"), ends.clone()];
        return consume_partition(&mut db, &js, (stream, lane, filters), &ends).await;
    }

    // One lane per partition, and one for the dead letters.
    let lanes: Vec<String> = (0..partitions)
        .map(|p| format!("{root}.{p}.*.*"))
        .chain([format!("{root}.dead_letter")])
        .collect();
    let (arrived, mut arrivals) = mpsc::channel(10_000);
    for (lane, filter) in lanes.iter().enumerate() {
        let from = resume_point(&db, &stream, lane).await?;
        let lane_of = (stream.clone(), lane, filter.clone(), from);
        tokio::spawn(read_lane(js.clone(), lane_of, arrived.clone()));
    }
    drop(arrived);
    println!("consumer: reading {} partitions and the dead letters", partitions);
    let mut waiting = Waiting::new(lanes.len());
    while let Some(event) = arrivals.recv().await {
        let event = match event {
            Ok(event) => event,
            Err(Malformed::Skipped(why)) => {
                eprintln!("consumer: a message skipped: {why}");
                continue;
            }
            Err(Malformed::Fatal(err)) => return Err(err),
        };
        // Read again after a rewind: applied before, it is nothing.
        if !waiting.knows(&event.transaction) && applied_before(&db, &event.transaction).await? {
            continue;
        }
        for transaction in waiting.add(event) {
            apply(&mut db, transaction).await?;
        }
    }
    Ok(())
}

/// Partition `lane` alone, read with the transactions' ends (`filters`) in stream order:
/// the events of a transaction on it are those before its end, applied when it arrives.
async fn consume_partition(
    db: &mut tokio_postgres::Client,
    js: &jetstream::Context,
    (stream, lane, filters): (Stream, usize, Vec<String>),
    ends: &str,
) -> Result<(), Error> {
    let config = OrderedConfig {
        filter_subjects: filters,
        deliver_policy: resume_point(db, &stream, lane).await?,
        ..Default::default()
    };
    let mut messages = stream.create_consumer(config).await?.messages().await?;
    // The events of the transaction whose end is next: all of one commit LSN.
    let mut part: Vec<Event> = Vec::new();
    while let Some(message) = messages.next().await {
        let message = message?;
        let info = message.info()?;
        let at = (info.stream_sequence, info.published.unix_timestamp_nanos() as i64);
        if message.subject.as_str() == ends {
            let end: serde_json::Value = match serde_json::from_slice(&message.payload) {
                Ok(end) => end,
                Err(err) => {
                    eprintln!("consumer: an end skipped at {}: {err}", at.0);
                    continue;
                }
            };
            let commit = end["commit_lsn"].as_str().unwrap_or_default().to_owned();
            let counted = end["partitions"][lane.to_string()].as_u64().unwrap_or(0) as usize;
            let events = std::mem::take(&mut part);
            let whole = events.len() == counted && events.iter().all(|e| e.transaction == commit);
            let name = format!("{commit}/{lane}");
            // A part read again after a rewind may begin short: applied before, it is nothing.
            if record(db, &name, &events, [(lane, at)].into()).await? && !whole {
                eprintln!(
                    "consumer: transaction {commit} has {} events on partition {lane}, its end \
                     counts {counted}: applied as it is",
                    events.len()
                );
            }
            continue;
        }
        let event = match event(js, lane, &message).await {
            Ok(event) => event,
            Err(Malformed::Skipped(why)) => {
                eprintln!("consumer: a message skipped: {why}");
                continue;
            }
            Err(Malformed::Fatal(err)) => return Err(err),
        };
        let delivered = message.headers.as_ref().is_some_and(|h| h.get("Nats-Scheduler").is_some());
        let seeded = event.transaction.starts_with("seed:");
        let cut = |first: &Event| seeded || first.transaction != event.transaction;
        if !delivered && part.first().is_some_and(cut) {
            // The part before never got its end: its transaction was cut when the slot was
            // lost, and a seed brings the rest, each row a transaction of its own.
            apply_cut(db, std::mem::take(&mut part), lane).await?;
        }
        if delivered || seeded {
            // An event of its own: a schedule's delivery, stored at its time; a seeded row.
            let name = match delivered {
                true => format!("delivery:{}", event.id),
                false => event.transaction.clone(),
            };
            // Read past the part still waiting for its end only once that part is applied.
            let through = match part.is_empty() {
                true => [(lane, at)].into(),
                false => BTreeMap::new(),
            };
            record(db, &name, std::slice::from_ref(&event), through).await?;
        } else {
            part.push(event);
        }
    }
    Ok(())
}

/// Applies the part of a transaction that will never get its end, as it is, and says so.
async fn apply_cut(
    db: &mut tokio_postgres::Client,
    part: Vec<Event>,
    lane: usize,
) -> Result<(), Error> {
    let Some(last) = part.last() else { return Ok(()) };
    let (commit, through) = (last.transaction.clone(), (last.sequence, last.stored_at));
    eprintln!(
        "consumer: transaction {commit} has {} events on partition {lane} and no end (its slot \
         was lost?): applied as it is",
        part.len()
    );
    record(db, &format!("{commit}/{lane}"), &part, [(lane, through)].into()).await?;
    Ok(())
}

/// Where `lane` resumes: after the last message it applied, while the stream still holds
/// that message. A server that lost its unsynced tail (a power loss) no longer does, and
/// pgoutbox publishes again into it, so the sequences past its new end name other
/// messages: then the lane reads again from [`REWIND`] before that message, by time, and
/// the event ids and transactions applied make what is read twice nothing.
async fn resume_point(
    db: &tokio_postgres::Client,
    stream: &Stream,
    lane: usize,
) -> Result<DeliverPolicy, Error> {
    let query = "SELECT applied_through, applied_at FROM consumer_lanes WHERE lane = $1";
    let Some(row) = db.query_opt(query, &[&(lane as i32)]).await? else {
        return Ok(DeliverPolicy::All);
    };
    let (through, at): (i64, Option<i64>) = (row.get(0), row.get(1));
    let after = DeliverPolicy::ByStartSequence { start_sequence: through as u64 + 1 };
    let Some(at) = at else { return Ok(after) };
    let held = stream.get_raw_message(through as u64).await.ok();
    if held.is_some_and(|message| message.time.unix_timestamp_nanos() as i64 == at) {
        return Ok(after);
    }
    eprintln!(
        "consumer: lane {lane}: the stream no longer holds the message at sequence {through} \
         applied last (its server lost its tail?): reading again from {REWIND:?} before it"
    );
    let from = at as i128 - REWIND.as_nanos() as i128;
    let start_time = time::OffsetDateTime::from_unix_timestamp_nanos(from)?;
    Ok(DeliverPolicy::ByStartTime { start_time })
}

/// Whether the transaction `name` was applied before.
async fn applied_before(db: &tokio_postgres::Client, name: &str) -> Result<bool, Error> {
    let query = "SELECT EXISTS (SELECT FROM consumer_transactions WHERE transaction = $1)";
    Ok(db.query_one(query, &[&name]).await?.get(0))
}

/// Reads one lane in stream order, from `from`, and hands each event over.
async fn read_lane(
    js: jetstream::Context,
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
            Ok(message) => event(&js, lane, &message).await,
            Err(err) => Err(Malformed::Fatal(Error::from(err))),
        };
        if arrived.send(event).await.is_err() {
            return;
        }
    }
}

/// What pgoutbox's headers say of a message, with its payload. A payload that cannot be
/// read (an object that does not come, or does not match its pointer) ends the consumer:
/// applied without it the event would be wrong, and a restart reads it again.
async fn event(
    js: &jetstream::Context,
    lane: usize,
    message: &jetstream::Message,
) -> Result<Event, Malformed> {
    let mut event = described(lane, message).map_err(Malformed::Skipped)?;
    event.payload = payload_of(js, message).await.map_err(Malformed::Fatal)?;
    Ok(event)
}

/// What pgoutbox's headers say of a message, its payload left to [`payload_of`].
fn described(lane: usize, message: &jetstream::Message) -> Result<Event, Error> {
    let header = |name| message.headers.as_ref()?.get(name).map(|v| v.as_str().to_owned());
    let position = header("Pgoutbox-Position").ok_or("a message without Pgoutbox-Position")?;
    let (commit, index) = position.split_once(':').ok_or("a malformed Pgoutbox-Position")?;
    let last = header("Pgoutbox-Transaction-Last");
    let id = event_id(message).ok_or("a message without Nats-Msg-Id")?;
    let (transaction, rows) = match last.as_deref() {
        // A seeded row: the table does not say which rows were one transaction, and each
        // seed numbers positions from 0/0:0.
        None => (format!("seed:{id}"), Some(1)),
        Some("true") => {
            let rows = header("Pgoutbox-Transaction-Rows").ok_or("a last event without rows")?;
            (commit.to_owned(), Some(rows.parse()?))
        }
        Some(_) => (commit.to_owned(), None),
    };
    Ok(Event {
        lane,
        sequence: message.info()?.stream_sequence,
        stored_at: message.info()?.published.unix_timestamp_nanos() as i64,
        id,
        transaction,
        index: index.parse()?,
        rows,
        subject: message.subject.to_string(),
        payload: Vec::new(),
    })
}

/// The key to apply a message's event once by, as `examples/consumer.rs` reads it.
fn event_id(message: &async_nats::jetstream::Message) -> Option<String> {
    let header = |name| message.headers.as_ref()?.get(name).map(|v| v.as_str().to_owned());
    if let Some(id) = header("Pgoutbox-Event-Id") {
        return Some(id); // a scheduled row, delivered without Nats-Msg-Id
    }
    let msg_id = header("Nats-Msg-Id")?;
    match msg_id.strip_prefix("replay:").and_then(|rest| rest.split_once(':')) {
        Some((_replay_and_n, id)) => Some(id.to_owned()),
        None => Some(msg_id),
    }
}

/// Why a message was not handed over: one that pgoutbox's headers do not describe is
/// skipped (and reported); a reader that cannot read, or a payload that cannot be fetched,
/// ends the consumer.
enum Malformed {
    Skipped(Error),
    Fatal(Error),
}

/// The message's payload, or the object its pointer names (`--object-store`), checked
/// against the pointer's SHA-256.
async fn payload_of(
    js: &jetstream::Context,
    message: &jetstream::Message,
) -> Result<Vec<u8>, Error> {
    let header = |name| message.headers.as_ref()?.get(name).map(|v| v.as_str().to_owned());
    let Some(bucket) = header("Pgoutbox-Object-Bucket") else {
        return Ok(message.payload.to_vec());
    };
    let name = header("Pgoutbox-Object-Name").ok_or("a pointer without an object name")?;
    let mut bytes = Vec::new();
    let mut object = js.get_object_store(&bucket).await?.get(&name).await?;
    tokio::io::AsyncReadExt::read_to_end(&mut object, &mut bytes).await?;
    let digest: String =
        sha2::Sha256::digest(&bytes).iter().map(|byte| format!("{byte:02x}")).collect();
    if header("Pgoutbox-Object-Sha256").as_deref() != Some(digest.as_str()) {
        return Err(format!("object {name} of bucket {bucket}: not the pointer's SHA-256").into());
    }
    Ok(bytes)
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

/// Applies `events` as the transaction `name`, once, in one transaction of the database
/// that also records how far each lane is applied (`through`: the last message's sequence
/// and when the stream stored it). Whether it was new (not applied before).
async fn record(
    db: &mut tokio_postgres::Client,
    name: &str,
    events: &[Event],
    through: BTreeMap<usize, (u64, i64)>,
) -> Result<bool, Error> {
    let tx = db.transaction().await?;
    let new = tx
        .execute("INSERT INTO consumer_transactions VALUES ($1) ON CONFLICT DO NOTHING", &[&name])
        .await?;
    for event in events {
        if new == 1 {
            tx.execute(
                "INSERT INTO consumer_events \
                 (id, transaction, index, subject, payload, stream_sequence) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
                &[
                    &event.id,
                    &event.transaction,
                    &(event.index as i32),
                    &event.subject,
                    &event.payload,
                    &(event.sequence as i64),
                ],
            )
            .await?;
        }
    }
    for (lane, (sequence, at)) in through {
        tx.execute(
            "INSERT INTO consumer_lanes (lane, applied_through, applied_at) VALUES ($1, $2, $3) \
             ON CONFLICT (lane) DO UPDATE SET applied_through = $2, applied_at = $3 \
             WHERE consumer_lanes.applied_through <= $2",
            &[&(lane as i32), &(sequence as i64), &at],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(new == 1)
}
