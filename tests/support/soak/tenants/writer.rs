//! The soak's tenants: a second writer, on a connection of its own, beside the outbox's.
//! pgoutbox streams `public.outbox` and the pattern `tenant_*.outbox` (schema-per-tenant),
//! and this writer, while the nemesis kills and pauses:
//!
//! - creates tenant `tenant_<k>` (every 2-10 s, up to [`MAX_LIVE`] at once): `CREATE
//!   SCHEMA`, `CREATE TABLE` and most of the time 1-20 rows in one transaction, so those
//!   rows are committed before any publication holds the table: only pgoutbox's adoption
//!   (`src/postgres/adoption.rs`, at an attempt's start and every 10 s) can move them, as
//!   it must the rows written after and before it comes round;
//! - writes to the tenants: 1-15 rows into one or two of them a transaction (3 % rolled
//!   back), each row `{"s": s}` with `s` its tenant's own sequence, which grows in commit
//!   order (this writer commits serially); with schedules, 8 % of the rows carry a
//!   `deliver_at` 1-6 s ahead;
//! - tears tenants down (every 4-20 s one is retired: no more rows): once its table is in
//!   the publication, the slot is confirmed past the WAL written since and the stream has
//!   held every row of it for [`HELD_BEFORE_DROP`], all its rows are in the stream for
//!   good, and `DROP SCHEMA … CASCADE` removes it while pgoutbox runs (`teardown
//!   --only-table` refuses a pattern's table by design). Never while the slot is dropped:
//!   then the recovery's seed still reads the tables.
//!
//! A commit whose connection died is looked up once the writer is connected again (the
//! tenant's table holds its first row, or does not), so that tenants leave almost no
//! maybe-rows. The creates and retirements draw from sequences of their own, so that a seed
//! replays them at the same moments whatever the pace of the rest.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::support::soak::writer::connect;
use crate::support::soak::{Gate, Rng};

/// Tenants written at once, at most.
pub const MAX_LIVE: usize = 6;

/// Tenant `k`'s schema and outbox (sql/outbox.sql's, with a `deliver_at` column).
fn create_sql(k: u32) -> String {
    format!(
        "CREATE SCHEMA tenant_{k}; CREATE TABLE tenant_{k}.outbox (\
         id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, \
         aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL, \
         headers jsonb, created_at timestamptz NOT NULL DEFAULT now(), deliver_at timestamptz)"
    )
}

/// One tenant row the writer committed (or may have).
#[derive(Debug, Clone, Copy)]
pub struct TenantRow {
    pub tenant: u32,
    /// Its place in its tenant's commit order.
    pub s: u64,
    /// When its COMMIT was answered, in seconds from the start.
    pub at: f32,
    /// When it is to be delivered, in nanoseconds since the Unix epoch (Postgres's clock).
    pub due_nanos: Option<i128>,
}

/// What the tenants' writer saw.
#[derive(Debug, Default)]
pub struct TenantLedger {
    /// In commit order.
    pub committed: Vec<TenantRow>,
    /// Their COMMIT's outcome could not be looked up (the writer stopped first).
    pub maybe: Vec<TenantRow>,
    pub created: u32,
    /// Created with rows in the creating transaction, and how many rows those were.
    pub created_with_rows: (u32, u64),
    /// Dropped, with when (seconds from the start).
    pub dropped: Vec<(u32, f32)>,
    /// Retired and not dropped by the end (their table not yet confirmed as streamed).
    pub retiring_at_end: Option<u32>,
    pub transactions: u64,
    pub rolled_back: u64,
    /// Failed before COMMIT (a restart of Postgres): not committed.
    pub failed: u64,
    /// COMMITs whose answer was lost and whose outcome was looked up: (committed, not).
    pub looked_up: (u64, u64),
    pub reconnects: u64,
}

impl TenantLedger {
    pub fn scheduled(&self) -> usize {
        self.committed.iter().filter(|r| r.due_nanos.is_some()).count()
    }
}

