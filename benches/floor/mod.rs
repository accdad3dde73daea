//! The latency floor, measured in the same run as pgoutbox: Postgres's own walsender
//! delivering the same single-row load (test_decoding to pg_recvlogical), each row stamped
//! when its line arrives; and the same rows taken one hop further, published to JetStream as
//! they arrive (acks pipelined, each message shaped as pgoutbox's: its headers, its guards,
//! its size), timed by when JetStream stored them. That hop is a process of its own, this
//! binary in relay mode (`relay_main`, async-nats on a current-thread runtime as pgoutbox
//! runs), so that its CPU is counted beside pg_recvlogical's: the two are what a minimal
//! relay of the same rows costs.
//! pgoutbox is stopped meanwhile and the rows go to a table outside its publication, so
//! the floor has the machine to itself as pgoutbox has in its own step.

use std::future::IntoFuture;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::support::Postgres;
use super::{create_stream, percentiles, pg_bin, steady_writer_at, stored_and_committed};

/// p50, p99 and p99.9 in milliseconds: without the NATS hop, then with it; and the CPU
/// pg_recvlogical spent per row (µs), the client's share of the floor's work.
pub struct Floor {
    pub arrival: [f64; 3],
    pub stored: [f64; 3],
    pub reader_cpu_us_per_row: f64,
    /// The NATS hop's client (`relay_main`) per row, µs: with pg_recvlogical's, what a
    /// minimal relay of the same rows costs.
    pub relay_cpu_us_per_row: f64,
    /// pg_recvlogical's wake-ups per row.
    pub reader_wakeups_per_row: f64,
}

