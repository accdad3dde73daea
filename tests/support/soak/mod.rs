//! The pieces of the nemesis soak (`cases::nemesis_soak`, `scripts/soak.sh`): its seeded
//! random numbers and settings, the writers that record what they committed (the outbox's,
//! and the tenants'), and the checkers that hold the stream against those records.

pub mod check;
pub mod consumer;
pub mod objects;
pub mod tenants;
pub mod writer;

use std::collections::BTreeSet;
use std::time::Duration;

/// SplitMix64: one seed replays the writer's transactions and the fault schedule.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// An independent sequence from the same seed, for another thread (`stream` names it).
    pub fn fork(&self, stream: u64) -> Rng {
        let mut forked = Rng(self.0 ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        forked.next();
        forked
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// A duration in `low_ms..=high_ms` milliseconds.
    pub fn millis(&mut self, low_ms: u64, high_ms: u64) -> Duration {
        Duration::from_millis(self.between(low_ms, high_ms))
    }
}

/// What the soak does: each fault kind, the writer's truncate, the tenants and their
/// scheduled rows can be turned off by name in `PGOUTBOX_SOAK_OFF` (comma-separated), to
/// isolate the one that fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// kill -9 pgoutbox, start it again.
    Kill,
    /// SIGSTOP nats-server for 0.5-5 s, then SIGCONT.
    Pause,
    /// Stop nats-server and start it again.
    NatsRestart,
    /// `pg_ctl restart -m fast`.
    PgFast,
    /// `pg_ctl restart -m immediate` (a crash of Postgres).
    PgImmediate,
    /// Stop pgoutbox, drop its slot, start it with `--recover`.
    Recover,
    /// `pgoutbox replay --ids` of a few rows into the live stream; half of the time while
    /// pgoutbox is killed (the replay then publishes by itself).
    Replay,
    /// A power loss of a nats-server that syncs its store every few seconds: killed, what
    /// every stream (the outbox's, the object bucket's, the claim's key-value bucket) stored
    /// in the last 0.5-5 s lost (less than pgoutbox's default durability horizon of 150 s,
    /// which the soak runs with), started again after 0-2 s; half of the time pgoutbox is
    /// killed with it, as on a host they share. The records stored in that time are cut from the
    /// blocks; with `PGOUTBOX_SOAK_LAZY_DISK=1` the nemesis soak's store is on a lazy disk
    /// (`support::lazyfs`), which loses what the server wrote in that time, file by file.
    TailLoss,
}

impl Fault {
    pub const ALL: [Fault; 8] = [
        Fault::Kill,
        Fault::Pause,
        Fault::NatsRestart,
        Fault::PgFast,
        Fault::PgImmediate,
        Fault::Recover,
        Fault::Replay,
        Fault::TailLoss,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::NatsRestart => "nats-restart",
            Fault::PgFast => "pg-fast",
            Fault::PgImmediate => "pg-immediate",
            Fault::Recover => "recover",
            Fault::Replay => "replay",
            Fault::TailLoss => "tail-loss",
        }
    }
}

/// The soak's settings, from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    pub seed: u64,
    pub duration: Duration,
    pub faults: Vec<Fault>,
    pub truncate: bool,
    /// The tenants' writer (`tenants`): tenant schemas created, written, adopted and
    /// dropped beside the outbox, under the `tenant_*.outbox` pattern.
    pub tenants: bool,
    /// Some tenant rows held for a few seconds (`schedules`), when the tenants write and
    /// the nats-server has message schedules (2.12+): the soak says which at the start.
    pub schedules: bool,
    /// The stream's duplicate window (`PGOUTBOX_SOAK_DUPLICATE_WINDOW`, seconds).
    pub duplicate_window: Duration,
    /// Some outbox rows too large for their message (`large`): pgoutbox runs with
    /// `--object-store`, so they go to a bucket whose stream a power loss cuts too.
    pub large: bool,
}

impl Settings {
    /// What else `PGOUTBOX_SOAK_OFF` may turn off, besides the fault kinds.
    pub const OFF: [&str; 4] = ["truncate", "tenants", "schedules", "large"];

