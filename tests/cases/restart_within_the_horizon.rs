//! A restart within the durability horizon publishes again every row the slot was not
//! confirmed past. Rows whose messages the stream has removed since, by its own limits or a
//! row's TTL (`message_ttl`), were stored before: none may come back as a collision's dead
//! letter, none be stored twice.

use std::time::Duration;

use async_nats::jetstream;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

async fn last_sequence(js: &jetstream::Context) -> u64 {
    match js.get_stream("OUTBOX").await {
        Ok(mut stream) => stream.info().await.map_or(0, |info| info.state.last_sequence),
        Err(_) => 0,
    }
}

async fn wait_for_sequence(js: &jetstream::Context, n: u64, app: &Pgoutbox) {
    let what = format!("stream sequence {n}\n{}", app.log());
    eventually(Duration::from_secs(30), &what, || async {
        (last_sequence(js).await == n).then_some(())
    })
    .await;
}

/// Postgres with the outbox, nats-server, and pgoutbox streaming with the defaults.
async fn streaming() -> (Postgres, Nats, jetstream::Context, Pgoutbox) {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    (pg, nats, js, app)
}

/// 20 rows, two of their messages deleted by an operator (the stream's tail among them,
/// so no tail skips the replay), then a restart with the defaults. Before, each deleted
/// row became a dead letter at the restart ("an older message in the stream has this row's
/// id: a collision"), as rows past their TTL did in `message_ttl` on nats-server 2.11+.
#[tokio::test(flavor = "multi_thread")]
async fn rows_whose_messages_were_deleted_are_not_letters_after_a_restart() {
    let (pg, nats, js, mut app) = streaming().await;
    pg.psql(&numbered_rows(0, 20, 5));
    wait_for_sequence(&js, 20, &app).await;
    app.sigterm();
    assert!(app.wait_exit(Duration::from_secs(30)).success(), "{}", app.log());
    let stream = js.get_stream("OUTBOX").await.expect("the stream");
    for sequence in [10, 20] {
        stream.delete_message(sequence).await.expect("message deleted");
    }

    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(20, 21, 1));
    wait_for_sequence(&js, 21, &app).await;
    let held: Vec<_> =
        read_all(&js, "OUTBOX").await.iter().map(|m| m.json()["n"].clone()).collect();
    let expected: Vec<_> =
        (0..21).filter(|n| ![9, 19].contains(n)).map(serde_json::Value::from).collect();
    assert_eq!(held, expected, "{}", app.log());
    assert!(!app.log().contains("collision"), "{}", app.log());
}

/// Transactions decoded and sent to pgoutput for the slot so far (PostgreSQL 14+'s
/// `pg_stat_replication_slots`), once the count stops moving.
async fn decoded_transactions(pg: &Postgres) -> u64 {
    let read = || {
        pg.psql("SELECT total_txns FROM pg_stat_replication_slots WHERE slot_name = 'pgoutbox'")
            .parse::<u64>()
            .unwrap_or(0)
    };
    let mut last = read();
    eventually(Duration::from_secs(30), "the slot's statistics settled", || {
        let now = read();
        let settled = now == last;
        last = now;
        async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            settled.then_some(now)
        }
    })
    .await
}

/// A restart within the horizon begins where the stream ends: the slot is not confirmed
/// past what the horizon holds (150 s by default), and every transaction since was sent
/// again by the walsender at each attempt, decoded and skipped, so an attempt's start cost
/// the whole horizon's WAL: with deliveries of scheduled rows ending an attempt every
/// second, a backlog drained at ~350 messages a second (the consumer soak, seed 11, 30
/// minutes, where replays waited behind it for over 90 s). Now the walsender is asked to
/// start at the tail's transaction, which pgoutbox still checks.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_within_the_horizon_is_not_sent_the_transactions_the_stream_holds() {
    const HELD: usize = 2_000;
    let (pg, nats, js, mut app) = streaming().await;
    pg.psql(&numbered_rows(0, HELD, 1));
    wait_for_sequence(&js, HELD as u64, &app).await;
    app.kill9();
    let before = decoded_transactions(&pg).await;

    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(HELD, HELD + 1, 1));
    wait_for_sequence(&js, HELD as u64 + 1, &app).await;
    let sent_again = decoded_transactions(&pg).await - before;
    eprintln!("after the restart: {sent_again} transactions sent ({HELD} held before it)");
    assert!(sent_again <= 10, "{sent_again} transactions sent again\n{}", app.log());
    let held: Vec<_> =
        read_all(&js, "OUTBOX").await.iter().map(|m| m.json()["n"].clone()).collect();
    let expected: Vec<_> = (0..=HELD).map(serde_json::Value::from).collect();
    assert_eq!(held, expected, "each row once, in order");
}
