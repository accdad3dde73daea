//! The operator commands speak once: `setup`, `status` and `teardown` print their result and
//! nothing else; an error is one line on stderr; `--help` is grouped; `status --watch`
//! refreshes in place.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::support::pgoutbox::command;
use crate::support::{Nats, Postgres, eventually, free_port};

/// The command as a user runs it: no RUST_LOG.
fn quiet(pg: &Postgres, nats: &Nats, args: &[&str]) -> Output {
    let mut cmd = command(pg, nats);
    cmd.env_remove("RUST_LOG").args(args);
    cmd.output().expect("pgoutbox runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn setup_status_and_teardown_print_their_result_and_nothing_else() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    for args in [&["setup"][..], &["status"], &["status", "--json"], &["teardown", "--yes"]] {
        let output = quiet(&pg, &nats, args);
        assert!(output.status.code().is_some_and(|c| c <= 1), "{args:?}: {}", stderr(&output));
        assert_eq!(stderr(&output), "", "{args:?} wrote to stderr");
        if args[0] == "status" {
            assert!(!output.stdout.is_empty(), "status printed nothing");
        }
    }
}

/// `status` on a default setup, where PUBLIC may still emit events, says so in its report,
/// not on stderr; `setup` with emitted events turned on warns with the `REVOKE` of exactly the overloads this server has
/// (three arguments before PostgreSQL 17, four from 17), which runs as written and quiets
/// it.
#[test]
fn the_emit_warning_is_a_status_line_and_its_revoke_runs_as_written() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let status = quiet(&pg, &nats, &["status", "--json"]);
    assert_eq!(stderr(&status), "", "status wrote to stderr");
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).expect("JSON");
    assert_eq!(report["postgres"]["public_may_emit_message"], true, "{report:#}");
    let setup = quiet(&pg, &nats, &["setup", "--message-prefix", "outbox"]);
    let said = stderr(&setup);
    let revoke = said
        .split('`')
        .find(|part| part.starts_with("REVOKE EXECUTE ON FUNCTION"))
        .unwrap_or_else(|| panic!("no REVOKE in the warning: {said}"));
    assert_eq!(Some(revoke), report["postgres"]["emit_message_fix"].as_str());
    pg.psql(revoke);
    let setup = quiet(&pg, &nats, &["setup", "--message-prefix", "outbox"]);
    assert_eq!(stderr(&setup), "", "setup still warns after the REVOKE it advised");
}

/// `--help` shows each flag's variable and its value, but never the password command's
/// (`-h` leaves that flag to `--help`).
#[test]
fn help_never_prints_the_password_command() {
    for args in [&["--help"][..], &["run", "--help"], &["run", "-h"]] {
        let output = Command::new(env!("CARGO_BIN_EXE_pgoutbox"))
            .env("PGOUTBOX_DATABASE_PASSWORD_COMMAND", "vault read -field=s3cret db/creds")
            .args(args)
            .output()
            .expect("pgoutbox --help runs");
        let help = String::from_utf8_lossy(&output.stdout);
        let long = args.contains(&"--help");
        assert!(!long || help.contains("PGOUTBOX_DATABASE_PASSWORD_COMMAND"), "{args:?}: {help}");
        assert!(!help.contains("s3cret"), "{args:?} printed the command:\n{help}");
    }
}

#[test]
fn an_error_is_one_line_on_stderr() {
    let pg = Postgres::start();
    let nats = Nats::start();
    for args in [
        &["status", "--database-url", "postgres://u@h:notaport/db"][..],
        &["setup", "--database-url", "postgres://u@h:notaport/db"],
        &["run", "--database-url", "host=127.0.0.1 port=notaport"],
        &["setup", "--table", "public.missing"],
    ] {
        let output = quiet(&pg, &nats, args);
        let text = stderr(&output);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert_eq!(text.lines().count(), 1, "{args:?}: not one line:\n{text}");
        assert!(text.starts_with("error: "), "{args:?}: {text}");
    }
}

#[test]
fn status_json_on_an_unreachable_database_keeps_the_document_and_says_why_on_stderr() {
    let nats = Nats::start();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgoutbox"));
    cmd.env_remove("RUST_LOG")
        .env_remove("DATABASE_URL")
        .env("PGOUTBOX_NATS_URL", nats.url())
        .env("PGOUTBOX_DATABASE_URL", format!("postgres://postgres@127.0.0.1:{}/x", free_port()))
        .args(["status", "--json"]);
    let output = cmd.output().expect("pgoutbox runs");
    assert_eq!(output.status.code(), Some(2));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(report["health"], "critical");
    let text = stderr(&output);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("error: ") && text.contains("connect"), "{text}");
}

