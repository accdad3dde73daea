//! The consumer recipes in Python and TypeScript (`examples/recipes/`, issue 71) against real
//! servers, all three side by side on one pgoutbox and one fault schedule: `once` (each
//! event once, by its id; two instances on one durable), `ordered` (each key in commit
//! order; two instances sharing two partitions by advisory lock) and `whole` (whole
//! transactions by their ends; an instance and a standby), and beside them the Rust example
//! (`examples/consumer/`, every partition in one process by the marks, which now counts a
//! scheduled row by its schedule and applies its delivery alone). pgoutbox streams random
//! transactions over 2 partitions with its transactions' ends, an emitted event now and
//! then, a payload too large for a message in each phase (the Object Store) and, on
//! nats-server 2.12+, scheduled rows (some their transaction's last). Through a kill -9 of
//! one instance of each recipe, a kill -9 of pgoutbox, a nats-server restart and a
//! `pgoutbox replay` of rows applied before, each recipe's own table must hold every event
//! once (none of the scheduled ones dropped), all but `once` each key's events in commit
//! order, and `whole` and the Rust example each transaction in one transaction of the
//! database, holding it alone: the three literal readings of issue 71 (a part applied when
//! "fewer means removed" behind a redelivery, parts applied without waiting for the count
//! in order, a delivery collected by its copied commit LSN) fail exactly these checks.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::pgoutbox::{Pgoutbox, command, example_consumer_binary};
use crate::support::{Lcg, Nats, Postgres};

const PARTITIONS: &str = "2";
const KEYS: u64 = 11;
/// Short, so that what a killed instance held comes back within the test.
const ACK_WAIT: &str = "3";
const RECIPES: [&str; 3] = ["once", "ordered", "whole"];
/// Each recipe's table of effects, and the Rust example's (`examples/consumer/`, which reads
/// every partition by the marks, beside them): the same columns.
const TABLES: [(&str, &str); 4] = [
    ("once", "once_effects"),
    ("ordered", "ordered_effects"),
    ("whole", "whole_effects"),
    ("the Rust example", "consumer_events"),
];

#[derive(Clone, Copy)]
enum Language {
    Python,
    TypeScript,
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_recipes_apply_each_event_once_in_key_order_and_whole_through_faults() {
    recipes_through_faults(Language::Python).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_recipes_apply_each_event_once_in_key_order_and_whole_through_faults() {
    recipes_through_faults(Language::TypeScript).await;
}

/// One event the writer committed: its number (the payload's `n`, in commit order), its key
/// and whether it was scheduled (applied at its time, alone).
#[derive(Clone, Copy)]
struct Written {
    n: u64,
    key: u64,
    scheduled: bool,
}

/// `count` random transactions of 1-6 events from event `next` on: every 9th emits its first
/// event, the first of the phase has a payload of 1.5 MB (over `max_payload`: an object),
/// and with `schedules` every 6th has a row due in 1-3 s, now and then its last.
fn phase(
    random: &mut Lcg,
    next: &mut u64,
    count: usize,
    schedules: bool,
) -> (String, Vec<Vec<Written>>) {
    let (mut sql, mut made) = (String::new(), Vec::new());
    for t in 0..count {
        let size = random.between(1, 7);
        let scheduled_at = (schedules && t % 6 == 2).then(|| random.between(0, size));
        let mut events = Vec::new();
        sql.push_str("BEGIN;\n");
        for i in 0..size {
            let (n, key) = (*next, random.between(0, KEYS));
            *next += 1;
            let scheduled = scheduled_at == Some(i);
            let payload = match t == 0 && i == 0 {
                true => format!("jsonb_build_object('n', {n}, 'pad', repeat('x', 1500000))"),
                false => format!("'{{\"n\": {n}}}'"),
            };
            if t % 9 == 4 && i == 0 {
                sql.push_str(&format!(
                    "SELECT pg_logical_emit_message(true, 'outbox', '{{\"id\":\"e{n}\",\
                     \"aggregate_type\":\"order\",\"aggregate_id\":\"{key}\",\
                     \"event_type\":\"created\",\"payload\":{{\"n\":{n}}}}}');\n"
                ));
            } else {
                let due = match scheduled {
                    true => format!("now() + interval '{} ms'", random.between(1_000, 3_000)),
                    false => "NULL".to_owned(),
                };
                sql.push_str(&format!(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, \
                     deliver_at) VALUES ('order', '{key}', 'created', {payload}, {due});\n"
                ));
            }
            events.push(Written { n, key, scheduled });
        }
        sql.push_str("COMMIT;\n");
        made.push(events);
    }
    (sql, made)
}

/// The recipes' directory and how to start one of them.
fn recipe(language: Language, name: &str, pg: &Postgres, nats: &Nats) -> Pgoutbox {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/recipes");
    let mut cmd = match language {
        Language::Python => {
            let packages = std::env::var("PGOUTBOX_PYTHON_PACKAGES")
                .unwrap_or_else(|_| "/var/tmp/pgoutbox-python".to_owned());
            let mut cmd = Command::new("python3");
            cmd.arg(dir.join("python").join(format!("{name}.py"))).env("PYTHONPATH", packages);
            cmd
        }
        Language::TypeScript => {
            let dir: PathBuf = dir.join("typescript");
            assert!(
                dir.join("node_modules").is_dir(),
                "no {dir:?}/node_modules: run scripts/install-deps.sh (npm ci there)"
            );
            let mut cmd = Command::new("node");
            cmd.arg(dir.join(format!("{name}.mjs"))).current_dir(dir);
            cmd
        }
    };
    cmd.env("NATS_URL", nats.url())
        .env("DATABASE_URL", pg.url_for("postgres", None, "consumer"))
        .env("PGOUTBOX_STREAM", "OUTBOX")
        .env("SUBJECT_ROOT", "outbox")
        .env("PARTITIONS", PARTITIONS)
        .env("ACK_WAIT", ACK_WAIT);
    Pgoutbox::spawn(cmd) // a child process with its log
}

/// How many events each recipe (and the Rust example) applied.
fn applied(pg: &Postgres) -> BTreeMap<&'static str, u64> {
    TABLES
        .iter()
        .map(|(name, table)| {
            let query = format!("SELECT count(*) FROM {table}");
            let count = pg.try_psql_db("consumer", &query).ok().and_then(|c| c.parse().ok());
            (*name, count.unwrap_or(0))
        })
        .collect()
}

