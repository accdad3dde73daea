//! A slot that replays thousands of rows the stream holds, behind a tail pgoutbox cannot
//! skip by (another writer's message): every replayed row is answered as a duplicate, and
//! catching up must take a few attempts, not one per row (issue 23, item 9).

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{Stored, assert_once_in_order, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_behind_a_foreign_tail_catches_up_in_a_few_attempts() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    // A copy of the slot from before the rows, to rewind it to later.
    pg.psql("SELECT pg_copy_logical_replication_slot('pgoutbox', 'pgoutbox_before')");
    pg.psql(&numbered_rows(0, 4_000, 100));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "4,000 rows stored", || async {
        (count(&js, "OUTBOX").await == 4_000).then_some(())
    })
    .await;
    let mut app = app;
    app.sigterm();
    assert!(app.wait_exit(Duration::from_secs(30)).success(), "{}", app.log());
    eventually(Duration::from_secs(10), "slot released", || async {
        let active = "SELECT active FROM pg_replication_slots WHERE slot_name = 'pgoutbox'";
        (pg.psql(active) == "f").then_some(())
    })
    .await;

    js.publish("outbox.other.writer", "{}".into()).await.expect("publish").await.expect("ack");
    pg.psql(
        "SELECT pg_drop_replication_slot('pgoutbox'); \
         SELECT pg_copy_logical_replication_slot('pgoutbox_before', 'pgoutbox'); \
         SELECT pg_drop_replication_slot('pgoutbox_before')",
    );
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(4_000, 4_010, 10));
    eventually(Duration::from_secs(60), "the rows after the replay stored", || async {
        (count(&js, "OUTBOX").await == 4_011).then_some(())
    })
    .await;
    let log = app.log();
    let rows: Vec<Stored> = read_all(&js, "OUTBOX")
        .await
        .into_iter()
        .filter(|m| m.subject != "outbox.other.writer")
        .collect();
    assert_once_in_order(&rows, 4_010, &log);
    let attempts = log.matches(": streaming slot=").count();
    assert!(attempts <= 4, "{attempts} attempts to catch up:\n{log}");
}
