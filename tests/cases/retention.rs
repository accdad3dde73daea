//! `--retention` deletes rows once they are old and published, never before: rows that
//! could not be published (NATS down) stay in the table however old they get. "Published"
//! is the commit time of the newest confirmed transaction, so each step commits one more
//! row after the retention has passed.

use std::time::{Duration, Instant};

use crate::cases::poison_rows::small_payload_nats;
use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, numbered_rows, parse_lsn, wait_until_streaming};

fn rows_in_table(pg: &Postgres) -> u64 {
    pg.psql("SELECT count(*) FROM outbox").parse().expect("count")
}

#[tokio::test(flavor = "multi_thread")]
async fn deletes_published_rows_after_the_retention_and_never_unpublished_ones() {
    let pg = Postgres::start();
    let mut nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &["--retention", "2s", "--durability-horizon", "0s"]);
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

/// Behind the durability horizon, a row acknowledged by JetStream is deleted only once the
/// slot was confirmed past it: until then a power loss of nats-server would be refilled from
/// the WAL, and the table is the copy an operator's `--recover` reads.
#[tokio::test(flavor = "multi_thread")]
async fn a_row_is_deleted_only_once_the_slot_is_confirmed_past_it() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &["--retention", "1s", "--durability-horizon", "8s"]);
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    pg.psql(&numbered_rows(0, 20, 20));
    let after_rows = parse_lsn(&pg.psql("SELECT pg_current_wal_lsn()"));
    // A writer that keeps the newest published commit moving, as production does.
    let writer = pg.start_writer(20, 0.3);
    eventually(Duration::from_secs(20), "20 rows stored", || async {
        (count(&js, "OUTBOX").await >= 20).then_some(())
    })
    .await;
    let first_twenty = "SELECT count(*) FROM outbox WHERE aggregate_id::int < 20";
    eventually(Duration::from_secs(60), "the slot confirmed past the 20 rows", || async {
        let confirmed = parse_lsn(&crate::support::confirmed_flush(&pg));
        if confirmed >= after_rows {
            return Some(());
        }
        assert_eq!(pg.psql(first_twenty), "20", "a row was deleted before the slot passed it");
        None
    })
    .await;
    eventually(Duration::from_secs(30), "then the 20 rows deleted", || async {
        (pg.psql(first_twenty) == "0").then_some(())
    })
    .await;
    writer.finish();
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

/// A row too large for NATS is dead-lettered without its payload, so the table holds the
/// only copy: `--retention` never deletes it, neither in the run that dead-lettered it nor
/// after a restart (which learns it from the dead letters in the stream).
#[tokio::test(flavor = "multi_thread")]
async fn keeps_rows_whose_dead_letter_lacks_the_payload() {
    let pg = Postgres::start();
    let (nats, _conf_dir) = small_payload_nats();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &["--retention", "2s", "--durability-horizon", "0s"]);
    wait_until_streaming(&pg, &app).await;

    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'big', 'created', jsonb_build_object('pad', repeat('x', 20000)))",
    );
    pg.psql(&numbered_rows(0, 10, 10));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "the dead letter and 10 rows stored", || async {
        (count(&js, "OUTBOX").await == 11).then_some(())
    })
    .await;
    let big_row = "SELECT count(*) FROM outbox WHERE aggregate_id = 'big'";
    age_past_retention_then_publish_one_more(&pg, &js, 12).await;
    eventually(Duration::from_secs(20), "the published rows deleted", || async {
        (rows_in_table(&pg) == 2).then_some(())
    })
    .await;
    assert_eq!(pg.psql(big_row), "1", "the only copy of a dead-lettered row was deleted");

    crate::support::stop_and_wait_released(&pg, app).await;
    let app = Pgoutbox::run(&pg, &nats, &["--retention", "2s", "--durability-horizon", "0s"]);
    wait_until_streaming(&pg, &app).await;
    age_past_retention_then_publish_one_more(&pg, &js, 13).await;
    eventually(
        Duration::from_secs(20),
        "the rows published before the restart deleted",
        || async { (rows_in_table(&pg) == 2).then_some(()) },
    )
    .await;
    assert_eq!(pg.psql(big_row), "1", "deleted after a restart:\n{}", app.log());
}

