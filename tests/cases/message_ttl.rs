//! `--ttl-column`: a row's TTL becomes its message's `Nats-TTL`, and the server removes the
//! message once it passed, without breaking pgoutbox's chain of expected last sequences,
//! also across a restart whose stream tail has expired; a value that is not a TTL is a dead
//! letter saying why. On a server before 2.11, or a stream that does not allow per-message
//! TTLs, pgoutbox refuses to start with one line saying what to do.

use std::time::Duration;

use async_nats::jetstream;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{Stored, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, wait_until_streaming};

fn insert(n: usize, ttl: &str) -> String {
    format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, ttl) \
         VALUES ('order', '{n}', 'created', '{{\"n\": {n}}}', {ttl});\n"
    )
}

fn rows_of(stored: &[Stored]) -> Vec<String> {
    stored.iter().map(|m| m.header("Outbox-Aggregate-Id").unwrap_or("letter").to_owned()).collect()
}

async fn wait_for(js: &jetstream::Context, n: u64, app: &Pgoutbox) {
    let what = format!("{n} messages in the stream\n{}", app.log());
    eventually(Duration::from_secs(30), &what, || async {
        (count(js, "OUTBOX").await == n).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_with_a_ttl_is_gone_from_the_stream_after_it_and_the_chain_holds() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN ttl text;");
    let mut app = Pgoutbox::run(&pg, &nats, &["--ttl-column=ttl"]);
    if app.refused_before(&nats, (2, 11), "--ttl-column needs nats-server 2.11 or later") {
        return;
    }
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    let mut stream = js.get_stream("OUTBOX").await.expect("pgoutbox created the stream");
    let config = stream.info().await.expect("stream info").config.clone();
    assert!(config.allow_message_ttl, "created allowing per-message TTLs");

    // Rows 1 and 3 live for 2 s; row 3 is the stream's last message when it expires.
    pg.psql(&format!(
        "BEGIN;\n{}{}{}{}COMMIT;",
        insert(0, "NULL"),
        insert(1, "'2s'"),
        insert(2, "'soon'"),
        insert(3, "'2'")
    ));
    wait_for(&js, 4, &app).await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(stored[1].header("Nats-TTL"), Some("2"), "{:?}", stored[1]);
    assert_eq!(stored[0].header("Nats-TTL"), None);
    let letter = &stored[2];
    assert_eq!(letter.subject, "outbox.dead_letter");
    let reason = letter.json()["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("column ttl") && reason.contains("\"soon\" is not a TTL"), "{reason}");

    eventually(Duration::from_secs(20), "the rows with a 2 s TTL gone", || async {
        (count(&js, "OUTBOX").await == 2).then_some(())
    })
    .await;
    assert_eq!(rows_of(&read_all(&js, "OUTBOX").await), ["0", "letter"]);

    // Chained behind the expired row 3: stored.
    pg.psql(&insert(4, "NULL"));
    wait_for(&js, 3, &app).await;
    // A restart whose tail (row 4) then expires: nothing lost, nothing twice.
    pg.psql(&insert(5, "'2s'"));
    wait_for(&js, 4, &app).await;
    app.sigterm();
    assert!(app.wait_exit(Duration::from_secs(30)).success(), "{}", app.log());
    eventually(Duration::from_secs(20), "row 5 gone", || async {
        (count(&js, "OUTBOX").await == 3).then_some(())
    })
    .await;
    let app = Pgoutbox::run(&pg, &nats, &["--ttl-column=ttl"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&insert(6, "NULL"));
    wait_for(&js, 4, &app).await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(rows_of(&stored), ["0", "letter", "4", "6"], "{}", app.log());
    let info = stream.info().await.expect("stream info");
    assert_eq!(info.state.last_sequence, 7, "each row stored once, in its place");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ttl_column_is_refused_on_a_stream_without_ttls_or_with_delete_markers() {
    let pg = Postgres::start();
    let nats = Nats::start();
    if nats.release() < (2, 11) {
        return; // the server's own refusal is the other test's
    }
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN ttl text;");
    let js = jetstream(&nats.url()).await;
    js.create_stream(jetstream::stream::Config {
        name: "OUTBOX".into(),
        subjects: vec!["outbox.>".into()],
        ..Default::default()
    })
    .await
    .expect("a stream without allow_msg_ttl");
    let mut app = Pgoutbox::run(&pg, &nats, &["--ttl-column=ttl"]);
    assert!(!app.wait_exit(Duration::from_secs(30)).success(), "{}", app.log());
    assert!(
        app.log().contains("which stream OUTBOX does not allow")
            && app.log().contains("--allow-msg-ttl"),
        "{}",
        app.log()
    );
    let mut stream = js.get_stream("OUTBOX").await.expect("the stream");
    assert!(!stream.info().await.expect("info").config.allow_message_ttl, "never changed");

    // Subject delete markers are messages the server writes: refused too.
    js.create_stream(jetstream::stream::Config {
        name: "MARKED".into(),
        subjects: vec!["marked.>".into()],
        allow_message_ttl: true,
        subject_delete_marker_ttl: Some(Duration::from_secs(60)),
        ..Default::default()
    })
    .await
    .expect("a stream with subject delete markers");
    let mut app = Pgoutbox::run(
        &pg,
        &nats,
        &[
            "--ttl-column=ttl",
            "--stream=MARKED",
            "--subject-template=marked.{aggregate_type}.{event_type}",
            "--dead-letter-subject=marked.dead_letter",
        ],
    );
    assert!(!app.wait_exit(Duration::from_secs(30)).success(), "{}", app.log());
    assert!(app.log().contains("subject delete markers"), "{}", app.log());
}
