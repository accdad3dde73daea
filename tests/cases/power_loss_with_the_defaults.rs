//! A power loss of the NATS host with pgoutbox's defaults, and every loss pgoutbox names
//! brought back (issue 56): the two cases the issue names besides its table, which
//! `nats_forgets` holds.

use std::collections::HashSet;
use std::time::Duration;

use super::nats_forgets::{
    NO_HORIZON, lazy_nats, loss_line, now_holds, rows_with_an_unsynced_tail,
    slot_confirmed_everything, stored,
};
use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{assert_once_in_order, jetstream, read_all};
use crate::support::{
    Nats, Postgres, eventually, metric, numbered_rows, stop_and_wait_released, wait_until_streaming,
};

/// A burst, then pgoutbox and nats-server killed within a second of its acknowledgement,
/// before any record of it reached Postgres; the burst never reached the server's disk
/// (its store on a lazy one). With the defaults the slot never confirmed the burst: the
/// next start publishes again what the stream forgot, and all 1,100 rows are stored once,
/// in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_then_a_kill_of_both_loses_nothing_with_the_defaults() {
    let pg = Postgres::start();
    let mut nats = lazy_nats();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    nats.write_back(); // the stream reached the disk
    pg.psql(&numbered_rows(0, 1_000, 100));
    stored(&nats, 1_000, "the burst stored").await;
    app.kill9();
    nats.power_loss();
    let left = now_holds(&nats).await;
    assert!(left < 1_000, "the power loss lost nothing: {left} messages");

    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(1_000, 1_100, 10));
    stored(&nats, 1_100, "1,100 rows stored after the loss").await;
    let stored = read_all(&jetstream(&nats.url()).await, "OUTBOX").await;
    assert_once_in_order(&stored, 1_100, &app.log());
}

/// The ids of rows 0..n the stream lacks, and those it holds more than once.
fn lacking_and_twice(messages: &[crate::support::stream::Stored], n: u64) -> (Vec<u64>, usize) {
    let mut seen = HashSet::new();
    let twice = messages.iter().filter(|m| !seen.insert(m.json()["n"].as_u64())).count();
    let lacking = (0..n).filter(|i| !seen.contains(&Some(*i))).collect();
    (lacking, twice)
}

/// The S3: no horizon (`0s`, the operator's choice), the loss happens while
/// pgoutbox runs, 50 more rows are stored after it. The record of what JetStream
/// acknowledged does not go back with the stream, so the one `run --recover` the log
/// advises (pgoutbox stopped first) finds the loss and seeds it from the table: 1,050 of
/// 1,050, each once. Before, the record fell to the stream's new tail and `--recover` said
/// "the slot exists: nothing to seed from the table" (650 of 1,050).
#[tokio::test(flavor = "multi_thread")]
async fn without_a_horizon_a_loss_while_running_comes_back_with_the_one_recover_it_advises() {
    let pg = Postgres::start();
    let mut nats = lazy_nats();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &NO_HORIZON);
    wait_until_streaming(&pg, &app).await;
    rows_with_an_unsynced_tail(&pg, &nats).await;
    slot_confirmed_everything(&pg).await;
    let recorded = "SELECT stream_sequence FROM pgoutbox.acknowledged";
    eventually(Duration::from_secs(10), "sequence 1000 recorded", || async {
        (pg.psql(recorded) == "1000").then_some(())
    })
    .await;
    nats.power_loss();
    let left = now_holds(&nats).await;
    assert!(left < 1_000, "the power loss lost nothing: {left} messages");
    pg.psql(&numbered_rows(1_000, 1_050, 10));
    stored(&nats, left + 50, "50 rows stored after the loss").await;
    let line = loss_line(&app).await;
    assert!(line.contains("ERROR") && line.contains("run --recover"), "{line}");
    // A second of acknowledgements after the loss: the record still names sequence 1000.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(pg.psql(recorded), "1000", "the record went back with the stream");
    stop_and_wait_released(&pg, app).await;

    let app = Pgoutbox::run(&pg, &nats, &["--recover", NO_HORIZON[0], NO_HORIZON[1]]);
    wait_until_streaming(&pg, &app).await;
    stored(&nats, 1_050, "the lost rows seeded from the table").await;
    let messages = read_all(&jetstream(&nats.url()).await, "OUTBOX").await;
    let (lacking, twice) = lacking_and_twice(&messages, 1_050);
    assert_eq!((messages.len(), lacking.len(), twice), (1_050, 0, 0), "lacking {lacking:?}");
}

/// A stream deleted and created again (by an operator, or lost with its server) is never
/// made again in silence: the start that makes it says so in a warning naming the fix,
/// counts it (`pgoutbox_stream_recreated_total`), and `status` says it in a line; the one
/// `run --backfill` it names refills the table's rows. Before, an INFO line ("stream
/// created") was all, and the record of the old stream was ignored.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_deleted_and_created_again_is_a_warning_a_metric_and_a_status_line() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 10, 10));
    stored(&nats, 10, "10 rows stored").await;
    let recorded = "SELECT stream_sequence FROM pgoutbox.acknowledged";
    eventually(Duration::from_secs(10), "sequence 10 recorded", || async {
        (pg.psql(recorded) == "10").then_some(())
    })
    .await;
    stop_and_wait_released(&pg, app).await;
    jetstream(&nats.url()).await.delete_stream("OUTBOX").await.expect("stream deleted");

    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let log = app.log();
    let line = log.lines().find(|l| l.contains("deleted and created again"));
    let line = line.unwrap_or_else(|| panic!("no word of the stream made again:\n{log}"));
    assert!(line.contains("WARN") && line.contains("run --backfill"), "{line}");
    let counted = metric(app.http_port(), "pgoutbox_stream_recreated_total ");
    assert_eq!(counted, Some(1.0), "{log}");
    let out = command(&pg, &nats)
        .env("PGOUTBOX_HTTP_ADDR", format!("127.0.0.1:{}", app.http_port()))
        .args(["status", "--json"])
        .output()
        .expect("pgoutbox status runs");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let said = report["stream"]["recreated"].as_str().unwrap_or_default();
    assert!(said.contains("deleted and created again"), "{report:#}");
    assert_eq!(report["pgoutbox"]["stream_recreated"], 1, "{report:#}");
    assert_eq!(report["health"], "warning", "{report:#}");
    stop_and_wait_released(&pg, app).await;

    let app = Pgoutbox::run(&pg, &nats, &["--backfill"]);
    wait_until_streaming(&pg, &app).await;
    stored(&nats, 10, "the table's rows backfilled").await;
    let messages = read_all(&jetstream(&nats.url()).await, "OUTBOX").await;
    assert_once_in_order(&messages, 10, &app.log());
}
