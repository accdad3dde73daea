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

/// 20 rows, two of their messages deleted by an operator (the stream's tail among them,
/// so no tail skips the replay), then a restart with the defaults. Before, each deleted
/// row became a dead letter at the restart ("an older message in the stream has this row's
/// id: a collision"), as rows past their TTL did in `message_ttl` on nats-server 2.11+.
#[tokio::test(flavor = "multi_thread")]
async fn rows_whose_messages_were_deleted_are_not_letters_after_a_restart() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
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