/// With several tables, each is served, and a row kept for its dead letter is kept in its
/// own table only: the same id in another table is another row, deleted once old and
/// published. Also after a restart, which learns the kept rows from the dead letters'
/// bodies (table and id).
#[tokio::test(flavor = "multi_thread")]
async fn serves_every_table_and_keeps_a_dead_letters_row_in_its_own_table() {
    use crate::cases::several_tables::{TABLES, two_tables};
    let pg = Postgres::start();
    let (nats, _conf_dir) = small_payload_nats();
    two_tables(&pg);
    let mut args = TABLES.to_vec();
    args.extend(["--retention", "2s", "--durability-horizon", "0s"]);
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;

    let same = "00000000-0000-0000-0000-000000000007";
    pg.psql(&format!(
        "INSERT INTO billing.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('{same}', 'invoice', 'big', 'created', \
                 jsonb_build_object('pad', repeat('x', 20000))); \
         INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('{same}', 'order', 'same', 'created', '{{}}');"
    ));
    for table in ["public.outbox", "billing.outbox"] {
        pg.psql(&numbered_rows(0, 10, 5).replace("INTO outbox", &format!("INTO {table}")));
    }
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "22 messages stored", || async {
        (count(&js, "OUTBOX").await == 22).then_some(())
    })
    .await;
    let rows = |table: &str| -> u64 {
        pg.psql(&format!("SELECT count(*) FROM {table}")).parse().expect("count")
    };
    let big_row = "SELECT count(*) FROM billing.outbox WHERE aggregate_id = 'big'";
    age_past_retention_then_publish_one_more(&pg, &js, 23).await;
    eventually(Duration::from_secs(20), "both tables' published rows deleted", || async {
        (rows("public.outbox") == 1 && rows("billing.outbox") == 1).then_some(())
    })
    .await;
    assert_eq!(pg.psql(big_row), "1", "the only copy of a dead-lettered row was deleted");
    let log = app.log();
    for table in ["public.outbox", "billing.outbox"] {
        let line = log.lines().find(|l| l.contains("retention: deleted") && l.contains(table));
        assert!(line.is_some(), "no deletion logged for {table}:\n{log}");
    }

    crate::support::stop_and_wait_released(&pg, app).await;
    pg.psql(&numbered_rows(23, 24, 1));
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    eventually(Duration::from_secs(20), "the row after the restart stored", || async {
        (count(&js, "OUTBOX").await == 24).then_some(())
    })
    .await;
    age_past_retention_then_publish_one_more(&pg, &js, 25).await;
    eventually(Duration::from_secs(20), "public.outbox's older rows deleted", || async {
        (rows("public.outbox") == 1).then_some(())
    })
    .await;
    assert_eq!(pg.psql(big_row), "1", "deleted after a restart:\n{}", app.log());
}

/// A table whose deletes fail (here a trigger refuses them; a missing `DELETE` grant
/// does the same) is retried at each pass, and the tables after it are still served.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_whose_deletes_fail_leaves_the_other_tables_served() {
    use crate::cases::several_tables::{TABLES, two_tables};
    let pg = Postgres::start();
    let nats = Nats::start();
    two_tables(&pg);
    pg.psql(
        "CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'this table keeps its rows'; END $$; \
         CREATE TRIGGER keep_rows BEFORE DELETE ON public.outbox \
         FOR EACH ROW EXECUTE FUNCTION refuse_delete();",
    );
    let mut args = TABLES.to_vec();
    args.extend(["--retention", "2s", "--durability-horizon", "0s"]);
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;

    pg.psql(&numbered_rows(0, 5, 5));
    pg.psql(&numbered_rows(5, 15, 5).replace("INTO outbox", "INTO billing.outbox"));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "15 rows stored", || async {
        (count(&js, "OUTBOX").await == 15).then_some(())
    })
    .await;
    age_past_retention_then_publish_one_more(&pg, &js, 16).await;
    eventually(Duration::from_secs(20), "billing.outbox's published rows deleted", || async {
        (pg.psql("SELECT count(*) FROM billing.outbox") == "0").then_some(())
    })
    .await;
    assert_eq!(pg.psql("SELECT count(*) FROM public.outbox"), "6");
    let log = app.log();
    let refused = r#"retention: delete failed; will retry error="this table keeps its rows""#;
    assert!(log.contains(refused), "no {refused:?} in:\n{log}");
}

/// With a table pattern every matched table is served, and one adopted later keeps the rows
/// its adoption inserted again (created-at a day old, long past the retention) until that
/// adoption is published: here it is adopted while nats-server is paused, after newer
/// transactions were published. Then they go too.
#[tokio::test(flavor = "multi_thread")]
async fn serves_a_patterns_tables_and_an_adopted_tables_rows_only_once_published() {
    use crate::cases::several_tables::{tenant_rows, tenant_table};
    let pg = Postgres::start();
    let mut nats = Nats::start();
    pg.psql(&tenant_table("tenant_1"));
    let tenants = ["--table", "tenant_*.outbox", "--subject-template", "tenants.{$schema}.x"];
    let app = Pgoutbox::run(
        &pg,
        &nats,
        &[&tenants[..], &["--retention", "2s", "--durability-horizon", "0s"]].concat(),
    );
    wait_until_streaming(&pg, &app).await;
    let rows_of = |schema: &str| -> u64 {
        pg.psql(&format!("SELECT count(*) FROM {schema}.outbox")).parse().expect("count")
    };

    pg.psql(&tenant_rows("tenant_1", 0, 20));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "20 rows stored", || async {
        (count(&js, "OUTBOX").await == 20).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2_500)).await; // the rows must age
    pg.psql(&tenant_rows("tenant_1", 20, 21));
    eventually(Duration::from_secs(20), "tenant_1's old rows deleted", || async {
        (rows_of("tenant_1") == 1).then_some(())
    })
    .await;

    nats.pause();
    pg.psql(&tenant_table("tenant_2"));
    pg.psql(
        "INSERT INTO tenant_2.outbox (aggregate_type, aggregate_id, event_type, payload, \
         created_at) SELECT 'order', n::text, 'created', '{}', now() - interval '1 day' \
         FROM generate_series(1, 10) n",
    );
    eventually(Duration::from_secs(30), "tenant_2 adopted", || async {
        app.log().contains("joined the publication").then_some(())
    })
    .await;
    // Several passes (one a second) while the adoption waits for its ack.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert_eq!(rows_of("tenant_2"), 10, "adopted rows deleted before they were published");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    nats.resume();
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), "tenant_2's rows stored", || async {
        (count(&js, "OUTBOX").await == 31).then_some(())
    })
    .await;
    eventually(Duration::from_secs(20), "and then deleted", || async {
        (rows_of("tenant_2") == 0).then_some(())
    })
    .await;
    assert!(app.log().contains("table=tenant_2.outbox"), "{}", app.log());
}