/// The tenants' writer thread; [`TenantWriter::finish`] stops it and hands back its ledger.
pub struct TenantWriter {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<TenantLedger>,
}

impl TenantWriter {
    pub fn start(
        (port, nats_url): (u16, String),
        rng: Rng,
        schedules: bool,
        gate: Arc<Mutex<Gate>>,
        t0: Instant,
    ) -> TenantWriter {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let handle = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the tenants' writer's runtime");
            let mut tenants = Tenants {
                rng,
                schedules,
                gate,
                t0,
                ledger: TenantLedger::default(),
                live: Vec::new(),
                next_k: 1,
                pending: None,
                retiring: None,
                nats_url,
                stream: None,
            };
            runtime.block_on(tenants.write(port, stopped));
            tenants.ledger.retiring_at_end = tenants.retiring.map(|r| r.tenant);
            if let Some(pending) = tenants.pending {
                tenants.ledger.maybe.extend(pending.rows);
            }
            tenants.ledger
        });
        TenantWriter { stop, handle }
    }

    /// Stops after the step under way.
    pub fn finish(self) -> TenantLedger {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("the soak's tenants' writer panicked")
    }
}

/// A tenant being written: its number and the next row's `s`.
#[derive(Debug, Clone, Copy)]
struct Live {
    tenant: u32,
    next_s: u64,
}

/// A COMMIT sent and not answered: its rows, and the tenant it created, if it did.
struct Pending {
    rows: Vec<TenantRow>,
    created: Option<Live>,
}

/// A tenant written no more, to be dropped once its rows are all in the stream: `mark` is
/// the WAL position once its table was seen in the publication.
#[derive(Debug, Clone)]
struct Retiring {
    tenant: u32,
    mark: Option<String>,
    /// Since when the stream has held every committed row of the tenant, uninterrupted.
    held_since: Option<Instant>,
}

/// How long the stream must have held every row of a retired tenant before its table is
/// dropped: longer than the tail-loss fault takes back (the last seconds stored). The slot
/// confirmed past the rows is not enough: a recovery's seeded rows are confirmed at once,
/// and only the table holds them until the durability horizon passes (docs/runbooks/stream-lost-events.md).
const HELD_BEFORE_DROP: Duration = Duration::from_secs(20);

enum Failure {
    Before,
    AtCommit(Vec<TenantRow>),
}

struct Tenants {
    rng: Rng,
    schedules: bool,
    gate: Arc<Mutex<Gate>>,
    t0: Instant,
    ledger: TenantLedger,
    live: Vec<Live>,
    next_k: u32,
    pending: Option<Pending>,
    retiring: Option<Retiring>,
    nats_url: String,
    /// The stream, once connected: where a retired tenant's rows are counted.
    stream: Option<async_nats::jetstream::stream::Stream>,
}

impl Tenants {
    fn say(&self, what: &str) {
        eprintln!("[{:7.1}s] tenants: {what}", self.t0.elapsed().as_secs_f64());
    }

    async fn write(&mut self, port: u16, stop: Arc<AtomicBool>) {
        let mut creates = self.rng.fork(1);
        let mut retires = self.rng.fork(2);
        let mut next_create = Instant::now();
        let mut next_retire = Instant::now() + retires.millis(4_000, 20_000);
        let mut client: Option<Client> = None;
        while !stop.load(Ordering::Relaxed) {
            let Some(db) = client.as_mut() else {
                match connect(port).await {
                    Some(db) => client = Some(db),
                    None => tokio::time::sleep(Duration::from_millis(200)).await,
                }
                self.ledger.reconnects += 1;
                continue;
            };
            let step =
                self.step(db, (&mut creates, &mut next_create), (&mut retires, &mut next_retire));
            if step.await.is_err() {
                client = None;
                continue;
            }
            tokio::time::sleep(self.rng.millis(10, 100)).await;
        }
    }

