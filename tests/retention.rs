//! `--retention` deletes rows once they are old and published, never before: rows that
//! could not be published (NATS down) stay in the table however old they get. "Published"
//! is the commit time of the newest confirmed transaction, so each step commits one more
//! row after the retention has passed.

mod support;

use std::time::{Duration, Instant};

use support::pgoutbox::Pgoutbox;
use support::stream::{count, jetstream};
use support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

fn rows_in_table(pg: &Postgres) -> u64 {
    pg.psql("SELECT count(*) FROM outbox").parse().expect("count")
}

#[tokio::test(flavor = "multi_thread")]
async fn deletes_published_rows_after_the_retention_and_never_unpublished_ones() {
    let pg = Postgres::start();
    let mut nats = Nats::start();
    pg.psql(include_str!("../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &["--retention", "2s"]);
    wait_until_streaming(&pg, &app).await;

    pg.psql(&numbered_rows(0, 50, 50));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "50 rows stored", || async {
        (count(&js, "OUTBOX").await == 50).then_some(())
    })
    .await;
    age_past_retention_then_publish_one_more(&pg, &js, 51).await;
    eventually(Duration::from_secs(20), "published rows deleted after 2 s", || async {
        (rows_in_table(&pg) == 1).then_some(())
    })
    .await;

    nats.stop();
    pg.psql("DELETE FROM outbox");
    pg.psql(&numbered_rows(51, 61, 10));
    // Well past the retention, the unpublished rows must still be there.
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        assert_eq!(rows_in_table(&pg), 10, "unpublished rows were deleted");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    nats.start_again();
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), "the 10 rows published after NATS is back", || async {
        (count(&js, "OUTBOX").await == 61).then_some(())
    })
    .await;
    age_past_retention_then_publish_one_more(&pg, &js, 62).await;
    eventually(Duration::from_secs(20), "and then deleted", || async {
        (rows_in_table(&pg) == 1).then_some(())
    })
    .await;
    assert!(app.log().contains("retention: deleted published rows"), "{}", app.log());
}

/// Lets the retention (2 s) pass, then commits one row and waits until it is stored, so the
/// newest confirmed commit is past the retention for every older row.
async fn age_past_retention_then_publish_one_more(
    pg: &Postgres,
    js: &async_nats::jetstream::Context,
    stored_after: u64,
) {
    tokio::time::sleep(Duration::from_millis(2_500)).await; // the rows must age
    let n = stored_after as usize - 1;
    pg.psql(&numbered_rows(n, n + 1, 1));
    eventually(Duration::from_secs(20), "one more row stored", || async {
        (count(js, "OUTBOX").await == stored_after).then_some(())
    })
    .await;
}
