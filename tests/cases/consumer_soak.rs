//! The consumer soak (issue 57): the nemesis soak's faults, judged where the consumer
//! stands. pgoutbox streams numbered transactions over 4 partitions with its transactions'
//! ends, large events through the object store and, on nats-server 2.12+, scheduled ones;
//! the example consumer (`examples/consumer/`) applies them to its own database, one
//! process per partition on 2.10+ (one for all on 2.9). A seeded schedule kills pgoutbox
//! and consumers with -9, pauses and restarts nats-server, restarts Postgres, drops the slot
//! for a `--recover`, replays rows and cuts the stream's unsynced tail. Then everything heals
//! and the checker reads the consumer's database (`support::soak::consumer::judge`).
//! Ignored by default: `scripts/soak.sh --consumer --minutes N --seed S` runs it.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::pgoutbox::{Pgoutbox, command, example_consumer_binary};
use crate::support::soak::check::Verdict;
use crate::support::soak::consumer::{APPLIED, ConsumerWriter, Ledger, judge, parse_applied};
use crate::support::soak::{Fault, Rng, Settings};
use crate::support::{Nats, Postgres, wait_until_streaming};

const PARTITIONS: usize = 4;
/// The settings of `run` alone, last in its arguments.
const RUN_ONLY: [&str; 4] = ["--object-store", "PAYLOADS", "--object-store-over", "64KiB"];

#[tokio::test(flavor = "multi_thread")]
#[ignore = "minutes long: run it with scripts/soak.sh --consumer --minutes N --seed S"]
async fn the_example_consumer_applies_every_event_once_whole_and_in_order_under_a_seeded_nemesis() {
    let settings = Settings::from_env();
    eprintln!("consumer soak seed {}: {}", settings.seed, settings.replay_line(true));
    let rng = Rng::new(settings.seed);
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN deliver_at timestamptz");
    pg.psql("CREATE DATABASE consumer");
    let release = nats.release();
    let schedules = settings.schedules && release >= (2, 12);
    let by_partition = release >= (2, 10);
    let mut base: Vec<String> = [
        "--partitions",
        "4",
        "--subject-template",
        "outbox.{$partition}.{aggregate_type}.{event_type}",
        "--transaction-subject",
        "outbox.transactions",
    ]
    .map(str::to_owned)
    .into();
    if schedules {
        base.push("--schedule-column=deliver_at".to_owned());
    }
    eprintln!(
        "nats-server {release:?}: {} consumer process(es), schedules {schedules}",
        if by_partition { PARTITIONS } else { 1 }
    );
    // `replay` takes the settings above; only `run` these.
    base.extend(RUN_ONLY.map(str::to_owned));
    let app = Pgoutbox::run(&pg, &nats, &strs(&base));
    wait_until_streaming(&pg, &app).await;
    let writer = ConsumerWriter::start(pg.url(), rng.fork(1), schedules);
    let t0 = Instant::now();
    let mut soak = Soak {
        pg,
        nats,
        app,
        base,
        rng: rng.fork(2),
        consumers: Vec::new(),
        by_partition,
        t0,
        consumer_logs: String::new(),
    };
    soak.consumers = soak.lanes().iter().map(|lane| soak.consumer(lane)).collect();
    let (mut faults, mut trouble) = (BTreeMap::<&str, usize>::new(), Verdict::default());
    while t0.elapsed() < settings.duration {
        tokio::time::sleep(soak.rng.millis(1_000, 6_000)).await;
        soak.keep_alive(&mut trouble).await;
        if settings.faults.is_empty() || t0.elapsed() >= settings.duration {
            continue;
        }
        let name = match soak.rng.chance(0.3) {
            true => {
                soak.kill_a_consumer();
                "consumer-kill"
            }
            false => {
                let last = settings.faults.len() as u64 - 1;
                let fault = settings.faults[soak.rng.between(0, last) as usize];
                soak.inflict(fault, &mut trouble).await;
                fault.name()
            }
        };
        *faults.entry(name).or_default() += 1;
    }
    let ledger = writer.finish().await;
    soak.keep_alive(&mut trouble).await;
    soak.say(&format!(
        "writer stopped: {} transactions committed ({} events), {} maybe, {} failed",
        ledger.committed.len(),
        ledger.committed.iter().map(Vec::len).sum::<usize>(),
        ledger.maybe.len(),
        ledger.failed
    ));
    let applied = soak.wait_applied(&ledger, &mut trouble).await;
    let in_stream = events_in_stream(&soak.nats).await;
    let mut verdict = judge(&applied, &ledger, by_partition);
    // Whether an event the consumer never applied is in the stream: the consumer's fault,
    // or pgoutbox's.
    let applied_ns: std::collections::HashSet<u64> = applied.iter().map(|a| a.n).collect();
    for n in ledger.committed.iter().flatten().map(|w| w.n).filter(|n| !applied_ns.contains(n)) {
        let held = in_stream
            .get(&n)
            .map_or("not in the stream".to_owned(), |at| format!("in the stream at {at:?}"));
        soak.say(&format!("event {n}, never applied: {held}"));
    }
    verdict.absorb(trouble);
    let logs = soak.consumers.iter().fold(soak.consumer_logs.clone(), |all, c| all + &c.log());
    // A part short of its end's count is a loss; one cut by a lost slot has no end, and
    // the seed brings its rest (the contract): counted, not a violation.
    for line in logs.lines().filter(|l| l.contains("its end counts")) {
        verdict.add("a part short of its end's count", line.to_owned());
    }
    let cut = logs.lines().filter(|l| l.contains("(its slot was lost?)")).count();
    let violations: Vec<String> = verdict
        .violations
        .iter()
        .map(|(kind, (n, examples))| {
            format!("{kind}: {n} (e.g. {:?})", &examples[..examples.len().min(3)])
        })
        .collect();
    let faults: Vec<String> = faults.iter().map(|(f, n)| format!("{f}={n}")).collect();
    eprintln!(
        "\n===== consumer soak summary =====\nseed {}: {:.1} min, {} events applied ({cut} \
         transactions cut by a dropped slot); faults: {}\nviolations: {}\nreplay with: {}",
        settings.seed,
        t0.elapsed().as_secs_f64() / 60.0,
        applied.len(),
        faults.join(" "),
        if violations.is_empty() { "none".to_owned() } else { violations.join("\n  ") },
        settings.replay_line(true)
    );
    assert_eq!(verdict.count(), 0, "the consumer soak found violations");
}

