//! `pgoutbox verify` (issue 46, proof of delivery): the outbox table against the stream.
//! A message deleted by hand is named as missing and a message stored twice as held twice
//! and out of commit order, with exit code 2; `--replay-missing` hands the missing row to
//! the running pgoutbox, after which everything is there once (exit 0).

use std::process::Output;
use std::time::Duration;

use async_nats::HeaderMap;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{count, create_outbox_stream, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, stop_and_wait_released};

fn verify(pg: &Postgres, nats: &Nats, args: &[&str]) -> (Option<i32>, String, String) {
    let Output { status, stdout, stderr } = command(pg, nats)
        .env_remove("RUST_LOG")
        .arg("verify")
        .args(args)
        .output()
        .expect("pgoutbox verify runs");
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    (status.code(), text(stdout), text(stderr))
}

async fn stored(nats: &Nats, n: u64) {
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "rows stored", || async {
        (count(&js, "OUTBOX").await >= n).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_and_a_duplicated_message_are_found() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    // A short duplicate window, so that a copy can be stored by hand.
    create_outbox_stream(&js, Duration::from_secs(1)).await;
    let app = Pgoutbox::run(&pg, &nats, &[]);
    crate::support::wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 1_000, 100));
    stored(&nats, 1_000).await;
    stop_and_wait_released(&pg, app).await;

    let (code, out, err) = verify(&pg, &nats, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("1000 rows, 0 missing") && out.contains("0 held twice"), "{out}");

    let messages = read_all(&js, "OUTBOX").await;
    let deleted = &messages[500];
    let copied = &messages[100];
    let stream = js.get_stream("OUTBOX").await.expect("the stream");
    stream.delete_message(501).await.expect("delete the 501st message");
    tokio::time::sleep(Duration::from_millis(1_500)).await; // the duplicate window passes
    let mut headers = HeaderMap::new();
    // As a hand copy would: without pgoutbox's chain (its expected-last headers).
    for (name, value) in copied.headers.iter().filter(|(n, _)| !n.starts_with("Nats-Expected")) {
        headers.insert(name.as_str(), value.as_str());
    }
    let copy =
        js.publish_with_headers(copied.subject.clone(), headers, copied.payload.clone().into());
    copy.await.expect("publish").await.expect("the copy is stored");

    let (code, out, err) = verify(&pg, &nats, &[]);
    assert_eq!(code, Some(2), "{out}{err}");
    let id =
        |m: &crate::support::stream::Stored| m.header("Nats-Msg-Id").unwrap_or_default().to_owned();
    assert!(
        out.contains("1 missing") && out.contains(&format!("missing (first 20): {}", id(deleted))),
        "{out}"
    );
    assert!(out.contains("1 held twice") && out.contains(&id(copied)), "{out}");
    assert!(out.contains("1 messages out of commit order"), "{out}");
    let (code, json, _) = verify(&pg, &nats, &["--json"]);
    assert_eq!(code, Some(2));
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!((report["missing"].as_u64(), report["duplicated"].as_u64()), (Some(1), Some(1)));
    assert_eq!(report["missing_ids"][0], id(deleted));
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_missing_brings_a_deleted_message_back_through_the_running_pgoutbox() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    crate::support::wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 200, 10));
    stored(&nats, 200).await;
    let js = jetstream(&nats.url()).await;
    let stream = js.get_stream("OUTBOX").await.expect("the stream");
    stream.delete_message(50).await.expect("delete the 50th message");

    let (code, out, err) = verify(&pg, &nats, &["--replay-missing"]);
    assert_eq!(code, Some(2), "it found the row missing:\n{out}{err}\n{}", app.log());
    assert!(out.contains("1 missing"), "{out}");
    let (code, out, err) = verify(&pg, &nats, &[]);
    assert_eq!(code, Some(0), "after the replay:\n{out}{err}\n{}", app.log());
    assert!(out.contains("200 rows, 0 missing"), "{out}");
}

/// `run --verify-every`: the check inside `run`. 100 rows created two minutes ago are
/// stored; with pgoutbox stopped, one message is deleted (a server that forgot it). The
/// next pgoutbox, checking every second, finds it among the rows its first check looks back
/// on: the gauge says 1 missing for the table, and one warning names the row's id.
#[tokio::test(flavor = "multi_thread")]
async fn run_checks_the_stream_on_a_schedule_and_counts_what_it_lacks() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    crate::support::wait_until_streaming(&pg, &app).await;
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
         SELECT 'order', n::text, 'created', jsonb_build_object('n', n), \
         now() - interval '2 minutes' FROM generate_series(0, 99) AS n",
    );
    stored(&nats, 100).await;
    stop_and_wait_released(&pg, app).await;
    let js = jetstream(&nats.url()).await;
    let gone = read_all(&js, "OUTBOX").await[40].header("Nats-Msg-Id").map(str::to_owned);
    let gone = gone.expect("the message's id");
    let stream = js.get_stream("OUTBOX").await.expect("the stream");
    stream.delete_message(41).await.expect("delete the 41st message");

    let app = Pgoutbox::run(&pg, &nats, &["--verify-every", "1s"]);
    crate::support::wait_until_streaming(&pg, &app).await;
    // A commit published now: the rows two minutes older are settled.
    pg.psql(&numbered_rows(100, 101, 1));
    let what = format!("the scheduled check finds the deleted row\n{}", app.log());
    eventually(Duration::from_secs(30), &what, || async {
        let missing = "pgoutbox_verify_missing_rows{table=\"public.outbox\"} ";
        (crate::support::metric(app.http_port(), missing) == Some(1.0)).then_some(())
    })
    .await;
    let log = app.log();
    let line = log.lines().find(|l| l.contains("verify: the stream does not hold every row"));
    let line = line.unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(line.contains("missing=1") && line.contains(&gone), "{line}");
}

/// A stream at its consumer limit (nats-server 2.15 gives a stream 1,000 unless it sets
/// `max_consumers`; here the operator set 1, and an application holds it): `verify`, which
/// reads the stream back through a consumer of its own, says so in one line with what to
/// do, not JetStream's bare code.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_at_its_consumer_limit_is_named_with_what_to_do() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    let stream = js
        .create_stream(async_nats::jetstream::stream::Config {
            name: "OUTBOX".into(),
            subjects: vec!["outbox.*.*".into(), "outbox.dead_letter".into()],
            max_consumers: 1,
            ..Default::default()
        })
        .await
        .expect("create the stream with max_consumers 1");
    let app = Pgoutbox::run(&pg, &nats, &[]);
    crate::support::wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 10, 10));
    stored(&nats, 10).await;
    stop_and_wait_released(&pg, app).await;
    let durable = async_nats::jetstream::consumer::pull::Config {
        durable_name: Some("application".into()),
        ..Default::default()
    };
    stream.create_consumer(durable).await.expect("the application's consumer");

    let (code, out, err) = verify(&pg, &nats, &[]);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("holds as many consumers as it may") && err.contains("max_consumers"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
