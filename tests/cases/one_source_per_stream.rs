//! The stream's tail is trusted only when this source wrote it, in this history. Another
//! database on the same stream is refused before it confirms anything; a cluster restored
//! to an earlier point skips none of its new rows; a missing slot is re-created only when
//! the stream holds nothing of this source, whatever the stream's tail looks like.

use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming_on};

/// `pgoutbox run` for database `db` through slot `slot`, plus `args`.
fn run_for(pg: &Postgres, nats: &Nats, db: &str, slot: &str, args: &[&str]) -> Pgoutbox {
    let mut cmd = command(pg, nats);
    cmd.arg("run")
        .args(["--database-url", &pg.url_for("postgres", None, db), "--slot", slot])
        .args(args);
    Pgoutbox::spawn(cmd)
}

fn slot_confirmed(pg: &Postgres, slot: &str) -> String {
    pg.psql(&format!(
        "SELECT coalesce(confirmed_flush_lsn::text, '-') FROM pg_replication_slots \
         WHERE slot_name = '{slot}'"
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_database_on_the_same_stream_is_refused_and_loses_nothing() {
    let pg = Postgres::start();
    let nats = Nats::start();
    for db in ["app_a", "app_b"] {
        pg.psql(&format!("CREATE DATABASE {db}"));
        pg.psql_db(db, include_str!("../../sql/outbox.sql"));
    }
    let a = run_for(&pg, &nats, "app_a", "slot_a", &[]);
    wait_until_streaming_on(&pg, "slot_a", &a).await;

    // Everything else default: both would write stream OUTBOX.
    let mut b = run_for(&pg, &nats, "app_b", "slot_b", &[]);
    let status = b.wait_exit(Duration::from_secs(30));
    let log = b.log();
    assert!(!status.success(), "a second source started on stream OUTBOX:\n{log}");
    let needles =
        ["stream OUTBOX", "/app_a/slot_a", "--stream", "--subject-template", "slot slot_b"];
    for needle in needles {
        assert!(log.contains(needle), "{needle:?} missing from the refusal:\n{log}");
    }
    let b_slot_before = slot_confirmed(&pg, "slot_b");

    for round in 0..10 {
        let from = round * 100;
        pg.psql_db("app_a", &numbered_rows(from, from + 100, 100));
        pg.psql_db("app_b", &numbered_rows(from, from + 100, 100));
    }
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "A's 1,000 rows stored", || async {
        (count(&js, "OUTBOX").await >= 1_000).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    let report = audit(&stored, 1_000);
    assert_eq!(
        (report.stored, report.duplicates, report.order_violations, report.lost),
        (1_000, 0, 0, 0)
    );
    assert_eq!(slot_confirmed(&pg, "slot_b"), b_slot_before, "the refused source confirmed");

    // The fix the refusal names: a stream and subjects of its own. Its slot kept every row.
    let b = run_for(
        &pg,
        &nats,
        "app_b",
        "slot_b",
        &[
            "--stream",
            "OUTBOX_app_b",
            "--subject-template",
            "outbox_app_b.{aggregate_type}.{event_type}",
            "--dead-letter-subject",
            "outbox_app_b.dead_letter",
        ],
    );
    wait_until_streaming_on(&pg, "slot_b", &b).await;
    eventually(Duration::from_secs(30), "B's 1,000 rows stored in its own stream", || async {
        (count(&js, "OUTBOX_app_b").await >= 1_000).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX_app_b").await, 1_000);
    assert_eq!(
        (report.stored, report.duplicates, report.order_violations, report.lost),
        (1_000, 0, 0, 0)
    );
    assert_eq!(count(&js, "OUTBOX").await, 1_000, "B wrote into A's stream");
}

/// Streams `rows` rows numbered from `from` with a fresh pgoutbox, then stops it.
async fn stream_rows(pg: &Postgres, nats: &Nats, from: usize, rows: usize, args: &[&str]) {
    let js = jetstream(&nats.url()).await;
    let before = count(&js, "OUTBOX").await;
    let app = Pgoutbox::run(pg, nats, args);
    crate::support::wait_until_streaming(pg, &app).await;
    pg.psql(&numbered_rows(from, from + rows, 10));
    eventually(Duration::from_secs(30), "rows stored", || async {
        (count(&js, "OUTBOX").await == before + rows as u64).then_some(())
    })
    .await;
    crate::support::stop_and_wait_released(pg, app).await;
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let status =
        std::process::Command::new("cp").arg("-a").arg(from).arg(to).status().expect("run cp");
    assert!(status.success(), "cp -a {} {}", from.display(), to.display());
}

/// Streams 10 rows, takes a file-level copy of the stopped cluster, streams 200 more (the
/// stream's tail moves past the copy's WAL), then puts the copy back in place and starts it:
/// the system id and timeline stay, and WAL positions from before the tail are handed out
/// again.
async fn restore_an_older_copy(pg: &mut Postgres, nats: &Nats) {
    pg.psql(include_str!("../../sql/outbox.sql"));
    stream_rows(pg, nats, 0, 10, &[]).await;
    pg.stop("fast");
    let backup = pg.socket_dir().join("backup");
    copy_dir(&pg.data_dir(), &backup);
    pg.start_again();
    stream_rows(pg, nats, 10, 200, &[]).await;
    pg.stop("fast");
    std::fs::remove_dir_all(pg.data_dir()).expect("remove data dir");
    std::fs::rename(&backup, pg.data_dir()).expect("restore the backup");
    pg.start_again();
}

/// Waits until the stream holds the 10 rows numbered from 1,000, each once.
async fn assert_new_rows_stored(nats: &Nats) {
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "the 10 rows committed after the restore", || async {
        let stored = read_all(&js, "OUTBOX").await;
        let new = stored.iter().filter(|m| m.json()["n"].as_u64() >= Some(1_000)).count();
        (new == 10).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_restored_to_an_earlier_point_skips_none_of_its_new_rows() {
    let mut pg = Postgres::start();
    let nats = Nats::start();
    restore_an_older_copy(&mut pg, &nats).await;
    let app = Pgoutbox::run(&pg, &nats, &[]);
    crate::support::wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(1_000, 1_010, 1));
    assert_new_rows_stored(&nats).await;
}

/// The restored copy's WAL grows past the stream's tail before pgoutbox starts, so the tail
/// lies inside the server's WAL and names this very system id and timeline: only the row
/// the slot sends at the tail's position tells the two histories apart.
#[tokio::test(flavor = "multi_thread")]
async fn a_restored_copy_whose_wal_passed_the_tail_skips_none_of_its_new_rows() {
    let mut pg = Postgres::start();
    let nats = Nats::start();
    restore_an_older_copy(&mut pg, &nats).await;
    pg.psql(&numbered_rows(1_000, 1_010, 1));
    pg.psql("SELECT pg_switch_wal()");
    pg.psql("CHECKPOINT");
    let app = Pgoutbox::run(&pg, &nats, &[]);
    crate::support::wait_until_streaming(&pg, &app).await;
    assert_new_rows_stored(&nats).await;
    assert!(app.log().contains("not in this server's WAL"), "log:\n{}", app.log());
}

async fn assert_missing_slot_refused(pg: &Postgres, nats: &Nats) {
    let mut app = Pgoutbox::run(pg, nats, &[]);
    let status = app.wait_exit(Duration::from_secs(30));
    let log = app.log();
    assert!(!status.success(), "pgoutbox went on without its slot:\n{log}");
    assert!(log.contains("--recreate-slot"), "no fix named:\n{log}");
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_replication_slots"),
        "0",
        "a slot was created silently:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_slot_is_never_recreated_silently_after_the_stream_was_purged() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    stream_rows(&pg, &nats, 0, 10, &[]).await;
    let js = jetstream(&nats.url()).await;
    js.get_stream("OUTBOX").await.expect("stream").purge().await.expect("purge");
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    assert_missing_slot_refused(&pg, &nats).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_slot_is_never_recreated_silently_behind_another_writers_message() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    stream_rows(&pg, &nats, 0, 10, &[]).await;
    let js = jetstream(&nats.url()).await;
    js.publish("outbox.other.app", "not from pgoutbox".into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    assert_missing_slot_refused(&pg, &nats).await;
}
