//! The soak's writer: one connection committing transactions of 1-50 rows (now and then an
//! empty or a rolled-back one) into a `bigserial` outbox, each row's payload `{"n": n}`
//! with `n` a unique event number that grows in commit order (the writer commits serially),
//! and now and then `TRUNCATE outbox RESTART IDENTITY`, so that ids are used again. With
//! `large`, one event in [`LARGE_EVERY`] pads its payload past the soak's object-store
//! threshold ([`LARGE_OVER`]), so that its message carries a pointer to an object. It
//! records what it saw committed; a commit whose connection died is a maybe.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};

use super::{Gate, Rng};

/// The soak's outbox: ids from a sequence, so that a truncate with restart reuses them.
pub const OUTBOX: &str = "CREATE TABLE outbox (id bigserial PRIMARY KEY, \
    aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL, \
    payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())";

/// One event in this many is large (`n % LARGE_EVERY == 0`), when the soak writes large rows.
pub const LARGE_EVERY: u64 = 37;

/// The soak's `object-store-over`: a large event's payload (3-9 KB) is past it, the
/// others (`{"n": n}`) far below.
pub const LARGE_OVER: &str = "2KiB";

/// One row the writer committed (or may have).
#[derive(Debug, Clone, Copy)]
pub struct Event {
    pub n: u64,
    pub id: i64,
    /// How many truncates came before it.
    pub epoch: u32,
    /// When its COMMIT was answered (or sent, for a maybe), in seconds from the start.
    pub at: f32,
}

/// What the writer saw.
#[derive(Debug, Default)]
pub struct Ledger {
    /// In commit order.
    pub committed: Vec<Event>,
    /// Their COMMIT was sent and the connection died before the answer.
    pub maybe: Vec<Event>,
    /// Committed, then removed by a truncate while the slot was dropped: no one can
    /// recover them, by design.
    pub lost_with_slot_allowed: HashSet<u64>,
    pub transactions: u64,
    pub empty: u64,
    pub rolled_back: u64,
    /// Transactions that failed before COMMIT (a restart of Postgres): not committed.
    pub failed: u64,
    pub truncates: u64,
    /// Truncates whose connection died: done or not.
    pub truncates_unknown: u64,
    pub reconnects: u64,
}

/// The writer thread; [`Writer::finish`] stops it and hands back its [`Ledger`].
pub struct Writer {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Ledger>,
}

impl Writer {
    pub fn start(
        port: u16,
        rng: Rng,
        truncate: bool,
        large: bool,
        gate: Arc<Mutex<Gate>>,
        t0: Instant,
    ) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let handle = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the writer's runtime");
            runtime.block_on(write(port, rng, truncate, large, gate, stopped, t0))
        });
        Writer { stop, handle }
    }

    /// Stops after the transaction under way.
    pub fn finish(self) -> Ledger {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("the soak's writer panicked")
    }
}

enum Failure {
    /// Before COMMIT was sent: nothing committed.
    Before,
    /// COMMIT sent, no answer: these rows may be committed.
    AtCommit(Vec<(i64, u64)>),
}

