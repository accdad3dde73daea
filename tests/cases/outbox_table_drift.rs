//! The outbox table renamed, or taken out of the publication. pgoutput names a table as it
//! was named when each row was written; matched by name, the rows written under another
//! name were skipped and the slot confirmed past them, with no log line. Matched by the
//! table's OID they are published; a table that cannot be streamed as configured stops
//! pgoutbox with one line saying what to do, before anything is confirmed past it.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{assert_once_in_order, count, jetstream, read_all};
use crate::support::{
    Nats, Postgres, eventually, numbered_rows, stop_and_wait_released, wait_until_streaming,
};

/// Rows 0..n stored once, in order.
async fn assert_all_once(nats: &Nats, n: usize, log: &str) {
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "every row stored", || async {
        (count(&js, "OUTBOX").await >= n as u64).then_some(())
    })
    .await;
    assert_once_in_order(&read_all(&js, "OUTBOX").await, n, log);
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_written_while_the_table_had_another_name_are_published() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 10, 5));
    pg.psql("ALTER TABLE outbox RENAME TO outbox_v1");
    pg.psql(&numbered_rows(10, 20, 5).replace("INTO outbox ", "INTO outbox_v1 "));
    pg.psql("ALTER TABLE outbox_v1 RENAME TO outbox");
    pg.psql(&numbered_rows(20, 30, 5));
    assert_all_once(&nats, 30, &app.log()).await;
    assert!(app.log().contains("had another name"), "no word of the rename:\n{}", app.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_renamed_away_or_unpublished_stops_pgoutbox_with_what_to_do() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 5, 5));
    assert_all_once(&nats, 5, &app.log()).await;
    stop_and_wait_released(&pg, app).await;

    for (drift, fix, says) in [
        (
            "ALTER TABLE outbox RENAME TO outbox_v1",
            "ALTER TABLE outbox_v1 RENAME TO outbox",
            "does not exist",
        ),
        (
            "ALTER PUBLICATION pgoutbox DROP TABLE outbox",
            "ALTER PUBLICATION pgoutbox ADD TABLE outbox",
            "ALTER PUBLICATION pgoutbox ADD TABLE public.outbox",
        ),
    ] {
        pg.psql(drift);
        let mut app = Pgoutbox::run(&pg, &nats, &[]);
        let status = app.wait_exit(Duration::from_secs(30));
        assert!(!status.success(), "pgoutbox ran on after: {drift}\n{}", app.log());
        assert!(app.log().contains(says), "{drift}: no {says:?} in:\n{}", app.log());
        assert!(!app.log().contains("panicked"), "{}", app.log());
        pg.psql(fix);
    }
    // Rows committed while the table was renamed wait in the slot until it has its name back.
    pg.psql("ALTER TABLE outbox RENAME TO outbox_v1");
    pg.psql(&numbered_rows(5, 10, 5).replace("INTO outbox ", "INTO outbox_v1 "));
    pg.psql("ALTER TABLE outbox_v1 RENAME TO outbox");
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    assert_all_once(&nats, 10, &app.log()).await;
}

/// Rows committed after the table left the publication are never decoded, so waiting for
/// the next reconnection to notice could take days: the liveness check asks every 10 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_unpublished_while_streaming_stops_pgoutbox_within_the_liveness_check() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 5, 5));
    assert_all_once(&nats, 5, &app.log()).await;
    pg.psql("ALTER PUBLICATION pgoutbox DROP TABLE outbox");
    let status = app.wait_exit(Duration::from_secs(40));
    assert!(!status.success(), "exit status {status:?}; log:\n{}", app.log());
    let says = "ALTER PUBLICATION pgoutbox ADD TABLE public.outbox";
    assert!(app.log().contains(says), "no {says:?} in:\n{}", app.log());
}

/// A statement reads `pg_class` in its own snapshot, but `pg_publication_tables` lists a
/// publication's tables with a catalog snapshot taken when its function runs: a table
/// dropped in between looked taken out of the publication. For a tenant's table (a soak
/// saw it) pgoutbox stopped and asked for `ALTER PUBLICATION … ADD TABLE` on a table that
/// no longer existed. Here the liveness check's read of the publication is held on a lock
/// while the table is dropped, as a slow scheduler could hold it.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_dropped_while_the_check_reads_the_catalog_is_named_missing_not_unpublished() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let mut app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let (dropper, connection) =
        tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    dropper
        .batch_execute("BEGIN; LOCK TABLE pg_catalog.pg_publication_rel IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock the publications' tables");
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE application_name = 'pgoutbox liveness check' AND wait_event_type = 'Lock'";
    eventually(Duration::from_secs(30), "the liveness check waiting on the lock", || async {
        (pg.psql(waiting).trim() == "1").then_some(())
    })
    .await;
    dropper.batch_execute("DROP TABLE public.outbox; COMMIT").await.expect("drop the outbox");
    let status = app.wait_exit(Duration::from_secs(40));
    assert!(!status.success(), "exit status {status:?}; log:\n{}", app.log());
    let error = app.error_line();
    assert!(error.contains("does not exist"), "not named missing: {error:?}\n{}", app.log());
    assert!(!error.contains("ADD TABLE"), "asked to publish a dropped table: {error:?}");
}