/// The Rust example, reading every partition in one process by the marks.
fn rust_example(pg: &Postgres, nats: &Nats) -> Pgoutbox {
    let mut cmd = Command::new(example_consumer_binary());
    cmd.env("NATS_URL", nats.url())
        .env("PARTITIONS", PARTITIONS)
        .env("CONSUMER_DATABASE_URL", pg.url_for("postgres", None, "consumer"));
    Pgoutbox::spawn(cmd)
}

/// The recipes' instances, by recipe.
struct Instances {
    language: Language,
    running: HashMap<&'static str, Vec<Pgoutbox>>,
    /// The Rust example, which exits when its NATS connection drops (to check the stream
    /// from its database), and is started again.
    example: Pgoutbox,
    /// The logs of the instances killed or exited.
    logs: String,
}

impl Instances {
    fn start(language: Language, pg: &Postgres, nats: &Nats) -> Instances {
        let mut running = HashMap::new();
        for name in RECIPES {
            running.insert(name, (0..2).map(|_| recipe(language, name, pg, nats)).collect());
        }
        Instances { language, running, example: rust_example(pg, nats), logs: String::new() }
    }

    /// Starts the Rust example again if it exited (it does when NATS goes away).
    fn keep_example(&mut self, pg: &Postgres, nats: &Nats) {
        if !self.example.is_running() {
            self.logs.push_str(&format!("--- the Rust example (exited)\n{}", self.example.log()));
            self.example = rust_example(pg, nats);
        }
    }

    /// Kills with -9 the first instance of each recipe (of `whole`, the one reading: the
    /// other waits for its lock) and starts another in its place.
    fn kill_one_of_each(&mut self, pg: &Postgres, nats: &Nats) {
        for name in RECIPES {
            let instances = self.running.get_mut(name).expect("started");
            let i = match name {
                "whole" => instances.iter().position(|i| i.log().contains("reading")).unwrap_or(0),
                _ => 0,
            };
            instances[i].kill9();
            self.logs.push_str(&format!("--- {name} (killed)\n{}", instances[i].log()));
            instances[i] = recipe(self.language, name, pg, nats);
        }
        self.example.kill9();
        self.logs.push_str(&format!("--- the Rust example (killed)\n{}", self.example.log()));
        self.example = rust_example(pg, nats);
    }