    /// One step: a lost COMMIT looked up, a retired tenant dropped when it may be, then a
    /// create, a retirement or a transaction of rows. `Err`: the connection is gone.
    async fn step(
        &mut self,
        db: &mut Client,
        (creates, next_create): (&mut Rng, &mut Instant),
        (retires, next_retire): (&mut Rng, &mut Instant),
    ) -> Result<(), ()> {
        if let Some(pending) = self.pending.take() {
            match look_up(db, &pending).await {
                Ok(committed) => self.settle(pending, committed),
                Err(_) => {
                    self.pending = Some(pending);
                    return Err(());
                }
            }
        }
        if self.retiring.is_some() {
            self.drop_when_streamed(db).await.map_err(|_| ())?;
        }
        let now = Instant::now();
        if now >= *next_create {
            *next_create = now + creates.millis(2_000, 10_000);
            let rows = match creates.chance(0.8) {
                true => creates.between(1, 20),
                false => 0,
            };
            if self.live.len() < MAX_LIVE {
                return self.create(db, rows).await;
            }
        }
        if now >= *next_retire {
            *next_retire = now + retires.millis(4_000, 20_000);
            let pick = retires.next() as usize;
            if self.retiring.is_none() && self.live.len() >= 2 {
                let retired = self.live.remove(pick % self.live.len());
                self.say(&format!("tenant_{} retired: no more rows", retired.tenant));
                self.retiring =
                    Some(Retiring { tenant: retired.tenant, mark: None, held_since: None });
            }
        }
        self.write_rows(db).await
    }

    /// Tenant `next_k` with `rows` rows in its creating transaction.
    async fn create(&mut self, db: &mut Client, rows: u64) -> Result<(), ()> {
        let tenant = self.next_k;
        self.next_k += 1;
        let mut live = Live { tenant, next_s: 0 };
        let plan = vec![(tenant, self.plan(&mut live, rows))];
        self.ledger.transactions += 1;
        match transact(db, Some(tenant), &plan, false, self.t0).await {
            Ok(rows) => {
                self.say(&format!("tenant_{tenant} created with {} rows", rows.len()));
                self.created(live, rows);
                Ok(())
            }
            Err(Failure::Before) => {
                self.ledger.failed += 1;
                Err(())
            }
            Err(Failure::AtCommit(rows)) => {
                self.pending = Some(Pending { rows, created: Some(live) });
                Err(())
            }
        }
    }

    fn created(&mut self, live: Live, rows: Vec<TenantRow>) {
        self.ledger.created += 1;
        if !rows.is_empty() {
            self.ledger.created_with_rows.0 += 1;
            self.ledger.created_with_rows.1 += rows.len() as u64;
        }
        self.ledger.committed.extend(rows);
        self.live.push(live);
    }

    /// 1-15 rows into each of one or two live tenants, in one transaction.
    async fn write_rows(&mut self, db: &mut Client) -> Result<(), ()> {
        let roll = self.rng.between(0, 99);
        let two = self.rng.chance(0.25);
        let (first, second) = (self.rng.next() as usize, self.rng.next() as usize);
        if self.live.is_empty() {
            return Ok(());
        }
        let mut chosen: BTreeSet<usize> = [first % self.live.len()].into();
        if two {
            chosen.insert(second % self.live.len());
        }
        let rollback = roll < 3;
        let mut plan = Vec::new();
        for i in chosen {
            let rows = self.rng.between(1, 15);
            let mut live = self.live[i];
            plan.push((live.tenant, self.plan(&mut live, rows)));
            self.live[i] = live;
        }
        self.ledger.transactions += 1;
        match transact(db, None, &plan, rollback, self.t0).await {
            Ok(_) if rollback => self.ledger.rolled_back += 1,
            Ok(rows) => self.ledger.committed.extend(rows),
            Err(Failure::Before) => {
                self.ledger.failed += 1;
                return Err(());
            }
            Err(Failure::AtCommit(rows)) => {
                self.pending = Some(Pending { rows, created: None });
                return Err(());
            }
        }
        Ok(())
    }

