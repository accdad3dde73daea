//! Large payloads through the Object Store (issue 48), `--large-payloads`: the time from a
//! row's commit to its pointer stored, and pgoutbox's peak RSS, beside the limit measured in
//! the same run on the same servers: async-nats storing the same payload, already in
//! memory, in a bucket of its own (each 128 KiB chunk waits for its acknowledgement).

use std::time::{Duration, Instant};

use async_nats::jetstream;

use super::support::pgoutbox::{Pgoutbox, command};
use super::support::{Nats, Postgres, peak_rss_bytes, wait_until_streaming};
use super::{row, wait_for_count};

const MIB: usize = 1024 * 1024;
/// The payload sizes measured, MiB: the two.
const SIZES: [usize; 2] = [20, 100];

/// One run's figures, a value per size in [`SIZES`].
#[derive(Default)]
pub struct Figures {
    /// Commit (the INSERT returned) → the pointer stored in the stream, ms (row order: 20 MiB,
    /// a small row, 100 MiB, a small row).
    stored_ms: [Vec<f64>; 2],
    /// The same payload put from memory by async-nats, ms.
    limit_ms: [Vec<f64>; 2],
    /// pgoutbox's peak RSS (VmHWM) once streaming, then after each row, MiB.
    rss_before_mib: Vec<f64>,
    rss_after_mib: [Vec<f64>; 2],
}

pub async fn run(figures: &mut Figures) {
    let pg = Postgres::start();
    let nats = Nats::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.expect("NATS"));
    pg.psql(include_str!("../../sql/outbox.sql"));
    let mut cmd = command(&pg, &nats);
    cmd.env("RUST_LOG", "info").args(["run", "--object-store", "PAYLOADS"]);
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    figures.rss_before_mib.push(mib(peak_rss_bytes(app.pid())));
    for (i, size) in SIZES.iter().enumerate() {
        eprintln!("  a {size} MiB row through pgoutbox");
        pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', '{i}', 'created', to_jsonb(repeat('x', {})))",
            size * MIB - 2
        ));
        let committed = Instant::now();
        wait_for_count(&js, "OUTBOX", 2 * i as u64 + 1, Duration::from_secs(600)).await;
        figures.stored_ms[i].push(committed.elapsed().as_secs_f64() * 1e3);
        // A small row behind it: the last row sent is kept until the next one is decoded
        // (for a late collision's dead letter), so back to back both would be held.
        pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', 'small-{i}', 'created', '{{}}')"
        ));
        wait_for_count(&js, "OUTBOX", 2 * i as u64 + 2, Duration::from_secs(60)).await;
        figures.rss_after_mib[i].push(mib(peak_rss_bytes(app.pid())));
    }
    drop(app);
    let limit = jetstream::object_store::Config { bucket: "LIMIT".into(), ..Default::default() };
    let store = js.create_object_store(limit).await.expect("the limit's bucket");
    for (i, size) in SIZES.iter().enumerate() {
        eprintln!("  a {size} MiB put by async-nats");
        let payload = vec![b'x'; size * MIB];
        let started = Instant::now();
        store.put(format!("{i}").as_str(), &mut payload.as_slice()).await.expect("put");
        figures.limit_ms[i].push(started.elapsed().as_secs_f64() * 1e3);
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

pub fn print(f: &Figures) {
    println!("\n| figure | median | min | max | target |\n| --- | ---: | ---: | ---: | --- |");
    row("pgoutbox peak RSS streaming, MiB", &f.rss_before_mib, "-".into());
    for (i, size) in SIZES.iter().enumerate() {
        row(&format!("limit: async-nats put of {size} MiB, ms"), &f.limit_ms[i], "-".into());
        row(&format!("pgoutbox: {size} MiB row commit → pointer, ms"), &f.stored_ms[i], "-".into());
        let rss = format!("≤ streaming + {size} MiB + 8 MiB");
        row(&format!("pgoutbox peak RSS after {size} MiB, MiB"), &f.rss_after_mib[i], rss);
    }
}