struct Soak {
    pg: Postgres,
    nats: Nats,
    app: Pgoutbox,
    base: Vec<String>,
    rng: Rng,
    /// The example consumer's processes, one per lane.
    consumers: Vec<Pgoutbox>,
    by_partition: bool,
    t0: Instant,
    /// The logs of the consumer processes that exited or were killed.
    consumer_logs: String,
}

impl Soak {
    fn say(&self, what: &str) {
        eprintln!("[{:7.1}s] {what}", self.t0.elapsed().as_secs_f64());
    }

    /// Each consumer process's `PARTITION`, or `None` for one process reading all.
    fn lanes(&self) -> Vec<Option<usize>> {
        match self.by_partition {
            true => (0..PARTITIONS).map(Some).collect(),
            false => vec![None],
        }
    }

    fn consumer(&self, lane: &Option<usize>) -> Pgoutbox {
        let mut cmd = Command::new(example_consumer_binary());
        cmd.env("NATS_URL", self.nats.url())
            .env("PARTITIONS", PARTITIONS.to_string())
            .env("CONSUMER_DATABASE_URL", self.pg.url_for("postgres", None, "consumer"));
        if let Some(partition) = lane {
            cmd.env("PARTITION", partition.to_string());
        }
        Pgoutbox::spawn(cmd)
    }

    fn kill_a_consumer(&mut self) {
        let i = self.rng.between(0, self.consumers.len() as u64 - 1) as usize;
        self.say(&format!("fault consumer-kill: consumer {i}"));
        self.consumers[i].kill9();
        self.consumer_logs.push_str(&self.consumers[i].log());
        let lane = self.lanes()[i];
        self.consumers[i] = self.consumer(&lane);
    }

    /// Starts again what exited: a consumer whose database or server went away exits, as
    /// the example does; pgoutbox never should (a violation), with `--recover` if its slot
    /// is gone.
    async fn keep_alive(&mut self, trouble: &mut Verdict) {
        let lanes = self.lanes();
        for (i, lane) in lanes.iter().enumerate() {
            if !self.consumers[i].is_running() {
                self.consumer_logs.push_str(&self.consumers[i].log());
                self.consumers[i] = self.consumer(lane);
            }
        }
        if self.app.is_running() {
            return;
        }
        let log = self.app.log();
        let tail: Vec<&str> = log.lines().rev().take(3).collect();
        trouble.add("pgoutbox exited", tail.join(" | "));
        let slot = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pgoutbox'";
        match self.pg.try_psql(slot).as_deref() {
            Ok("0") => self.recover(trouble).await,
            _ => self.app = Pgoutbox::run(&self.pg, &self.nats, &strs(&self.base)),
        }
    }