    /// The next `rows` rows of `live`: each `s` and its delay in ms (0: none).
    fn plan(&mut self, live: &mut Live, rows: u64) -> Vec<(i64, i32)> {
        let mut planned = Vec::new();
        for _ in 0..rows {
            let delay = match self.schedules && self.rng.chance(0.08) {
                true => self.rng.between(1_000, 6_000) as i32,
                false => 0,
            };
            planned.push((live.next_s as i64, delay));
            live.next_s += 1;
        }
        planned
    }

    /// A lost COMMIT's outcome, looked up.
    fn settle(&mut self, pending: Pending, committed: bool) {
        let (yes, no) = &mut self.ledger.looked_up;
        *if committed { yes } else { no } += 1;
        let what = if committed { "committed" } else { "not committed" };
        self.say(&format!("a COMMIT whose answer was lost: {what}"));
        if !committed {
            return;
        }
        match pending.created {
            Some(live) => self.created(live, pending.rows),
            None => self.ledger.committed.extend(pending.rows),
        }
    }

    /// Drops the retired tenant once its table is in the publication and the slot is
    /// confirmed past the WAL written by then: all its rows are in the stream. Holds the
    /// gate meanwhile, and waits while the slot is dropped (a recovery's seed reads the
    /// table) or the nemesis holds the gate.
    async fn drop_when_streamed(&mut self, db: &mut Client) -> Result<(), tokio_postgres::Error> {
        let Some(retiring) = self.retiring.clone() else { return Ok(()) };
        let gate = self.gate.clone();
        let Ok(gate) = gate.try_lock() else { return Ok(()) };
        if gate.slot_dropped {
            return Ok(());
        }
        let schema = format!("tenant_{}", retiring.tenant);
        let state = db
            .query_one(
                "SELECT to_regclass($1 || '.outbox') IS NULL, EXISTS (SELECT FROM \
                 pg_publication_tables WHERE pubname = 'pgoutbox' AND schemaname = $1 \
                 AND tablename = 'outbox'), pg_current_wal_lsn()::text",
                &[&schema],
            )
            .await?;
        let (gone, published): (bool, bool) = (state.get(0), state.get(1));
        let mark = match (&retiring.mark, gone, published) {
            (_, true, _) => {
                self.dropped(retiring.tenant);
                return Ok(());
            }
            (Some(mark), _, _) => mark.clone(),
            (None, _, true) => {
                let mark: String = state.get(2);
                self.retiring = Some(Retiring { mark: Some(mark.clone()), ..retiring.clone() });
                mark
            }
            (None, _, false) => return Ok(()),
        };
        let passed: bool = db
            .query_one(
                "SELECT coalesce((SELECT confirmed_flush_lsn >= $1::text::pg_lsn \
                 FROM pg_replication_slots WHERE slot_name = 'pgoutbox'), false)",
                &[&mark],
            )
            .await?
            .get(0);
        if passed && self.held_a_while(retiring.tenant).await {
            db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await?;
            self.dropped(retiring.tenant);
        }
        drop(gate);
        Ok(())
    }

    /// Whether the stream has held every committed row of `tenant` for
    /// [`HELD_BEFORE_DROP`]: counted on its subjects, at each call.
    async fn held_a_while(&mut self, tenant: u32) -> bool {
        let committed = self.ledger.committed.iter().filter(|r| r.tenant == tenant).count();
        let held = self.held_in_stream(tenant).await;
        let Some(retiring) = self.retiring.as_mut() else { return false };
        if held.is_none_or(|held| held < committed) {
            retiring.held_since = None;
            return false;
        }
        retiring.held_since.get_or_insert_with(Instant::now).elapsed() >= HELD_BEFORE_DROP
    }