#[test]
fn help_is_grouped_under_headings() {
    for args in [&["--help"][..], &["run", "--help"], &["status", "--help"]] {
        let output = Command::new(env!("CARGO_BIN_EXE_pgoutbox")).args(args).output().unwrap();
        let help = String::from_utf8_lossy(&output.stdout);
        let section = |heading: &str| crate::support::pgoutbox::help_section(&help, heading);
        assert!(section("Postgres").contains("--database-url"), "{help}");
        assert!(section("NATS").contains("--nats-url"), "{help}");
        assert!(section("Outbox table").contains("--id-column"), "{help}");
        assert!(section("Operations").contains("--log-format"), "{help}");
        if args[0] == "run" {
            assert!(section("Operations").contains("--retention"), "{help}");
            assert!(section("Outbox table").contains("--message-prefix"), "{help}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn status_watch_refreshes_in_place_with_trend_and_rate() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    assert!(quiet(&pg, &nats, &["setup"]).status.success());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("watch.out");
    let mut cmd = command(&pg, &nats);
    cmd.env_remove("RUST_LOG")
        .args(["status", "--watch"])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null());
    let child = cmd.spawn().unwrap();
    let screen = eventually(Duration::from_secs(20), "three refreshes", || async {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        (text.matches("\x1b[H\x1b[2J").count() >= 3).then_some(text)
    })
    .await;
    // SIGINT, as Ctrl-C: the watch ends by itself.
    let pid = child.id().to_string();
    Command::new("kill").args(["-INT", &pid]).status().unwrap();
    let child = std::sync::Mutex::new(child);
    let exited = eventually(Duration::from_secs(10), "the watch to end on Ctrl-C", || async {
        child.lock().unwrap().try_wait().ok().flatten()
    })
    .await;
    assert!(exited.code().is_some(), "killed by the signal instead of ending: {exited:?}");
    let last = screen.rsplit("\x1b[H\x1b[2J").next().unwrap();
    assert!(last.lines().any(|l| l.starts_with("lag ") && l.contains("steady")), "{last}");
    assert!(last.lines().any(|l| l.starts_with("rows/s") && l.contains('0')), "{last}");
    assert!(last.contains("confirmed_flush_lsn"), "{last}");
}

/// `pgoutbox status --json | head -1`, and the other commands that print: a reader that
/// closed the pipe ends the command quietly with 141 (as SIGPIPE would), never with a panic
/// (101, "failed printing to stdout: Broken pipe" and a backtrace, before).
#[test]
fn a_reader_that_closed_the_pipe_ends_a_command_quietly() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    for args in [&["setup"][..], &["status", "--json"], &["status"], &["teardown", "--yes"]] {
        let mut cmd = command(&pg, &nats);
        cmd.env_remove("RUST_LOG").args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("pgoutbox runs");
        drop(child.stdout.take()); // the reader is gone before the first line
        let out = child.wait_with_output().expect("pgoutbox ends");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(141), "pgoutbox {args:?}: {err}");
        assert!(!err.contains("panicked"), "pgoutbox {args:?}: {err}");
    }
}

/// The README's path, twice (a first start and a restart): `setup` and `run` with the defaults
/// print no WARN and no Postgres NOTICE (before: the emitted-events warning at every start,
/// and two `NOTICE: column … already exists, skipping` at every start after the first).
#[tokio::test(flavor = "multi_thread")]
async fn the_default_path_says_no_warning_and_no_notice() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let setup = quiet(&pg, &nats, &["setup"]);
    assert_eq!(stderr(&setup), "", "setup wrote to stderr");
    for start in ["first", "second"] {
        let mut cmd = command(&pg, &nats);
        cmd.env_remove("RUST_LOG").arg("run");
        let app = crate::support::pgoutbox::Pgoutbox::spawn(cmd);
        crate::support::wait_until_streaming(&pg, &app).await;
        pg.psql(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('order', '1', 'created', '{}')",
        );
        // The record of what was acknowledged is written within a second: its table's
        // columns are checked then.
        eventually(Duration::from_secs(10), "the record written", || async {
            let q = "SELECT count(*) FROM pgoutbox.acknowledged";
            (pg.try_psql(q).as_deref() == Ok("1")).then_some(())
        })
        .await;
        let log = app.log();
        crate::support::stop_and_wait_released(&pg, app).await;
        assert!(!log.contains(" WARN ") && !log.contains("NOTICE"), "{start} start:\n{log}");
        // A few lines that say what streams, from where, to where.
        let start_lines = log.lines().take_while(|l| !l.contains(" streaming ")).count();
        assert!(start_lines <= 4, "{start} start said {start_lines} lines first:\n{log}");
        let streaming = log.lines().find(|l| l.contains(" streaming ")).unwrap_or_default();
        for says in ["tables=public.outbox", "stream=OUTBOX", "nats=", "slot=pgoutbox"] {
            assert!(streaming.contains(says), "no {says} in {streaming}");
        }
    }
}