pub async fn measure(
    pg: &Postgres,
    nats_url: &str,
    js: &jetstream::Context,
    rate: u64,
    seconds: u64,
) -> Floor {
    pg.psql("CREATE TABLE IF NOT EXISTS outbox_floor (LIKE outbox INCLUDING DEFAULTS)");
    pg.psql("SELECT pg_create_logical_replication_slot('floor', 'test_decoding')");
    // Kept from step to step, as pgoutbox's stream is: the server's cost per message depends
    // on what the stream already holds (docs/performance.md, "The tail at 3,000/s").
    if js.get_stream("FLOOR").await.is_err() {
        create_stream(js, "FLOOR", "floor.>", 1).await;
    }
    let held = super::stream_count(js, "FLOOR").await as usize;
    let mut reader = std::process::Command::new(pg_bin().join("pg_recvlogical"))
        .args(["-h", "127.0.0.1", "-p", &pg.port().to_string(), "-U", "postgres"])
        .args(["-d", "postgres", "--slot", "floor", "--start", "-f", "-", "--no-loop"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("pg_recvlogical");
    let lines = reader.stdout.take().expect("stdout");
    // The NATS hop in a process of its own, so that its CPU is counted apart from the
    // benchmark's: this binary again, in relay mode (`relay_main`).
    let relay = std::process::Command::new(std::env::current_exe().expect("the bench binary"))
        .args([RELAY_FLAG, nats_url, &held.to_string()])
        .stdin(lines)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the floor's relay");
    let (inserted, _) = steady_writer_at(&pg.url(), "outbox_floor", rate, seconds).await;
    // The rows are all committed; wait for their lines, then stop the reader.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while super::stream_count(js, "FLOOR").await < held as u64 + inserted {
        assert!(tokio::time::Instant::now() < deadline, "the floor's rows never all arrived");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reader_cpu = super::small_transactions::thread_cpu_seconds(reader.id());
    let reader_wakeups = super::small_transactions::wakeups(reader.id());
    let relay_cpu = super::small_transactions::thread_cpu_seconds(relay.id());
    let _ = reader.kill();
    let _ = reader.wait();
    // The relay ends at its input's end, once every ack came, and prints the arrivals.
    let output = relay.wait_with_output().expect("the floor's relay");
    assert!(output.status.success(), "the floor's relay failed");
    let mut arrivals: Vec<f64> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.parse().ok())
        .collect();
    pg.psql("SELECT pg_drop_replication_slot('floor')");
    let times = stored_and_committed(js, "FLOOR", held as u64, inserted).await;
    let mut stored: Vec<f64> = times.iter().map(|(s, c)| ((s - c) * 1e3).max(0.0)).collect();
    Floor {
        arrival: percentiles(&mut arrivals),
        stored: percentiles(&mut stored),
        reader_cpu_us_per_row: reader_cpu * 1e6 / inserted.max(1) as f64,
        reader_wakeups_per_row: reader_wakeups / inserted.max(1) as f64,
        relay_cpu_us_per_row: relay_cpu * 1e6 / inserted.max(1) as f64,
    }
}

/// The argument that makes the bench binary the floor's relay.
pub const RELAY_FLAG: &str = "--floor-relay";

/// The floor's NATS hop, run as `<bench> --floor-relay <nats url> <held>`: each test_decoding
/// line of the floor's table on stdin is stamped as it arrives and published as pgoutbox
/// would publish its row (acks pipelined, read by a task of their own); at the input's end,
/// once every ack came, the arrivals (ms after commit) are printed one per line. A
/// current-thread runtime, as pgoutbox's.
pub fn relay_main(args: &[String]) {
    let (Some(url), Some(held)) = (args.first(), args.get(1).and_then(|h| h.parse().ok())) else {
        panic!("usage: --floor-relay <nats url> <messages held>");
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let arrivals = runtime.expect("runtime").block_on(relay(url, held));
    let lines: Vec<String> = arrivals.iter().map(|a| a.to_string()).collect();
    println!("{}", lines.join("\n"));
}

async fn relay(url: &str, held: usize) -> Vec<f64> {
    let js = jetstream::new(async_nats::connect(url).await.expect("NATS"));
    let (acks, mut acked) = tokio::sync::mpsc::unbounded_channel::<super::AckFuture>();
    let ack_task = tokio::spawn(async move {
        while let Some(ack) = acked.recv().await {
            ack.await.expect("floor ack");
        }
    });
    // Read as pgoutbox reads its socket: non-blocking, woken by epoll (tokio's `stdin()`
    // hands each read to a thread of its blocking pool: a relay slower than it need be).
    let stdin = std::os::fd::AsFd::as_fd(&std::io::stdin()).try_clone_to_owned();
    let pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(stdin.expect("stdin"));
    let mut lines = BufReader::new(pipe.expect("stdin is a pipe")).lines();
    let mut arrivals = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(committed) = row_time(&line) else { continue };
        arrivals.push((now_seconds() - committed) * 1e3);
        let (headers, body) = pgoutbox_like(committed, held + arrivals.len() - 1);
        let ack = js.publish_with_headers("floor.row", headers, body).await;
        let _ = acks.send(Box::pin(ack.expect("floor publish").into_future()));
    }
    drop(acks);
    ack_task.await.expect("floor acks");
    arrivals
}

/// A message shaped as pgoutbox's for the same row: the same headers with values of the same
/// length (each chained to the one before by id and sequence, as pgoutbox's are), the same
/// payload size. The server's work per message grows with its headers and bytes, so the NATS hop of
/// the floor stores what pgoutbox stores.
fn pgoutbox_like(committed: f64, n: usize) -> (async_nats::HeaderMap, bytes::Bytes) {
    let id = |n: usize| format!("00000000-0000-4000-8000-{n:012}");
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", id(n).as_str());
    if n > 0 {
        headers.insert("Nats-Expected-Last-Msg-Id", id(n - 1).as_str());
        headers.insert("Nats-Expected-Last-Sequence", n.to_string().as_str());
    }
    headers.insert("Outbox-Aggregate-Type", "order");
    headers.insert("Outbox-Aggregate-Id", format!("{n}").as_str());
    headers.insert("Outbox-Event-Type", "created");
    headers.insert("Outbox-Created-At", "2026-11-26T18:00:00.000000+00:00");
    headers.insert("Pgoutbox-Position", "0/1A2B3C4D:0");
    headers.insert("Pgoutbox-Source", "7305123456789012345/1");
    let pad = "x".repeat(super::PAD);
    let body = format!("{{\"n\": \"{n}\", \"t\": {committed}, \"pad\": \"{pad}\"}}");
    (headers, body.into())
}

/// The payload's `t` (its transaction's clock, seconds since the Unix epoch) in a
/// test_decoding INSERT line of the floor's table.
fn row_time(line: &str) -> Option<f64> {
    if !line.starts_with("table public.outbox_floor: INSERT:") {
        return None;
    }
    let rest = &line[line.find("\"t\": ")? + 5..];
    rest[..rest.find([',', '}'])?].trim().parse().ok()
}

fn now_seconds() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_row_time_from_a_test_decoding_line() {
        let line = "table public.outbox_floor: INSERT: id[uuid]:'7f' payload[jsonb]:'{\"n\": \"0-1\", \"t\": 1763900000.123456, \"pad\": \"xx\"}'";
        assert_eq!(super::row_time(line), Some(1763900000.123456));
        assert_eq!(super::row_time("BEGIN 42"), None);
    }
}
