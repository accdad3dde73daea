//! A partitioned outbox (the usual way to drop old events cheaply) streams every row, also
//! of partitions attached while pgoutbox runs. A publication that would name the partitions
//! instead of the outbox, and legacy inheritance children, are refused before anything is
//! confirmed.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, wait_until_streaming};

const PARTITIONED_OUTBOX: &str = "CREATE TABLE outbox ( \
    id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, \
    aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL, \
    headers jsonb, created_at timestamptz NOT NULL DEFAULT now(), \
    PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at); \
    CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;";

/// Rows `from..to`, one transaction, dated `at`.
fn rows_at(from: usize, to: usize, at: &str) -> String {
    format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
         SELECT 'order', n::text, 'created', jsonb_build_object('n', n), '{at}' \
         FROM generate_series({from}, {}) AS n",
        to - 1
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn every_partition_streams_including_one_attached_while_running() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(PARTITIONED_OUTBOX);
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    pg.psql(&rows_at(0, 10, "2026-11-23"));
    pg.psql(
        "CREATE TABLE outbox_2030 PARTITION OF outbox \
         FOR VALUES FROM ('2030-01-01') TO ('2031-01-01')",
    );
    pg.psql(&rows_at(10, 20, "2030-06-01"));
    pg.psql(&rows_at(20, 30, "2026-11-24"));

    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "30 rows stored", || async {
        (count(&js, "OUTBOX").await >= 30).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(
        audit(&stored, 30),
        crate::support::stream::Audit { stored: 30, ..Default::default() }
    );
    assert!(stored.iter().all(|m| m.subject == "outbox.order.created"));
}

fn assert_refused(pg: &Postgres, nats: &Nats, needle: &str) {
    let mut app = Pgoutbox::run(pg, nats, &[]);
    let status = app.wait_exit(Duration::from_secs(30));
    let log = app.log();
    assert!(!status.success(), "pgoutbox streamed:\n{log}");
    assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    assert_eq!(pg.psql("SELECT count(*) FROM pg_replication_slots"), "0", "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_publication_naming_the_partitions_is_refused_with_the_fix() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(PARTITIONED_OUTBOX);
    pg.psql("CREATE PUBLICATION pgoutbox FOR TABLE outbox WITH (publish = 'insert')");
    assert_refused(&pg, &nats, "publish_via_partition_root = true");
}

#[tokio::test(flavor = "multi_thread")]
async fn inheritance_children_are_refused_clearly() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE TABLE outbox_old () INHERITS (outbox)");
    assert_refused(&pg, &nats, "inheritance children (public.outbox_old)");
}

/// `--retention` on a partitioned outbox deletes exactly the old, published rows. It deleted
/// by `ctid`, which each partition numbers on its own: the young rows of another partition
/// at the same ctids went too (100 of 100 today's rows, measured).
#[tokio::test(flavor = "multi_thread")]
async fn retention_on_a_partitioned_outbox_deletes_only_old_published_rows() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(PARTITIONED_OUTBOX);
    pg.psql(
        "CREATE TABLE outbox_2020 PARTITION OF outbox \
         FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')",
    );
    let app = Pgoutbox::run(&pg, &nats, &["--retention", "2m", "--durability-horizon", "0s"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&rows_at(0, 100, "2020-06-01"));
    pg.psql(&rows_at(100, 200, "now"));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "200 rows stored", || async {
        (count(&js, "OUTBOX").await == 200).then_some(())
    })
    .await;
    let count_in = |table: &str| pg.psql(&format!("SELECT count(*) FROM {table}"));
    eventually(Duration::from_secs(60), "the 2020 rows deleted", || async {
        (count_in("outbox_2020") == "0").then_some(())
    })
    .await;
    assert_eq!(count_in("outbox_default"), "100", "today's rows were deleted:\n{}", app.log());
    let ages = pg.psql("SELECT count(*) FROM outbox WHERE created_at > now() - interval '1 day'");
    assert_eq!(ages, "100");
}