async fn write(
    port: u16,
    mut rng: Rng,
    truncate: bool,
    large: bool,
    gate: Arc<Mutex<Gate>>,
    stop: Arc<AtomicBool>,
    t0: Instant,
) -> Ledger {
    let mut ledger = Ledger::default();
    let mut next_n = 0u64;
    let mut epoch = 0u32;
    let mut since_truncate: Vec<u64> = Vec::new();
    // Truncates draw from a sequence of their own, so that a seed replays them at the same
    // moments however many transactions the machine's speed fits in between.
    let mut truncates = rng.fork(1);
    let mut next_truncate = Instant::now() + truncate_gap(&mut truncates);
    let mut client: Option<Client> = None;
    while !stop.load(Ordering::Relaxed) {
        let Some(db) = client.as_mut() else {
            match connect(port).await {
                Some(db) => client = Some(db),
                None => tokio::time::sleep(Duration::from_millis(200)).await,
            }
            ledger.reconnects += 1;
            continue;
        };
        if truncate && Instant::now() >= next_truncate {
            let mut held = gate.lock().await;
            let done = db.batch_execute("TRUNCATE outbox RESTART IDENTITY").await;
            let (slot_dropped, when) = (held.slot_dropped, t0.elapsed().as_secs_f64());
            if slot_dropped {
                ledger.lost_with_slot_allowed.extend(since_truncate.iter().copied());
            }
            match done {
                Ok(()) => {
                    epoch += 1;
                    held.epoch = epoch;
                    ledger.truncates += 1;
                    // From the truncate on: the gate may have been held by a replay.
                    next_truncate = Instant::now() + truncate_gap(&mut truncates);
                    since_truncate.clear();
                    let dropped = if slot_dropped { " (slot dropped)" } else { "" };
                    eprintln!(
                        "[{when:7.1}s] writer: truncate {epoch} after event {next_n}{dropped}"
                    );
                }
                Err(err) => {
                    ledger.truncates_unknown += 1;
                    next_truncate = Instant::now() + truncate_gap(&mut truncates);
                    eprintln!("[{when:7.1}s] writer: truncate outcome unknown: {err}");
                    client = None;
                }
            }
            continue;
        }
        let roll = rng.between(0, 99);
        let rows = if roll < 3 { 0 } else { rng.between(1, 50) };
        let rollback = (3..6).contains(&roll);
        let from = next_n;
        next_n += rows;
        ledger.transactions += 1;
        match transact(db, from, rows, rollback, large).await {
            Ok(rows) if rollback => {
                debug_assert!(rows.is_empty());
                ledger.rolled_back += 1;
            }
            Ok(rows) if rows.is_empty() => ledger.empty += 1,
            Ok(rows) => {
                let at = t0.elapsed().as_secs_f32();
                for (id, n) in rows {
                    ledger.committed.push(Event { n, id, epoch, at });
                    since_truncate.push(n);
                }
            }
            Err(Failure::Before) => {
                ledger.failed += 1;
                client = None;
            }
            Err(Failure::AtCommit(rows)) => {
                let at = t0.elapsed().as_secs_f32();
                for (id, n) in rows {
                    ledger.maybe.push(Event { n, id, epoch, at });
                    since_truncate.push(n);
                }
                client = None;
            }
        }
        tokio::time::sleep(rng.millis(2, 30)).await;
    }
    ledger
}

/// Until the next truncate. Half of the gaps are shorter than the soak's 5 s duplicate
/// window: only then are the reused ids' first messages still in it, so that JetStream
/// answers them as duplicates (a collision); the others let ids come back after it.
fn truncate_gap(rng: &mut Rng) -> Duration {
    match rng.chance(0.5) {
        true => rng.millis(500, 4_000),
        false => rng.millis(5_000, 40_000),
    }
}

pub(super) async fn connect(port: u16) -> Option<Client> {
    let config =
        format!("host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=5");
    let (client, connection) = tokio_postgres::connect(&config, NoTls).await.ok()?;
    tokio::spawn(connection);
    Some(client)
}

/// One transaction of events `from..from + rows`; the ids and events committed.
async fn transact(
    db: &mut Client,
    from: u64,
    rows: u64,
    rollback: bool,
    large: bool,
) -> Result<Vec<(i64, u64)>, Failure> {
    let tx = db.transaction().await.map_err(|_| Failure::Before)?;
    let mut inserted = Vec::new();
    if rows > 0 {
        let last = (from + rows - 1) as i64;
        let returned = tx
            .query(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 SELECT 'order', n::text, 'created', jsonb_build_object('n', n) || CASE \
                 WHEN $3 AND n % $4 = 0 THEN jsonb_build_object('pad', repeat('x', 3000 + \
                 (n % 7)::int * 1000)) ELSE '{}' END \
                 FROM generate_series($1::bigint, $2::bigint) AS n RETURNING id, aggregate_id",
                &[&(from as i64), &last, &large, &(LARGE_EVERY as i64)],
            )
            .await
            .map_err(|_| Failure::Before)?;
        for row in returned {
            let n: String = row.get(1);
            inserted.push((row.get(0), n.parse().expect("aggregate_id is the event number")));
        }
    }
    if rollback {
        let _ = tx.rollback().await;
        return Ok(Vec::new());
    }
    match tx.commit().await {
        Ok(()) => Ok(inserted),
        Err(_) => Err(Failure::AtCommit(inserted)),
    }
}
