//! pgoutbox's own publishing connection (src/nats/outbound.rs): idle, it answers the
//! server's pings and keeps its connection; it is one of two named `pgoutbox` on the server.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, http_get, numbered_rows, wait_until_streaming};

/// The ids of the connections named `pgoutbox`, as the server lists them.
fn pgoutbox_connections(nats: &Nats) -> BTreeSet<u64> {
    let (_, body) = http_get(nats.monitor_port(), "/connz").expect("/connz answers");
    let connz: serde_json::Value = serde_json::from_str(&body).expect("/connz is JSON");
    connz["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == "pgoutbox")
        .filter_map(|c| c["cid"].as_u64())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_publishing_connection_answers_the_servers_pings() {
    let dir = tempfile::tempdir().expect("dir");
    let conf = dir.path().join("nats.conf");
    // A client that leaves two pings unanswered is closed as stale within 3 s.
    std::fs::write(&conf, "ping_interval: \"1s\"\nping_max: 2\n").expect("write nats.conf");
    let nats = Nats::start_with_args(&["-c", conf.to_str().expect("UTF-8 path")]);
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    pg.psql(&numbered_rows(0, 1, 1));
    eventually(Duration::from_secs(20), "the first row stored", || async {
        (count(&js, "OUTBOX").await == 1).then_some(())
    })
    .await;

    let connections = pgoutbox_connections(&nats);
    assert_eq!(connections.len(), 2, "the client's and the publishing connection");
    // Idle for six ping intervals: the same two connections the whole time.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let now = pgoutbox_connections(&nats);
        assert_eq!(now, connections, "a connection was closed\nlog:\n{}", app.log());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    pg.psql(&numbered_rows(1, 2, 1));
    eventually(Duration::from_secs(20), "the second row stored", || async {
        (count(&js, "OUTBOX").await == 2).then_some(())
    })
    .await;
    assert_eq!(pgoutbox_connections(&nats), connections, "log:\n{}", app.log());
    assert!(!app.log().contains("publishing connection to NATS ended"), "{}", app.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_server_first_in_the_list_is_passed_over() {
    let nats = Nats::start();
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    // Nothing listens on a port just found free.
    let dead = format!("nats://127.0.0.1:{}", crate::support::free_port());
    let mut cmd = crate::support::pgoutbox::command(&pg, &nats);
    cmd.env("PGOUTBOX_NATS_URL", format!("{dead},{}", nats.url())).arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    pg.psql(&numbered_rows(0, 10, 5));
    eventually(Duration::from_secs(30), "rows stored through the live server", || async {
        (count(&js, "OUTBOX").await == 10).then_some(())
    })
    .await;
    assert_eq!(pgoutbox_connections(&nats).len(), 2, "log:\n{}", app.log());
}
