//! Shared helpers for the integration tests: throwaway servers, the pgoutbox binary, and
//! readers that check what reached JetStream. Compiled once, into the one test binary.

pub mod certs;
pub mod cluster;
pub mod lazyfs;
pub mod nats;
pub mod otlp;
pub mod pg_bin;
pub mod pgoutbox;
pub mod postgres;
pub mod proxy;
pub mod soak;
pub mod standby;
pub mod stream;

use std::future::Future;
use std::net::TcpListener;
use std::time::{Duration, Instant};

pub use nats::Nats;
pub use postgres::Postgres;

/// Polls `check` every 50 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A port nothing listens on right now, below the kernel's ephemeral range. A server
/// restarted on its port must find it free; an ephemeral port may meanwhile be the source
/// port of an outgoing connection, even of a client retrying that very server on loopback
/// (TCP then connects the socket to itself), which made cluster restarts fail.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000, ephemeral_low.max(10_100));
    let seed = u64::from(std::process::id()) << 32;
    for _ in 0..1_000 {
        let draw = DRAWS.fetch_add(1, Ordering::Relaxed);
        let port = Lcg(seed ^ draw.wrapping_mul(0x9E37_79B9_7F4A_7C15)).between(low, high) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {low} and {high}")
}

/// Waits until `app` holds slot `pgoutbox` and streams; see [`wait_until_streaming_on`].
pub async fn wait_until_streaming(pg: &Postgres, app: &pgoutbox::Pgoutbox) {
    wait_until_streaming_on(pg, "pgoutbox", app).await;
}

/// Waits until `app` holds `slot` and streams: the slot is active and pgoutbox has said
/// "streaming". The slot alone is not enough: it is active while it is being created, before
/// pgoutbox has claimed its stream. A test that stopped NATS at that moment caught pgoutbox
/// still setting up, and one that started a second source then saw that source claim the
/// stream first.
pub async fn wait_until_streaming_on(pg: &Postgres, slot: &str, app: &pgoutbox::Pgoutbox) {
    let query = format!("SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'");
    let deadline = Instant::now() + Duration::from_secs(30);
    while pg.try_psql(&query).as_deref() != Ok("t") {
        assert!(Instant::now() < deadline, "pgoutbox never held slot {slot}; log:\n{}", app.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    loop {
        let log = app.log();
        if log.contains(": streaming slot=") || log.contains(r#""message":"streaming""#) {
            return;
        }
        assert!(Instant::now() < deadline, "pgoutbox never said it streams; log:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An outbox whose ids come from a sequence, which `TRUNCATE … RESTART IDENTITY` restarts.
pub const BIGSERIAL_OUTBOX: &str = "CREATE TABLE outbox (id bigserial PRIMARY KEY, \
    aggregate_type text, aggregate_id text, event_type text, payload jsonb, headers jsonb, \
    created_at timestamptz DEFAULT now())";

/// SQL inserting rows `from..to` in transactions of `per_tx` rows, each with payload
/// `{"n": n}`, so that `n` is the commit order (see `stream::audit`).
pub fn numbered_rows(from: usize, to: usize, per_tx: usize) -> String {
    let mut sql = String::new();
    let mut start = from;
    while start < to {
        let end = (start + per_tx).min(to) - 1;
        sql.push_str(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', n::text, 'created', jsonb_build_object('n', n) \
             FROM generate_series({start}, {end}) AS n;\n"
        ));
        start = end + 1;
    }
    sql
}

/// Like [`numbered_rows`], alternating 1-row and `big`-row transactions, with a short pause
/// between transactions so the rows keep arriving while a test injects faults.
pub fn mixed_rows(from: usize, to: usize, big_tx: usize, pause_seconds: f64) -> String {
    let mut sql = String::new();
    let mut start = from;
    let mut big = false;
    while start < to {
        let size = if big { big_tx } else { 1 };
        let end = (start + size).min(to);
        sql.push_str(&numbered_rows(start, end, size));
        if pause_seconds > 0.0 {
            sql.push_str(&format!("SELECT pg_sleep({pause_seconds});\n"));
        }
        start = end;
        big = !big;
    }
    sql
}

/// Peak resident memory of a process, in bytes (VmHWM from /proc).
pub fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM line");
    let kb: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmHWM kB");
    kb * 1024
}

/// A small deterministic pseudo-random sequence (no extra crate), seeded per run.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn from_time() -> Lcg {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(42);
        eprintln!("random seed: {seed}");
        Lcg(seed)
    }

    /// A number in `low..high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        low + (self.0 >> 33) % (high - low)
    }
}

/// The `confirmed_flush_lsn` of the default slot, as text.
pub fn confirmed_flush(pg: &Postgres) -> String {
    pg.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'pgoutbox'")
}

/// A plain HTTP/1.0 GET on 127.0.0.1: the status code and the body.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// The value of the series on pgoutbox's `/metrics` (at `port`) whose line starts with
/// `series`: a name and a space, or a name with its labels.
pub fn metric(port: u16, series: &str) -> Option<f64> {
    let (_, text) = http_get(port, "/metrics")?;
    let line = text.lines().find(|l| l.starts_with(series))?;
    line.rsplit(' ').next()?.parse::<f64>().ok()
}

/// Stops `app` gracefully and waits until Postgres shows its slot released (no slot active:
/// a test's own witness slot is never held).
pub async fn stop_and_wait_released(pg: &Postgres, app: pgoutbox::Pgoutbox) {
    app.sigterm();
    drop(app);
    eventually(Duration::from_secs(10), "slot released", || async {
        let active = "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots";
        (pg.psql(active) == "f").then_some(())
    })
    .await;
}

/// `X/Y` as Postgres prints an LSN, as a number.
pub fn parse_lsn(text: &str) -> u64 {
    let (high, low) = text.split_once('/').expect("an LSN looks like X/Y");
    let high = u64::from_str_radix(high, 16).expect("LSN high half is hex");
    let low = u64::from_str_radix(low, 16).expect("LSN low half is hex");
    (high << 32) | low
}

/// One reading of the slot's `confirmed_flush_lsn` and when it was read.
#[derive(Debug, Clone, Copy)]
pub struct ConfirmedSample {
    pub confirmed: u64,
    /// Taken after the query returned, in nanoseconds since the Unix epoch.
    pub taken_at_nanos: i128,
}

/// Reads the default slot's `confirmed_flush_lsn` every 100 ms on a thread, until
/// [`ConfirmedSampler::finish`]; see [`stream::confirmed_ahead_of_stored`].
pub struct ConfirmedSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Vec<ConfirmedSample>>,
}

impl ConfirmedSampler {
    pub fn start(pg: &Postgres) -> ConfirmedSampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let pg = pg.client_handle();
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let query = "SELECT confirmed_flush_lsn FROM pg_replication_slots \
                             WHERE slot_name = 'pgoutbox'";
                if let Ok(lsn) = pg.try_psql(query) {
                    let taken_at_nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos() as i128)
                        .unwrap_or_default();
                    samples.push(ConfirmedSample { confirmed: parse_lsn(&lsn), taken_at_nanos });
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        });
        ConfirmedSampler { stop, handle }
    }

    pub fn finish(self) -> Vec<ConfirmedSample> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().expect("sampler thread")
    }
}