    async fn inflict(&mut self, fault: Fault, trouble: &mut Verdict) {
        self.say(&format!("fault {}", fault.name()));
        match fault {
            Fault::Kill => {
                self.app.kill9();
                tokio::time::sleep(self.rng.millis(0, 2_000)).await;
                self.app = Pgoutbox::run(&self.pg, &self.nats, &strs(&self.base));
            }
            Fault::Pause => {
                self.nats.pause();
                tokio::time::sleep(self.rng.millis(500, 5_000)).await;
                self.nats.resume();
            }
            Fault::NatsRestart => {
                self.nats.stop();
                tokio::time::sleep(self.rng.millis(0, 2_000)).await;
                self.nats.start_again();
            }
            Fault::PgFast => self.pg.restart("fast"),
            Fault::PgImmediate => self.pg.restart("immediate"),
            Fault::Recover => {
                self.app.sigterm();
                let deadline = Instant::now() + Duration::from_secs(30);
                while self.app.is_running() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                self.app.kill9();
                let drop = "SELECT pg_drop_replication_slot('pgoutbox') FROM pg_replication_slots \
                            WHERE slot_name = 'pgoutbox' AND NOT active";
                let deadline = Instant::now() + Duration::from_secs(10);
                while self.pg.try_psql(drop).is_ok_and(|d| d.is_empty())
                    && Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(self.rng.millis(0, 3_000)).await;
                self.recover(trouble).await;
            }
            Fault::Replay => self.replay(trouble).await,
            Fault::TailLoss => {
                let both = self.rng.chance(0.5);
                if both {
                    self.app.kill9();
                }
                let cut = self.nats.lose_everything_stored_within(self.rng.millis(500, 5_000));
                self.say(&format!(
                    "{cut} messages lost{}",
                    if both { " with pgoutbox" } else { "" }
                ));
                tokio::time::sleep(self.rng.millis(0, 2_000)).await;
                self.nats.start_again();
                if both {
                    self.app = Pgoutbox::run(&self.pg, &self.nats, &strs(&self.base));
                }
            }
        }
    }

    /// `run --recover`, waited for until its seed finished (2 min).
    async fn recover(&mut self, trouble: &mut Verdict) {
        let args: Vec<&str> = strs(&self.base).into_iter().chain(["--recover"]).collect();
        self.app = Pgoutbox::run(&self.pg, &self.nats, &args);
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.app.log().contains("seed finished") && Instant::now() < deadline {
            if !self.app.is_running() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !self.app.log().contains("seed finished") {
            let log = self.app.log();
            let tail: Vec<&str> = log.lines().rev().take(4).collect();
            trouble.add("recovery unfinished", tail.join(" | "));
        }
    }

    /// `pgoutbox replay --ids` of 1-4 rows of the table, beside the live pgoutbox.
    async fn replay(&mut self, trouble: &mut Verdict) {
        let k = self.rng.between(1, 4);
        let ids = self.pg.try_psql(&format!(
            "SELECT string_agg(id::text, ',') FROM (SELECT id FROM outbox ORDER BY random() \
             LIMIT {k}) picked"
        ));
        let Some(ids) = ids.ok().filter(|ids| !ids.is_empty()) else { return };
        let mut cmd = command(&self.pg, &self.nats);
        let shared = &self.base[..self.base.len() - RUN_ONLY.len()];
        cmd.args(shared).args(["replay", "--ids", &ids, "--from-table", "public.outbox"]);
        let mut replay = Pgoutbox::spawn(cmd);
        let deadline = Instant::now() + Duration::from_secs(90);
        while replay.is_running() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (log, ended) = (replay.log(), !replay.is_running());
        // Begun as pgoutbox was killed, it may wait for a walsender that is gone and say so
        // (docs/runbooks/replay.md): its rows are left in the slot.
        let waited = log.contains("no pgoutbox has streamed from slot");
        let succeeded = ended && replay.wait_exit(Duration::from_secs(1)).success();
        if !succeeded && !waited {
            let tail: Vec<&str> = log.lines().rev().take(3).collect();
            let what = if ended { "replay failed" } else { "replay did not end in 90 s" };
            trouble.add(what, tail.join(" | "));
        }
    }

    /// Waits (3 min at most, restarting what exits) until the consumer applied every
    /// committed event; returns what it applied.
    async fn wait_applied(
        &mut self,
        ledger: &Ledger,
        trouble: &mut Verdict,
    ) -> Vec<crate::support::soak::consumer::Applied> {
        let committed: std::collections::BTreeSet<u64> =
            ledger.committed.iter().flatten().map(|w| w.n).collect();
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let rows = self.pg.try_psql_db("consumer", APPLIED).unwrap_or_default();
            let applied = parse_applied(&rows);
            let ns: std::collections::BTreeSet<u64> = applied.iter().map(|a| a.n).collect();
            let left = committed.difference(&ns).count();
            if left == 0 || Instant::now() >= deadline {
                self.say(&format!("{} events applied, {left} committed ones not", applied.len()));
                return applied;
            }
            self.keep_alive(trouble).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
}

/// Each event the stream holds in place (not a schedule), by its number: the sequences and
/// subjects of its messages (a pointer's number is read from its row's aggregate order: not
/// at all, so pointers are left out).
async fn events_in_stream(nats: &Nats) -> BTreeMap<u64, Vec<(String, String)>> {
    let js = crate::support::stream::jetstream(&nats.url()).await;
    let mut held: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
    for message in crate::support::stream::read_all(&js, "OUTBOX").await {
        let n = serde_json::from_slice::<serde_json::Value>(&message.payload)
            .ok()
            .and_then(|body| body["n"].as_u64());
        if let Some(n) = n {
            let position = message.header("Pgoutbox-Position").unwrap_or_default().to_owned();
            held.entry(n).or_default().push((message.subject.clone(), position));
        }
    }
    held
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}