    /// `PGOUTBOX_SOAK_MINUTES` (default 3, fractions allowed), `PGOUTBOX_SOAK_SEED`
    /// (default: from the clock), `PGOUTBOX_SOAK_OFF` (fault names, [`Settings::OFF`]),
    /// `PGOUTBOX_SOAK_DUPLICATE_WINDOW` (default 5 s, as in issue 28's F4).
    pub fn from_env() -> Settings {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let minutes: f64 = var("PGOUTBOX_SOAK_MINUTES")
            .map(|m| m.trim().parse().expect("PGOUTBOX_SOAK_MINUTES is a number of minutes"))
            .unwrap_or(3.0);
        let seed = var("PGOUTBOX_SOAK_SEED")
            .map(|s| s.trim().parse().expect("PGOUTBOX_SOAK_SEED is an unsigned integer"))
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64 % 1_000_000)
                    .unwrap_or(1)
            });
        let off: BTreeSet<String> = var("PGOUTBOX_SOAK_OFF")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        let known: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).chain(Settings::OFF).collect();
        for name in &off {
            assert!(
                known.contains(&name.as_str()),
                "PGOUTBOX_SOAK_OFF: {name:?} is not one of {known:?}"
            );
        }
        let window: u64 = var("PGOUTBOX_SOAK_DUPLICATE_WINDOW")
            .map(|w| w.trim().parse().expect("PGOUTBOX_SOAK_DUPLICATE_WINDOW is seconds"))
            .unwrap_or(5);
        Settings {
            seed,
            duration: Duration::from_secs_f64(minutes * 60.0),
            faults: Fault::ALL.into_iter().filter(|f| !off.contains(f.name())).collect(),
            truncate: !off.contains("truncate"),
            tenants: !off.contains("tenants"),
            schedules: !off.contains("schedules"),
            duplicate_window: Duration::from_secs(window),
            large: !off.contains("large"),
        }
    }

    /// The command that runs this soak again: the nemesis soak's, or with `consumer` the
    /// consumer soak's; on the nats-server it ran against.
    pub fn replay_line(&self, consumer: bool) -> String {
        let off: Vec<&str> = Fault::ALL
            .iter()
            .filter(|f| !self.faults.contains(f))
            .map(|f| f.name())
            .chain((!self.truncate).then_some("truncate"))
            .chain((!self.tenants).then_some("tenants"))
            .chain((!self.schedules).then_some("schedules"))
            .chain((!self.large).then_some("large"))
            .collect();
        let minutes = self.duration.as_secs_f64() / 60.0;
        let server = std::env::var("PGOUTBOX_TEST_NATS").ok().filter(|v| !v.is_empty());
        let mut line = server.map(|v| format!("PGOUTBOX_TEST_NATS={v} ")).unwrap_or_default();
        line.push_str("scripts/soak.sh");
        if consumer {
            line.push_str(" --consumer");
        }
        line.push_str(&format!(" --minutes {minutes} --seed {}", self.seed));
        if !off.is_empty() {
            line.push_str(&format!(" --off {}", off.join(",")));
        }
        line
    }
}

/// What the writers and the nemesis share: the writer truncates only while holding it, the
/// tenants' writer drops a tenant only while holding it (and never while the slot is
/// dropped); the nemesis holds it while it picks and replays rows, and to mark the slot
/// dropped.
#[derive(Debug, Default)]
pub struct Gate {
    /// From just before the slot is dropped until the recovery's seed finished.
    pub slot_dropped: bool,
    /// How many truncates the writer made.
    pub epoch: u32,
    /// Each time the slot was dropped.
    pub drops: Vec<SlotDrop>,
}

/// The slot dropped, with pgoutbox stopped: events not yet in the stream then are in the
/// table only, and those a truncate had removed already can be recovered by no one.
#[derive(Debug, Clone, Copy)]
pub struct SlotDrop {
    /// When, in nanoseconds since the Unix epoch (as `Stored::stored_at_nanos`).
    pub at_nanos: i128,
    /// The writer's truncates by then: events of an earlier epoch were out of the table.
    pub epoch: u32,
}
