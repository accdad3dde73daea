//! A throwaway three-server NATS cluster with JetStream on loopback: each server has its own
//! ports and store directory, and the monitoring endpoint (`/jsz`, `/connz`) tells the tests
//! which server leads a stream and which one a client is connected to.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Nats, free_port, http_get};

pub struct NatsCluster {
    nodes: Vec<Nats>,
}

impl NatsCluster {
    /// Three servers named n0, n1 and n2, routed to each other; returns once they agree on a
    /// JetStream meta leader.
    pub fn start() -> NatsCluster {
        NatsCluster::launch(false)
    }

    /// The same, each server's store on a lazy disk of its own (`Nats::start_on_lazy_disk`).
    pub fn start_on_lazy_disks() -> NatsCluster {
        NatsCluster::launch(true)
    }

    fn launch(lazy: bool) -> NatsCluster {
        let cluster_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let routes = cluster_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let nodes = cluster_ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let name = format!("n{i}");
                let listen = format!("nats://127.0.0.1:{port}");
                let args = [
                    "--server_name",
                    &name,
                    "--cluster_name",
                    "pgoutbox-test",
                    "--cluster",
                    &listen,
                    "--routes",
                    &routes,
                ];
                match lazy {
                    true => Nats::start_on_lazy_disk_with_args(&args, ""),
                    false => Nats::start_with_args(&args),
                }
            })
            .collect();
        let cluster = NatsCluster { nodes };
        cluster.wait_for_meta_leader();
        cluster
    }

    /// Every server, comma-separated, as `--nats-url` takes them.
    pub fn urls(&self) -> String {
        self.nodes.iter().map(Nats::url).collect::<Vec<_>>().join(",")
    }

    pub fn node(&mut self, index: usize) -> &mut Nats {
        &mut self.nodes[index]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The server that leads `stream`'s replication group, as that server itself reports.
    pub fn stream_leader(&self, stream: &str) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| {
            self.stream_detail(i, stream)
                .is_some_and(|d| d["cluster"]["leader"].as_str() == Some(&format!("n{i}")))
        })
    }

    /// Waits until a live server leads `stream` and its leader sees every replica caught up:
    /// current, or seen within 2 s and under 1,000 operations behind. Under a steady load a
    /// replica that keeps up is often a few operations behind at the instant it is sampled (2.15
    /// reported `current: false` for over 120 s to a poll every 100 ms while rows flowed).
    pub fn wait_until_stream_healthy(&self, stream: &str, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut last_seen = Value::Null;
        loop {
            if let Some(leader) = self.stream_leader(stream) {
                let detail = self.stream_detail(leader, stream).unwrap_or_default();
                last_seen = detail["cluster"].clone();
                let replicas =
                    detail["cluster"]["replicas"].as_array().cloned().unwrap_or_default();
                if replicas.len() == self.nodes.len() - 1 && replicas.iter().all(caught_up) {
                    return leader;
                }
            }
            assert!(
                Instant::now() < deadline,
                "stream {stream} did not get a leader with caught-up replicas in {timeout:?}; \
                 last seen: {last_seen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server a client that connected with `name` is connected to.
    pub fn connected_to(&self, name: &str) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| {
            self.monitor(i, "/connz").is_some_and(|connz| {
                connz["connections"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["name"].as_str() == Some(name)))
            })
        })
    }

    fn stream_detail(&self, node: usize, stream: &str) -> Option<Value> {
        let jsz = self.monitor(node, "/jsz?accounts=true&streams=true")?;
        jsz["account_details"]
            .as_array()?
            .iter()
            .flat_map(|a| a["stream_detail"].as_array().cloned().unwrap_or_default())
            .find(|s| s["name"].as_str() == Some(stream))
    }

    fn monitor(&self, node: usize, path: &str) -> Option<Value> {
        let (code, body) = http_get(self.nodes[node].monitor_port(), path)?;
        (code == 200).then(|| serde_json::from_str(&body).ok()).flatten()
    }

    fn wait_for_meta_leader(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let leaders: Vec<Option<String>> = (0..self.nodes.len())
                .map(|i| {
                    let jsz = self.monitor(i, "/jsz")?;
                    jsz["meta_cluster"]["leader"].as_str().map(str::to_owned)
                })
                .collect();
            if leaders[0].as_deref().is_some_and(|l| !l.is_empty())
                && leaders.iter().all(|l| l == &leaders[0])
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the NATS cluster elected no meta leader in 30 s: {leaders:?}; log of n0:\n{}",
                self.nodes[0].log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A replica as its leader reports it in `/jsz`: `active` is nanoseconds since it was seen.
fn caught_up(replica: &Value) -> bool {
    let seen_lately = replica["active"].as_u64().is_some_and(|nanos| nanos < 2_000_000_000);
    let close_behind = replica["lag"].as_u64().is_some_and(|lag| lag < 1_000);
    replica["current"].as_bool() == Some(true)
        || (seen_lately && close_behind && replica["offline"].as_bool() != Some(true))
}
