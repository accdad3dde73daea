//! A table is judged whole before it is touched, and one table never stops the rest (issue
//! 69, T4-T9). Owning a table is not owning its parts: a table handed over to pgoutbox's
//! role keeps its former owner's operators, partition key, inheritance children, rules and
//! partitions' triggers, each of which runs as whoever plans, reads or deletes. The traps
//! are those of `hostile_database` (`tests/fixtures/hostile/trap.sql`).

use std::time::Duration;

use super::hostile_database::{
    MALLORY_IS_SUPERUSER, TENANTS, TRAP, assert_no_trap_ran, assert_ran, assert_says, pgoutbox,
    sprung, stored_per_tenant, tenants,
};
use super::several_tables::{tenant_rows, tenant_table};
use crate::support::pgoutbox::Pgoutbox;
use crate::support::{Nats, Postgres, eventually, metric, stop_and_wait_released};
use crate::support::{stream::count, stream::jetstream, wait_until_streaming};

/// The tenants of `tests/fixtures/hostile/handed_over.sql`, each with what its refusal
/// names: the part of the table that would run mallory's code.
const HANDED_OVER: [(&str, &str); 5] = [
    ("tenant_t4", "operator tenant_t4.###"),
    ("tenant_t5", "partition key of tenant_t5.outbox"),
    ("tenant_t6", "tenant_t6.child"),
    ("tenant_t7", "rule on_delete on tenant_t7.outbox"),
    ("tenant_t8", "trigger on_delete on tenant_t8.outbox_all"),
];

/// `tenant_rows`, a day old: old enough for retention as soon as they are published.
fn old_rows(schema: &str, from: usize, to: usize) -> String {
    tenant_rows(schema, from, to).replace(
        "(aggregate_type, aggregate_id, event_type, payload) VALUES (",
        "(created_at, aggregate_type, aggregate_id, event_type, payload) VALUES \
         (now() - interval '1 day', ",
    )
}

/// The first line of `log` that contains every one of `says`.
fn line_with(log: &str, says: &[&str]) -> Option<String> {
    log.lines().find(|l| says.iter().all(|s| l.contains(s))).map(str::to_owned)
}

/// T4-T8: five tenants' tables handed over to pgoutbox's role (a superuser here), each
/// with a part of mallory's: her operator in an index and a statistics expression, a
/// partition key calling her function, an inheritance child with its own index, check and
/// trigger, an `ON DELETE` rule, a trigger on a partition. Adoption, retention, `verify`,
/// `replay` and a recovery spring none of it, and each refuses the table in one line naming
/// the part; the other tenant streams and its old rows are deleted. Before, the trust check
/// followed functions only: adoption read T4, T5 and T6 (planning her index, statistics and
/// partition key), and retention's `DELETE` (without `ONLY`) fired the rule and the
/// partition's trigger, each making mallory a superuser.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_handed_over_is_judged_with_every_part_of_it() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(TRAP);
    pg.psql(&tenant_table("tenant_a"));
    assert_ran(&pgoutbox(&pg, &nats, &[&TENANTS[..], &["setup"]].concat()), "setup");
    pg.psql(include_str!("../fixtures/hostile/handed_over.sql"));
    let retention = ["--retention", "1s", "--durability-horizon", "0s"];
    let app = Pgoutbox::run(&pg, &nats, &[&TENANTS[..], &retention].concat());
    wait_until_streaming(&pg, &app).await;
    let judged = |log: &str| {
        HANDED_OVER
            .iter()
            .all(|(schema, _)| line_with(log, &[&format!("{schema}.outbox")]).is_some())
    };
    eventually(Duration::from_secs(40), "each handed-over table judged", || async {
        (judged(&app.log()) || !sprung(&pg).is_empty()).then_some(())
    })
    .await;
    assert_no_trap_ran(&pg, "adopting the handed-over tables");
    for (schema, part) in HANDED_OVER {
        let table = format!("{schema}.outbox");
        let said = match schema {
            // A table with an inheritance child is left out whole (T9).
            "tenant_t6" => line_with(&app.log(), &[&table, "is left out"]),
            _ => line_with(&app.log(), &[&table, "were not read"]),
        };
        let said = said.unwrap_or_else(|| panic!("no line on {table} in:\n{}", app.log()));
        assert_says(&said, &[part]);
    }
    let t6 = "SELECT count(*) FROM pg_publication_tables WHERE schemaname = 'tenant_t6'";
    assert_eq!(pg.psql(t6), "0", "a table with an inheritance child was published");

    // Retention: tenant_a's old rows go; each handed-over table is skipped, naming the part.
    let rows: String = ["tenant_a", "tenant_t4", "tenant_t5", "tenant_t7", "tenant_t8"]
        .iter()
        .map(|schema| old_rows(schema, 10, 12))
        .collect();
    pg.psql(&rows);
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(40), "the 10 new rows stored", || async {
        (count(&js, "OUTBOX").await >= 10).then_some(())
    })
    .await;
    let skipped = |log: &str, schema: &str| {
        line_with(log, &["retention skips the table", &format!("{schema}.outbox")])
    };
    eventually(Duration::from_secs(40), "retention's pass over every table", || async {
        let log = app.log();
        let all = HANDED_OVER
            .iter()
            .filter(|(s, _)| *s != "tenant_t6")
            .all(|(s, _)| skipped(&log, s).is_some());
        let tenant_a_emptied = pg.psql("SELECT count(*) FROM tenant_a.outbox") == "0";
        ((all && tenant_a_emptied) || !sprung(&pg).is_empty()).then_some(())
    })
    .await;
    assert_no_trap_ran(&pg, "retention over the handed-over tables");
    for (schema, part) in HANDED_OVER.iter().filter(|(s, _)| *s != "tenant_t6") {
        let said = skipped(&app.log(), schema).unwrap_or_default();
        assert_says(&said, &[part, "\"mallory\""]);
        let kept = pg.psql(&format!("SELECT count(*) FROM {schema}.outbox"));
        assert_eq!(kept, "4", "retention deleted from {schema}.outbox");
    }

    // verify and replay refuse each table in one line naming the part (tenant_t6.outbox,
    // left out of the publication, is verified as a table of its own).
    for (schema, part) in HANDED_OVER {
        let table = format!("{schema}.outbox");
        let from = ["--from-table", &table];
        let tables = match schema {
            "tenant_t6" => vec!["--table", &table, TENANTS[2], TENANTS[3]],
            _ => TENANTS.to_vec(),
        };
        let commands = match schema {
            // replay hands rows to the stream through the publication, which leaves it out.
            "tenant_t6" => vec![&["verify"][..]],
            _ => vec![&["verify"][..], &["replay", "--created-from", "2000-01-01"]],
        };
        for command in commands {
            let out = pgoutbox(&pg, &nats, &[&tables[..], command, &from].concat());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{} read {schema}: {stderr}", command[0]);
            let said = stderr.lines().last().unwrap_or_default();
            assert_says(said, &["does not read table", part, "--trusted-owner mallory"]);
        }
    }
    assert_no_trap_ran(&pg, "verify and replay of the handed-over tables");

    // The slot is lost; a recovery reads tenant_a and none of the others.
    stop_and_wait_released(&pg, app).await;
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql(&tenant_rows("tenant_a", 20, 21));
    let app = Pgoutbox::run(&pg, &nats, &[&TENANTS[..], &["--recover"]].concat());
    wait_until_streaming(&pg, &app).await;
    eventually(Duration::from_secs(40), "tenant_a's new row stored", || async {
        (count(&js, "OUTBOX").await >= 11).then_some(())
    })
    .await;
    assert_no_trap_ran(&pg, "run --recover");
    for (schema, part) in HANDED_OVER.iter().filter(|(s, _)| *s != "tenant_t6") {
        let table = format!("{schema}.outbox");
        let said = line_with(&app.log(), &["the seed reads the other tables", &table]);
        assert_says(&said.unwrap_or_else(|| panic!("{table}: {}", app.log())), &[part]);
    }
    assert_eq!(pg.psql(MALLORY_IS_SUPERUSER), "f");
}