    fn logs(&self) -> String {
        let mut logs = self.logs.clone();
        for (name, instances) in &self.running {
            for instance in instances {
                logs.push_str(&format!("--- {name}\n{}", instance.log()));
            }
        }
        logs + &format!("--- the Rust example\n{}", self.example.log())
    }

    fn all_running(&mut self) -> bool {
        self.running.values_mut().flatten().all(Pgoutbox::is_running)
    }
}

async fn recipes_through_faults(language: Language) {
    let started = Instant::now();
    let pg = Postgres::start();
    let mut nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN deliver_at timestamptz");
    pg.psql("CREATE DATABASE consumer");
    // Scheduled rows need nats-server 2.12+; the suite's 2.9 runs the rest, the version
    // matrix's 2.15 all of it (scripts/test-nats-matrix.sh).
    let schedules = nats.release() >= (2, 12);
    let mut args = vec![
        "--partitions",
        PARTITIONS,
        "--subject-template",
        "outbox.{$partition}.{aggregate_type}.{event_type}",
        "--transaction-subject",
        "outbox.transactions",
        "--object-store",
        "PAYLOADS",
    ];
    if schedules {
        args.extend(["--schedule-column", "deliver_at"]);
    }
    // `replay` takes the settings above; only `run` reads emitted events.
    let run: Vec<&str> = [&args[..], &["--message-prefix", "outbox"]].concat();
    let mut app = Pgoutbox::run(&pg, &nats, &run);
    wait_streaming(&app).await;
    let mut instances = Instances::start(language, &pg, &nats);

    let (mut random, mut next, mut ledger) = (Lcg::from_time(), 0u64, Vec::new());
    let mut write = |random: &mut Lcg, count| {
        let (sql, made) = phase(random, &mut next, count, schedules);
        ledger.extend(made.iter().cloned());
        (sql, made.iter().map(Vec::len).sum::<usize>() as u64)
    };
    // Phase 1, then one instance of each recipe killed with -9 while it applies.
    let (sql, mut total) = write(&mut random, 60);
    pg.psql(&sql);
    wait_applied(&pg, &nats, &mut instances, total / 2, "half of phase 1").await;
    instances.kill_one_of_each(&pg, &nats);
    // Phase 2, pgoutbox killed with -9 while it streams it.
    let (sql, count) = write(&mut random, 60);
    total += count;
    let writer = pg.psql_in_background(sql);
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.kill9();
    writer.join().expect("the writer").expect("phase 2 commits");
    app = Pgoutbox::run(&pg, &nats, &run);
    // Phase 3, nats-server restarted while pgoutbox streams it.
    let (sql, count) = write(&mut random, 60);
    total += count;
    let writer = pg.psql_in_background(sql);
    tokio::time::sleep(Duration::from_millis(300)).await;
    nats.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    nats.start_again();
    writer.join().expect("the writer").expect("phase 3 commits");
    // Rows applied before, published again by a replay beside the live pgoutbox.
    let ids = pg.psql("SELECT string_agg(id::text, ',') FROM (SELECT id FROM outbox LIMIT 4) r");
    let mut replay = command(&pg, &nats);
    replay.arg("replay").args(&args).args(["--ids", &ids, "--from-table", "public.outbox"]);
    let replayed = replay.output().expect("pgoutbox replay");
    assert!(replayed.status.success(), "{}", String::from_utf8_lossy(&replayed.stderr));
    let (sql, count) = write(&mut random, 40);
    total += count;
    pg.psql(&sql);

    wait_applied(&pg, &nats, &mut instances, total, "every event applied").await;
    wait_all_acknowledged(&nats).await;
    assert!(app.is_running(), "pgoutbox exited: {}", app.log());
    let logs = instances.logs();
    for (name, table) in TABLES {
        judge(&pg, (name, table), &ledger, &logs);
    }
    assert!(!logs.contains("applied as it is"), "no part is short:\n{logs}");
    if std::env::var_os("RECIPES_LOGS").is_some() {
        eprintln!("{logs}");
    }
    eprintln!(
        "recipes: {total} events in {} transactions ({} scheduled), judged in {:.1} s",
        ledger.len(),
        ledger.iter().flatten().filter(|w| w.scheduled).count(),
        started.elapsed().as_secs_f64()
    );
}

