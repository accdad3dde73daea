//! Down for longer than JetStream's duplicate window: with the window at 1 s, kill -9 after
//! part of a transaction was stored but before its LSN was confirmed, wait 3 s, restart:
//! still no duplicate, because pgoutbox reads where the stream ends and skips what is there.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, create_outbox_stream, jetstream, read_all};
use crate::support::{
    Nats, Postgres, confirmed_flush, eventually, numbered_rows, wait_until_streaming,
};

#[tokio::test(flavor = "multi_thread")]
async fn replay_after_the_dedup_window_stores_nothing_twice() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    create_outbox_stream(&js, Duration::from_secs(1)).await;

    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let total = 50_000;
    pg.psql(&numbered_rows(0, total, total));
    let stored_at_kill =
        eventually(Duration::from_secs(30), "part of the transaction stored", || async {
            let n = count(&js, "OUTBOX").await;
            (n > 0).then_some(n)
        })
        .await;
    app.kill9();
    assert!(stored_at_kill < total as u64, "the whole transaction was stored before the kill");
    // The slot may move inside the transaction's WAL (keepalives), never to its commit.
    let stored = read_all(&js, "OUTBOX").await;
    let position = stored[0].header("Pgoutbox-Position").expect("position header");
    let commit_lsn = position.split(':').next().expect("commit LSN");
    let confirmed = confirmed_flush(&pg);
    let before_commit = pg.psql(&format!("SELECT '{confirmed}'::pg_lsn < '{commit_lsn}'::pg_lsn"));
    assert_eq!(
        before_commit, "t",
        "confirmed {confirmed} reached commit {commit_lsn} of a partly stored transaction"
    );

    // Let the duplicate window pass: replays are no longer caught by Nats-Msg-Id.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let app = Pgoutbox::run(&pg, &nats, &[]);
    eventually(Duration::from_secs(60), "the whole transaction stored", || async {
        (count(&js, "OUTBOX").await >= total as u64).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, total);
    assert_eq!(report.stored, total, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
}