/// T9: mallory's own tenant table with an inheritance child (`ADD TABLE` would publish the
/// child by its own name, and `SELECT` and `DELETE` reach it), made while pgoutbox runs, is
/// left out with one warning and `pgoutbox_tables_not_streamed`; another of her tables,
/// published at setup, gets a child afterwards. Every other tenant streams, and `setup` and
/// `run` start again. Before, the first was adopted child and all, and from then on every
/// `setup` and every `run` start exited: one tenant stopped them all.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_with_an_inheritance_child_never_stops_the_others() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(TRAP);
    pg.psql(&tenant_table("tenant_a"));
    pg.psql(&format!("SET ROLE mallory;\n{}RESET ROLE;", tenant_table("tenant_n")));
    assert_ran(&pgoutbox(&pg, &nats, &[&TENANTS[..], &["setup"]].concat()), "setup");
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!(
        "SET ROLE mallory;\n{}\
         CREATE TABLE tenant_m.outbox_more () INHERITS (tenant_m.outbox);\n\
         CREATE TABLE tenant_n.outbox_more () INHERITS (tenant_n.outbox);\n{}{}RESET ROLE;",
        tenant_table("tenant_m"),
        tenant_rows("tenant_m", 0, 2),
        tenant_rows("tenant_m", 0, 1).replace("tenant_m.outbox", "tenant_m.outbox_more"),
    ));
    pg.psql(&tenant_rows("tenant_a", 0, 2));
    let left_out = |log: &str| line_with(log, &["tenant_m.outbox", "is left out"]);
    let in_publication = "SELECT count(*) FROM pg_publication_tables WHERE schemaname = 'tenant_m'";
    eventually(Duration::from_secs(30), "tenant_m.outbox judged", || async {
        (left_out(&app.log()).is_some() || pg.psql(in_publication) != "0").then_some(())
    })
    .await;
    let stored = stored_per_tenant(&nats, 2, &|| app.log()).await;
    assert_eq!(stored, tenants(&[("tenant_a", 2)]), "{}", app.log());
    stop_and_wait_released(&pg, app).await;

    // Across a restart: setup and run start, and tenant_a streams on.
    let setup = pgoutbox(&pg, &nats, &[&TENANTS[..], &["setup"]].concat());
    assert_ran(&setup, "setup after a tenant made an inheritance child");
    let app = Pgoutbox::run(&pg, &nats, &TENANTS);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&tenant_rows("tenant_a", 2, 4));
    let stored = stored_per_tenant(&nats, 4, &|| app.log()).await;
    assert_eq!(stored, tenants(&[("tenant_a", 4)]), "{}", app.log());
    let line = eventually(Duration::from_secs(25), "the warning on tenant_m.outbox", || async {
        left_out(&app.log())
    })
    .await;
    assert_says(&line, &["tenant_m.outbox_more", "inheritance"]);
    let not_streamed = metric(app.http_port(), "pgoutbox_tables_not_streamed ");
    assert!(not_streamed >= Some(1.0), "{not_streamed:?}; log:\n{}", app.log());
    assert_eq!(pg.psql(in_publication), "0", "tenant_m.outbox was published");
    let said = String::from_utf8_lossy(&setup.stderr);
    assert_says(&said, &["tenant_n.outbox", "tenant_n.outbox_more"]);
    assert_no_trap_ran(&pg, "a tenant with an inheritance child");
}