/// Waits until pgoutbox says it streams (its line has said `streaming` with more or fewer
/// fields before `slot=` over time).
async fn wait_streaming(app: &Pgoutbox) {
    crate::support::eventually(Duration::from_secs(30), "pgoutbox streams", || async {
        app.log().lines().any(|l| l.contains(" streaming ") && l.contains("slot=")).then_some(())
    })
    .await;
}

/// Waits (90 s at most) until every recipe applied `at_least` events; fails with the logs.
async fn wait_applied(
    pg: &Postgres,
    nats: &Nats,
    instances: &mut Instances,
    at_least: u64,
    what: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        instances.keep_example(pg, nats);
        let applied = applied(pg);
        if applied.values().all(|n| *n >= at_least) {
            return;
        }
        let running = instances.all_running();
        assert!(
            running && Instant::now() < deadline,
            "{what}: {applied:?} of {at_least} (an instance exited: {})\n{}",
            !running,
            instances.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every recipe's durable consumer has read and acknowledged every message:
/// what the replay and the scheduler stored last included.
async fn wait_all_acknowledged(nats: &Nats) {
    let js = crate::support::stream::jetstream(&nats.url()).await;
    let durables: Vec<String> = (0..PARTITIONS.parse().expect("a number"))
        .map(|p| format!("ordered-{p}"))
        .chain(["once".to_owned(), "whole".to_owned()])
        .collect();
    crate::support::eventually(Duration::from_secs(30), "every message acknowledged", || async {
        let stream = js.get_stream("OUTBOX").await.ok()?;
        for name in &durables {
            let info = stream.consumer_info(name).await.ok()?;
            if info.num_pending > 0 || info.num_ack_pending > 0 {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// What recipe `name` applied (in `table`), against what was committed: each event once
/// (scheduled ones included); but for `once`, each key's events (not scheduled) in commit
/// order; for `whole` and the Rust example, each transaction's events (not scheduled) in
/// one transaction of the database holding them alone.
fn judge(pg: &Postgres, (name, table): (&str, &str), ledger: &[Vec<Written>], logs: &str) {
    let rows = pg.psql_db(
        "consumer",
        &format!(
            "SELECT convert_from(payload, 'UTF8')::json->>'n', applied_in, applied_order \
             FROM {table}"
        ),
    );
    // Each event: the database transaction it was applied in, and its place in the order.
    let mut applied: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for line in rows.lines() {
        let fields: Vec<u64> = line.split('|').filter_map(|f| f.trim().parse().ok()).collect();
        let [n, applied_in, order] = fields[..] else { panic!("three numbers: {line}") };
        assert!(
            applied.insert(n, (applied_in, order)).is_none(),
            "{name}: event {n} twice\n{logs}"
        );
    }
    let written: Vec<Written> = ledger.iter().flatten().copied().collect();
    let missing: Vec<(u64, bool)> = written
        .iter()
        .filter(|w| !applied.contains_key(&w.n))
        .map(|w| (w.n, w.scheduled))
        .collect();
    assert!(missing.is_empty(), "{name}: events (n, scheduled) never applied: {missing:?}\n{logs}");
    assert_eq!(applied.len(), written.len(), "{name}: events applied");
    if name == "once" {
        return;
    }
    for key in 0..KEYS {
        let orders: Vec<u64> = written
            .iter()
            .filter(|w| w.key == key && !w.scheduled)
            .map(|w| applied[&w.n].1)
            .collect();
        assert!(orders.is_sorted(), "{name}: key {key} applied out of commit order\n{logs}");
    }
    if name == "ordered" {
        return;
    }
    let mut sizes: BTreeMap<u64, usize> = BTreeMap::new();
    for w in written.iter().filter(|w| !w.scheduled) {
        *sizes.entry(applied[&w.n].0).or_default() += 1;
    }
    for transaction in ledger {
        let in_place: Vec<u64> = transaction.iter().filter(|w| !w.scheduled).map(|w| w.n).collect();
        let Some(first) = in_place.first() else { continue };
        let applied_in = applied[first].0;
        let together = in_place.iter().all(|n| applied[n].0 == applied_in);
        assert!(
            together && sizes[&applied_in] == in_place.len(),
            "{name}: transaction {in_place:?} not applied whole and alone\n{logs}"
        );
    }
}
