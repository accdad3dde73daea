//! What `pgoutbox replay` through the live pgoutbox reports at its end (issue 31): it no
//! longer reads its whole run back, it finds its last row near the stream's end. What that
//! read guarded against must still show: a consumer of the slot that confirms the rows
//! without publishing them (a pgoutbox older than the replay table, played here by
//! pg_recvlogical) makes the replay exit non-zero, saying so, instead of reporting rows
//! stored that are not.

use std::process::{Child, Command};
use std::time::Duration;

use crate::support::pg_bin::server;
use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

/// pg_recvlogical streaming from `slot` into /dev/null, confirming what it receives at once.
fn confirm_without_publishing(pg: &Postgres, slot: &str) -> KillOnDrop {
    let mut cmd: Command = server().command("pg_recvlogical");
    cmd.args(["-h", "127.0.0.1", "-p", &pg.port().to_string(), "-U", "postgres"])
        .args(["-d", "postgres", "--slot", slot, "--start", "-f", "/dev/null"])
        .args(["-F", "0", "-s", "1", "--no-loop"])
        .args(["-o", "proto_version=1", "-o", "publication_names=pgoutbox"]);
    KillOnDrop(cmd.spawn().expect("pg_recvlogical starts"))
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// pgoutbox claims the stream, makes its slot and stores 5 rows, then stops: the slot is
/// left inactive.
async fn five_rows_then_stopped(pg: &Postgres, nats: &Nats, js: &async_nats::jetstream::Context) {
    let app = Pgoutbox::run(pg, nats, &[]);
    wait_until_streaming(pg, &app).await;
    pg.psql(&numbered_rows(0, 5, 5));
    eventually(Duration::from_secs(30), "5 rows stored", || async {
        (count(js, "OUTBOX").await == 5).then_some(())
    })
    .await;
    drop(app);
    eventually(Duration::from_secs(30), "the slot free", || async {
        let active =
            pg.psql("SELECT active FROM pg_replication_slots WHERE slot_name = 'pgoutbox'");
        (active == "f").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_confirmed_but_not_published_exits_non_zero_saying_so() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    five_rows_then_stopped(&pg, &nats, &js).await;
    let _reader = confirm_without_publishing(&pg, "pgoutbox");
    eventually(Duration::from_secs(30), "pg_recvlogical streaming", || async {
        let active =
            pg.psql("SELECT active FROM pg_replication_slots WHERE slot_name = 'pgoutbox'");
        (active == "t").then_some(())
    })
    .await;

    let replay = command(&pg, &nats).args(["replay", "--created-from", "-infinity"]).output();
    let replay = replay.expect("replay runs");
    let said = String::from_utf8_lossy(&replay.stderr);
    assert!(said.contains("handed to the pgoutbox streaming"), "{said}");
    assert!(!replay.status.success(), "a replay nobody published reported success: {said}");
    assert!(said.contains("5 rows were handed to pgoutbox and only 0 are in the stream"), "{said}");
    assert_eq!(count(&js, "OUTBOX").await, 5, "nothing was published");
}

/// A replay that finds the slot inactive while pgoutbox is between two attempts (here: a
/// restart just after the replay began) is the running pgoutbox's: it waits until its rows
/// are stored and says so. It used to decide by that one instant, hand the rows over and
/// exit 0 as "published when pgoutbox runs"; a slot dropped next took them along (issue
/// 45's soak, seed 8).
#[tokio::test(flavor = "multi_thread")]
async fn a_replay_while_pgoutbox_restarts_waits_until_its_rows_are_stored() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    five_rows_then_stopped(&pg, &nats, &js).await;

    let mut replay = command(&pg, &nats);
    replay.args(["replay", "--created-from", "-infinity"]);
    let mut replay = Pgoutbox::spawn(replay);
    let _restarted = Pgoutbox::run(&pg, &nats, &[]);
    let status = replay.wait_exit(Duration::from_secs(60));
    let said = replay.log();
    assert!(status.success(), "{said}");
    let waited = said.contains("handed to the pgoutbox streaming into this stream");
    assert!(waited, "the replay did not wait for its rows: {said}");
    assert_eq!(count(&js, "OUTBOX").await, 10, "{said}");
}