/// Ten rows of tenant_1's outbox, a day old.
const DAY_OLD_ROWS: &str = "INSERT INTO tenant_1.outbox (aggregate_type, aggregate_id, \
     event_type, payload, created_at) SELECT 'order', n::text, 'created', '{}', \
     now() - interval '1 day' FROM generate_series(1, 10) n;";

/// Streams `tenant_*.outbox` with `--retention 2s` (with the event trigger if asked) until
/// tenant_1's first ten day-old rows are stored and deleted; then, with nats-server
/// paused, runs `rejoin`, which writes ten more: they must stay through 4 s of passes (one
/// a second), and go once stored.
async fn rows_of_a_table_joined_anew_wait_until_stored(with_trigger: bool, rejoin: &str) {
    use crate::cases::several_tables::tenant_table;
    use crate::support::pgoutbox::command;
    let pg = Postgres::start();
    let mut nats = Nats::start();
    pg.psql(&tenant_table("tenant_1"));
    let tenants = ["--table", "tenant_*.outbox", "--subject-template", "tenants.{$schema}.x"];
    if with_trigger {
        let mut setup = command(&pg, &nats);
        let setup = setup.args(tenants).args(["setup", "--tenant-trigger"]).output();
        let setup = setup.expect("pgoutbox setup runs");
        assert!(setup.status.success(), "setup: {}", String::from_utf8_lossy(&setup.stderr));
    }
    let app = Pgoutbox::run(
        &pg,
        &nats,
        &[&tenants[..], &["--retention", "2s", "--durability-horizon", "0s"]].concat(),
    );
    wait_until_streaming(&pg, &app).await;
    pg.psql(DAY_OLD_ROWS);
    tenant_1_stored_then_deleted(&pg, &nats, 10).await;
    nats.pause();
    pg.psql(rejoin);
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert_eq!(rows_of_tenant_1(&pg), 10, "rows deleted before they were stored: {rejoin}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    nats.resume();
    tenant_1_stored_then_deleted(&pg, &nats, 20).await;
}

fn rows_of_tenant_1(pg: &Postgres) -> u64 {
    pg.psql("SELECT count(*) FROM tenant_1.outbox").parse().expect("count")
}

/// Waits until the stream holds `n` messages, then until tenant_1's outbox is empty.
async fn tenant_1_stored_then_deleted(pg: &Postgres, nats: &Nats, n: u64) {
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), "the rows stored", || async {
        (count(&js, "OUTBOX").await == n).then_some(())
    })
    .await;
    eventually(Duration::from_secs(20), "and then deleted", || async {
        (rows_of_tenant_1(pg) == 0).then_some(())
    })
    .await;
}

/// A tenant's table dropped and created again under its name (a tenant restored in one
/// transaction, the event trigger publishing it as it is created) joined the publication
/// anew: its day-old rows, committed after the newest published transaction, wait until
/// they are stored. Known by its name alone, it was served at the next pass and they were
/// deleted unstored.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_table_created_again_under_its_name_waits_again() {
    let table =
        include_str!("../../sql/outbox.sql").replace("IF NOT EXISTS outbox", "tenant_1.outbox");
    let restore = format!("BEGIN; DROP TABLE tenant_1.outbox;\n{table}\n{DAY_OLD_ROWS}\nCOMMIT;");
    rows_of_a_table_joined_anew_wait_until_stored(true, &restore).await;
}

/// A pass lists a tenant's table, then its delete waits for a lock: a transaction holding
/// the table as an adoption does takes it out of the publication, adds it back and inserts
/// day-old rows, for 3 s. Once that commits, the delete must not take those rows, not yet
/// stored: the publication no longer holds the table by the row the pass saw.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_listed_before_the_table_was_added_back_deletes_nothing() {
    let added_back = format!(
        "BEGIN; LOCK TABLE tenant_1.outbox IN SHARE ROW EXCLUSIVE MODE; \
         ALTER PUBLICATION pgoutbox DROP TABLE tenant_1.outbox; \
         ALTER PUBLICATION pgoutbox ADD TABLE tenant_1.outbox; \
         {DAY_OLD_ROWS} SELECT pg_sleep(3); COMMIT;"
    );
    rows_of_a_table_joined_anew_wait_until_stored(false, &added_back).await;
}
