//! A replay's id is its own: two replays started in the same second both publish, since
//! only `--replay-id` resumes one. A replay that selects no row says so in one line, with
//! how the table's ids look, and exits 3.

use std::process::Output;

use crate::support::pgoutbox::command;
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, numbered_rows};

/// `pgoutbox replay <args>` into a stream of its own, `REPLAY`, run to its end.
fn replay(pg: &Postgres, nats: &Nats, args: &[&str]) -> Output {
    let mut cmd = command(pg, nats);
    // What a user sees: no log lines below warnings.
    cmd.env_remove("RUST_LOG");
    cmd.args(["--stream", "REPLAY", "--subject-template", "replay.{aggregate_type}.{event_type}"])
        .args(["--dead-letter-subject", "replay.dead_letter", "replay"])
        .args(args);
    cmd.output().expect("replay runs")
}

/// The id a replay printed (`replay <id>: …` on stderr).
fn replay_id(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr.lines().find(|l| l.starts_with("replay ")).unwrap_or_default();
    line.trim_start_matches("replay ").split(':').next().unwrap_or_default().to_owned()
}

/// The epoch second a made replay id (`r<seconds>…`) names.
fn second_of(id: &str) -> String {
    id.trim_start_matches('r').split('-').next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replays_started_in_the_same_second_both_publish() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(&numbered_rows(0, 1, 1));
    let row = pg.psql("SELECT id FROM outbox LIMIT 1").trim().to_owned();
    let js = jetstream(&nats.url()).await;
    // Tried until both fall in one second, which is what made them collide.
    for attempt in 0..10 {
        let first = replay(&pg, &nats, &["--ids", &row]);
        let second = replay(&pg, &nats, &["--ids", &row]);
        for output in [&first, &second] {
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
            assert!(stdout.contains(": 1 stored, "), "attempt {attempt}: {stdout}");
        }
        let (a, b) = (replay_id(&first), replay_id(&second));
        assert_ne!(a, b, "two replays shared an id");
        assert_eq!(count(&js, "REPLAY").await, 2 * (attempt + 1), "{a} and {b}");
        if second_of(&a) == second_of(&b) {
            return;
        }
    }
    panic!("no two replays started in the same second in 10 tries");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_that_selects_no_row_says_how_the_ids_look_and_exits_3() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));

    let empty = replay(&pg, &nats, &["--ids", "42,43"]);
    let stderr = String::from_utf8_lossy(&empty.stderr);
    assert_eq!(empty.status.code(), Some(3), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "replay: no row of public.outbox has id 42 or 43; public.outbox is empty"
    );

    pg.psql(&numbered_rows(0, 3, 3));
    let ids = pg.psql("SELECT string_agg(id::text, ' ') FROM outbox");
    let output = replay(&pg, &nats, &["--ids", "42,43"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("replay: no row of public.outbox has id 42 or 43; its ids look like ")
    );
    let shown = ids.split_whitespace().filter(|id| stderr.contains(id)).count();
    assert_eq!(shown, 3, "{stderr} does not show the table's ids {ids}");

    let output =
        replay(&pg, &nats, &["--created-from", "2000-01-01", "--created-to", "2000-01-02"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("was created in [2000-01-01, 2000-01-02)"), "{stderr}");
    let js = jetstream(&nats.url()).await;
    assert_eq!(count(&js, "REPLAY").await, 0, "nothing was selected, nothing is stored");
}
