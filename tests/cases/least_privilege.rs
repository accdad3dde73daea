//! pgoutbox runs as a role with only REPLICATION and SELECT on the outbox table, after an
//! admin ran sql/grants.sql; and no command ever prints a password it was given.

use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{count, jetstream};
use crate::support::{
    Nats, Postgres, eventually, free_port, http_get, numbered_rows, wait_until_streaming,
};

const PASSWORD: &str = "Pw-9f3b-Secret";

fn grants_with_password() -> String {
    include_str!("../../sql/grants.sql").replace(":password", &format!("'{PASSWORD}'"))
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_as_a_role_with_only_replication_and_select() {
    let pg = Postgres::builder().hba("host all pgoutbox 127.0.0.1/32 scram-sha-256").start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(&grants_with_password());
    let rights = pg.psql(
        "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication FROM pg_roles \
         WHERE rolname = 'pgoutbox'",
    );
    assert_eq!(rights, "f|f|f|t");
    let nats = Nats::start();
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_DATABASE_URL", pg.url_for("pgoutbox", Some(PASSWORD), "postgres")).arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 10, 10));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "rows streamed by the least-privileged role", || async {
        (count(&js, "OUTBOX").await == 10).then_some(())
    })
    .await;
    let inserted = pg.try_psql("SET ROLE pgoutbox; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'b', 'c', '{}')");
    assert!(inserted.is_err(), "the role can write the outbox");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_command_prints_the_password_from_the_url() {
    let pg = Postgres::builder().hba("host all pgoutbox 127.0.0.1/32 scram-sha-256").start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(&grants_with_password());
    let nats = Nats::start();
    let url = pg.url_for("pgoutbox", Some(PASSWORD), "postgres");
    let wrong = pg.url_for("pgoutbox", Some(&format!("{PASSWORD}-wrong")), "postgres");
    let unreachable = format!("postgres://pgoutbox:{PASSWORD}@127.0.0.1:{}/postgres", free_port());
    let mut seen = String::new();

    // The long-running command, its log and its metrics.
    let http = free_port();
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_DATABASE_URL", &url)
        .env("PGOUTBOX_HTTP_ADDR", format!("127.0.0.1:{http}"))
        .env("RUST_LOG", "debug")
        .arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 5, 5));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "rows streamed", || async {
        (count(&js, "OUTBOX").await == 5).then_some(())
    })
    .await;
    seen.push_str(&http_get(http, "/metrics").expect("metrics").1);
    seen.push_str(&http_get(http, "/readyz").expect("readyz").1);

    // Every other command, succeeding and failing, with the password on the flag and in env.
    let runs: Vec<(Vec<&str>, &str)> = vec![
        (vec!["status"], url.as_str()),
        (vec!["status", "--json"], url.as_str()),
        (vec!["setup"], url.as_str()),
        (vec!["teardown"], url.as_str()),
        (vec!["status", "--json"], wrong.as_str()),
        (vec!["run"], wrong.as_str()),
        (vec!["setup"], unreachable.as_str()),
        (vec!["status"], unreachable.as_str()),
        (vec!["run", "--subject-template", "bad.{"], url.as_str()),
    ];
    for (args, database_url) in runs {
        for via_flag in [false, true] {
            let mut cmd = command(&pg, &nats);
            cmd.env("RUST_LOG", "debug").args(&args);
            if via_flag {
                cmd.env_remove("PGOUTBOX_DATABASE_URL").arg("--database-url").arg(database_url);
            } else {
                cmd.env("PGOUTBOX_DATABASE_URL", database_url);
            }
            let output = cmd.output().expect("pgoutbox runs");
            seen.push_str(&String::from_utf8_lossy(&output.stdout));
            seen.push_str(&String::from_utf8_lossy(&output.stderr));
        }
    }
    app.sigterm();
    let mut app = app;
    app.wait_exit(Duration::from_secs(30));
    seen.push_str(&app.log());
    assert!(seen.contains("password authentication failed"), "the failures did not run:\n{seen}");
    assert!(!seen.contains(PASSWORD), "the password leaked:\n{seen}");
}

/// An admin ran `pgoutbox setup` (as docs/operations.md suggests), so the record of what
/// JetStream acknowledged is the admin's; pgoutbox then runs as its least-privileged role,
/// which writes only its own tables: it says so in one warning naming the owner and the
/// commands that fix it (never an ownership change of a table to pgoutbox). Before, an INFO
/// line said only "missing or owned by another role".
#[tokio::test(flavor = "multi_thread")]
async fn a_record_table_made_by_an_admin_is_a_warning_with_the_commands_that_fix_it() {
    let pg = Postgres::builder().hba("host all pgoutbox 127.0.0.1/32 scram-sha-256").start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(&grants_with_password());
    let nats = Nats::start();
    let setup = command(&pg, &nats).arg("setup").output().expect("setup as the admin");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));
    let owner = "SELECT tableowner FROM pg_tables WHERE schemaname = 'pgoutbox' AND tablename = 'acknowledged'";
    assert_eq!(pg.psql(owner), "postgres");
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_DATABASE_URL", pg.url_for("pgoutbox", Some(PASSWORD), "postgres")).arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 1, 1));
    let line = eventually(Duration::from_secs(20), "the warning", || async {
        let log = app.log();
        log.lines().find(|l| l.contains("no record of what JetStream")).map(str::to_owned)
    })
    .await;
    assert!(line.contains("WARN"), "{line}");
    for says in ["\"postgres\"", "DROP TABLE pgoutbox.acknowledged", "pgoutbox setup"] {
        assert!(line.contains(says), "no {says:?} in {line}");
    }
    assert!(!line.contains("OWNER TO"), "an ownership change advised: {line}");
}
