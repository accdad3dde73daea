//! `pgoutbox replay`: chosen rows of the outbox table published again. Killed at a random
//! moment and resumed with its id, a replay stores every row once, in order; a dead letter
//! fixed in the table goes out again on its own subject; a stream a live pgoutbox writes is
//! refused.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{assert_once_in_order, count, jetstream, read_all};
use crate::support::{
    Lcg, Nats, Postgres, eventually, numbered_rows, stop_and_wait_released, wait_until_streaming,
};

/// `pgoutbox replay <args>` into a stream of its own, `REPLAY`.
fn replay(pg: &Postgres, nats: &Nats, args: &[&str]) -> Pgoutbox {
    let mut cmd = command(pg, nats);
    cmd.args(["--stream", "REPLAY", "--subject-template", "replay.{aggregate_type}.{event_type}"])
        .args(["--dead-letter-subject", "replay.dead_letter", "replay"])
        .args(args);
    Pgoutbox::spawn(cmd)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_killed_at_a_random_moment_resumes_and_stores_each_row_once() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(&numbered_rows(0, 100_000, 5_000));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let id = format!("r{now}");
    let args = ["--created-from", "-infinity", "--replay-id", id.as_str()];
    let mut first = replay(&pg, &nats, &args);
    let js = jetstream(&nats.url()).await;
    let kill_at = Lcg::from_time().between(1_000, 60_000);
    eventually(Duration::from_secs(60), "part of the replay stored", || async {
        (count(&js, "REPLAY").await >= kill_at).then_some(())
    })
    .await;
    first.kill9();
    let stored_when_killed = count(&js, "REPLAY").await;
    assert!(stored_when_killed < 100_000, "killed too late:\n{}", first.log());

    let mut resumed = replay(&pg, &nats, &args);
    let status = resumed.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "{}", resumed.log());
    assert!(resumed.log().contains("stored by this replay before"), "{}", resumed.log());
    let context = format!("killed at {stored_when_killed}");
    assert_once_in_order(&read_all(&js, "REPLAY").await, 100_000, &context);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_fixed_in_the_table_is_replayed_and_a_live_stream_is_refused() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 5, 5));
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('bad type', '5', 'created', '{\"n\": 5}')",
    );
    pg.psql(&numbered_rows(6, 10, 4));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "9 rows and a dead letter stored", || async {
        (count(&js, "OUTBOX").await == 10).then_some(())
    })
    .await;

    // Beside a live pgoutbox: refused, nothing stored.
    let mut live = command(&pg, &nats);
    live.args(["replay", "--dead-letters"]);
    let output = live.output().expect("replay runs");
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("stop it first"), "{said}");
    stop_and_wait_released(&pg, app).await;

    pg.psql("UPDATE outbox SET aggregate_type = 'order' WHERE aggregate_type = 'bad type'");
    let dry = command(&pg, &nats).args(["replay", "--dead-letters", "--dry-run"]).output();
    let dry = dry.expect("replay runs");
    assert!(String::from_utf8_lossy(&dry.stdout).contains("would publish up to 1 rows"));
    assert_eq!(count(&js, "OUTBOX").await, 10, "a dry run stored something");
    let fixed = command(&pg, &nats).args(["replay", "--dead-letters"]).output();
    let fixed = fixed.expect("replay runs");
    assert!(fixed.status.success(), "{}", String::from_utf8_lossy(&fixed.stderr));

    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(10, 20, 5));
    eventually(Duration::from_secs(30), "the new rows stored", || async {
        (count(&js, "OUTBOX").await == 21).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    let fixed: Vec<_> = stored.iter().filter(|m| m.subject == "outbox.order.created").collect();
    let fives: Vec<_> = fixed.iter().filter(|m| m.json()["n"] == 5).collect();
    assert_eq!(fives.len(), 1, "the fixed row once on its subject");
    assert!(fives[0].header("Pgoutbox-Replay").is_some());
    assert_eq!(fixed.len(), 20, "every row once on its subject: {}", fixed.len());
}
