//! pgoutbox on a three-server NATS cluster with an R3 stream, while rows commit in 1-row and
//! 100-row transactions: the stream leader killed (twice), the server pgoutbox is connected
//! to killed, and quorum lost. pgoutbox never exits, the slot is never confirmed past a row
//! JetStream has not stored, and afterwards every row is stored once, in commit order.

use std::time::Duration;

use crate::support::cluster::NatsCluster;
use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::postgres::Writer;
use crate::support::stream::{audit, confirmed_ahead_of_stored, count, jetstream, read_all};
use crate::support::{ConfirmedSampler, Lcg, Postgres, eventually, wait_until_streaming};

const STREAM: &str = "OUTBOX";

/// Postgres, the cluster, pgoutbox on every server's URL, a writer and a sampler of the slot.
struct Cluster {
    pg: Postgres,
    nats: NatsCluster,
    app: Pgoutbox,
    js: async_nats::jetstream::Context,
    writer: Writer,
    sampler: ConfirmedSampler,
}

impl Cluster {
    async fn start() -> Cluster {
        let pg = Postgres::start();
        let mut nats = NatsCluster::start();
        pg.psql(include_str!("../../sql/outbox.sql"));
        let mut cmd = command(&pg, nats.node(0));
        cmd.env("PGOUTBOX_NATS_URL", nats.urls()).env("PGOUTBOX_STREAM_REPLICAS", "3").arg("run");
        // No durability horizon: the slot is confirmed as soon as rows are acknowledged, the
        // strictest case for "never confirmed past an unstored row", and the end's check
        // that it catches up needs no 150 s wait.
        cmd.env("PGOUTBOX_DURABILITY_HORIZON", "0s");
        let app = Pgoutbox::spawn(cmd);
        wait_until_streaming(&pg, &app).await;
        nats.wait_until_stream_healthy(STREAM, Duration::from_secs(30));
        let js = jetstream(&nats.urls()).await;
        let writer = pg.start_writer(0, 0.05);
        let sampler = ConfirmedSampler::start(&pg);
        Cluster { pg, nats, app, js, writer, sampler }
    }

    /// Waits until `more` messages beyond what the stream holds now are stored.
    async fn wait_for_progress(&self, more: u64, what: &str) {
        let from = count(&self.js, STREAM).await;
        eventually(Duration::from_secs(90), what, || async {
            (count(&self.js, STREAM).await >= from + more).then_some(())
        })
        .await;
    }

    /// Kills `node` (kill -9) and waits until rows flow again without it.
    async fn kill_and_wait_for_progress(&mut self, node: usize, what: &str) {
        self.nats.node(node).kill();
        self.wait_for_progress(500, what).await;
        self.assert_running();
    }

    /// Starts `node` again and waits until the stream's replicas have caught up.
    fn restart(&mut self, node: usize) {
        self.nats.node(node).start_again();
        // A restarted server catches up in seconds; on a loaded CI host 2.15 took over 60 s.
        self.nats.wait_until_stream_healthy(STREAM, Duration::from_secs(120));
    }

    fn assert_running(&mut self) {
        assert!(self.app.is_running(), "pgoutbox exited; log:\n{}", self.app.log());
    }

    /// Stops writing, waits for every row, and checks exactly-once, order and the slot.
    async fn finish(self) {
        let Cluster { pg, nats: _nats, mut app, js, writer, sampler } = self;
        let total = writer.finish();
        eventually(Duration::from_secs(120), "every committed row stored", || async {
            (count(&js, STREAM).await >= total as u64).then_some(())
        })
        .await;
        // The slot catches up with the last row, then the sampler's view is complete.
        let last_lsn = pg.psql("SELECT pg_current_wal_lsn()");
        eventually(Duration::from_secs(30), "the slot confirms the last row", || async {
            let query = format!(
                "SELECT confirmed_flush_lsn >= '{last_lsn}'::pg_lsn FROM pg_replication_slots"
            );
            (pg.psql(&query) == "t").then_some(())
        })
        .await;
        let samples = sampler.finish();
        assert!(app.is_running(), "pgoutbox exited; log:\n{}", app.log());
        let messages = read_all(&js, STREAM).await;
        let report = audit(&messages, total);
        assert_eq!(report.stored, total, "{report:?}\nlog:\n{}", app.log());
        assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
        let violations = confirmed_ahead_of_stored(&samples, &messages);
        assert!(samples.len() >= 10, "too few samples of the slot: {}", samples.len());
        assert!(violations.is_empty(), "slot confirmed past unstored rows: {violations:#?}");
        let longest_gap = messages
            .windows(2)
            .map(|w| w[1].stored_at_nanos - w[0].stored_at_nanos)
            .max()
            .unwrap_or_default();
        eprintln!(
            "{total} rows, {} slot samples, all stored once in order; longest gap {} ms",
            samples.len(),
            longest_gap / 1_000_000
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_leader_killed_twice() {
    let mut c = Cluster::start().await;
    for round in 1..=2 {
        c.wait_for_progress(500, "rows flowing before the leader is killed").await;
        let leader = c.nats.wait_until_stream_healthy(STREAM, Duration::from_secs(60));
        eprintln!("round {round}: killing stream leader n{leader}");
        c.kill_and_wait_for_progress(leader, "rows flowing under a new leader").await;
        let new_leader = c.nats.stream_leader(STREAM);
        assert!(new_leader.is_some_and(|l| l != leader), "no new leader: {new_leader:?}");
        c.restart(leader);
    }
    c.wait_for_progress(500, "rows flowing after both elections").await;
    c.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connected_server_killed() {
    let mut c = Cluster::start().await;
    c.wait_for_progress(500, "rows flowing before the server is killed").await;
    let connected = c.nats.connected_to("pgoutbox").expect("pgoutbox is connected to a server");
    eprintln!("killing n{connected}, the server pgoutbox is connected to");
    c.kill_and_wait_for_progress(connected, "rows flowing after the server died").await;
    let now = c.nats.connected_to("pgoutbox");
    assert!(now.is_some_and(|n| n != connected), "pgoutbox did not fail over: {now:?}");
    c.restart(connected);
    c.wait_for_progress(500, "rows flowing with the server back").await;
    c.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn quorum_lost_for_a_while() {
    let mut c = Cluster::start().await;
    c.wait_for_progress(500, "rows flowing before quorum is lost").await;
    let leader = c.nats.wait_until_stream_healthy(STREAM, Duration::from_secs(60));
    let other = (leader + 1) % c.nats.len();
    let outage = Duration::from_secs(Lcg::from_time().between(15, 31));
    let stored_before = count(&c.js, STREAM).await;
    eprintln!("killing n{leader} (leader) and n{other} for {outage:?}");
    c.nats.node(leader).kill();
    c.nats.node(other).kill();
    let until = std::time::Instant::now() + outage;
    while std::time::Instant::now() < until {
        c.assert_running();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    c.nats.node(leader).start_again();
    c.nats.node(other).start_again();
    let restarted = std::time::Instant::now();
    c.nats.wait_until_stream_healthy(STREAM, Duration::from_secs(90));
    eventually(Duration::from_secs(90), "rows flowing after quorum is back", || async {
        (count(&c.js, STREAM).await > stored_before + 500).then_some(())
    })
    .await;
    eprintln!("rows flowing {:?} after the servers restarted", restarted.elapsed());
    c.finish().await;
}