    /// How many messages the stream holds on `tenant`'s subjects; `None`: unknown.
    async fn held_in_stream(&mut self, tenant: u32) -> Option<usize> {
        if self.stream.is_none() {
            let client = async_nats::connect(&self.nats_url).await.ok()?;
            let js = async_nats::jetstream::new(client);
            self.stream = Some(js.get_stream("OUTBOX").await.ok()?);
        }
        let stream = self.stream.as_mut()?;
        let filter = format!("tenants.tenant_{tenant}.>");
        let Ok(mut subjects) = stream.info_with_subjects(filter).await else {
            self.stream = None;
            return None;
        };
        let mut held = 0;
        while let Some(next) = futures_util::StreamExt::next(&mut subjects).await {
            held += next.ok()?.1;
        }
        Some(held)
    }

    fn dropped(&mut self, tenant: u32) {
        self.say(&format!("tenant_{tenant} dropped, its rows streamed"));
        self.ledger.dropped.push((tenant, self.t0.elapsed().as_secs_f32()));
        self.retiring = None;
    }
}

/// Whether the transaction of `pending` committed: its tenant's table (made by it, if it
/// made one) holds its first row.
async fn look_up(db: &mut Client, pending: &Pending) -> Result<bool, tokio_postgres::Error> {
    let Some(first) = pending.rows.first() else {
        let Some(live) = pending.created else { return Ok(false) };
        let exists = format!("SELECT to_regclass('tenant_{}.outbox') IS NOT NULL", live.tenant);
        return Ok(db.query_one(&exists, &[]).await?.get(0));
    };
    let exists = format!("SELECT to_regclass('tenant_{}.outbox') IS NOT NULL", first.tenant);
    if !db.query_one(&exists, &[]).await?.get::<_, bool>(0) {
        return Ok(false);
    }
    let held = format!(
        "SELECT count(*) FROM tenant_{}.outbox WHERE aggregate_id = '{}'",
        first.tenant, first.s
    );
    Ok(db.query_one(&held, &[]).await?.get::<_, i64>(0) > 0)
}

/// One transaction: the tenant `create` made first, then each tenant's planned rows.
async fn transact(
    db: &mut Client,
    create: Option<u32>,
    plan: &[(u32, Vec<(i64, i32)>)],
    rollback: bool,
    t0: Instant,
) -> Result<Vec<TenantRow>, Failure> {
    let tx = db.transaction().await.map_err(|_| Failure::Before)?;
    if let Some(tenant) = create {
        tx.batch_execute(&create_sql(tenant)).await.map_err(|_| Failure::Before)?;
    }
    let mut inserted = Vec::new();
    // One statement per row, as applications write events: a tenant's table has a uuid id,
    // and a seed orders one statement's rows by their place in the table, which is not
    // always the statement's order (docs/runbooks/slot-lost.md, the order).
    for (tenant, rows) in plan {
        let insert = format!(
            "INSERT INTO tenant_{tenant}.outbox \
             (aggregate_type, aggregate_id, event_type, payload, deliver_at) \
             VALUES ('order', $1::bigint::text, 'created', jsonb_build_object('s', $1::bigint), \
               CASE WHEN $2::int > 0 THEN now() + $2::int * interval '1 millisecond' END) \
             RETURNING (extract(epoch FROM deliver_at) * 1000000000)::bigint"
        );
        for &(s, delay) in rows {
            let returned = tx.query_one(&insert, &[&s, &delay]).await;
            let due: Option<i64> = returned.map_err(|_| Failure::Before)?.get(0);
            let due_nanos = due.map(i128::from);
            inserted.push(TenantRow { tenant: *tenant, s: s as u64, at: 0.0, due_nanos });
        }
    }
    if rollback {
        let _ = tx.rollback().await;
        return Ok(Vec::new());
    }
    let done = tx.commit().await;
    let at = t0.elapsed().as_secs_f32();
    for row in &mut inserted {
        row.at = at;
    }
    match done {
        Ok(()) => Ok(inserted),
        Err(_) => Err(Failure::AtCommit(inserted)),
    }
}
