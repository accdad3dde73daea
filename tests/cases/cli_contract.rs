//! The errors a user will meet: one clear line and a non-zero exit within seconds, never a
//! panic or a backtrace; and the operator commands' contract.

use std::process::Output;
use std::time::{Duration, Instant};

use crate::support::pgoutbox::{Pgoutbox, command, help_section};
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, free_port, wait_until_streaming};

/// Runs a pgoutbox command to completion (it must finish within 20 s).
fn run(mut cmd: std::process::Command) -> (Output, Duration) {
    let started = Instant::now();
    let mut app = Pgoutbox::spawn({
        cmd.env("RUST_BACKTRACE", "1");
        cmd
    });
    let status = app.wait_exit(Duration::from_secs(20));
    let stderr = app.log();
    let output = Output { status, stdout: Vec::new(), stderr: stderr.into_bytes() };
    (output, started.elapsed())
}

/// Asserts a clean failure whose `error:` line contains every one of `needles`.
fn assert_fails_with(output: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "expected a failure; log:\n{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("stack backtrace"), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no `error:` line in:\n{stderr}"));
    for needle in needles {
        assert!(line.contains(needle), "{needle:?} not in {line:?}");
    }
}

#[test]
fn database_unreachable_fails_fast() {
    let nats = Nats::start();
    let mut cmd = command_without_pg(&nats);
    cmd.arg("run")
        .arg("--database-url")
        .arg(format!("postgres://postgres@127.0.0.1:{}/postgres", free_port()));
    let (output, took) = run(cmd);
    assert_fails_with(&output, &["could not connect to Postgres"]);
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// TLS settings are checked when the settings are read, before anything is connected:
/// a verify mode without a CA file, or a CA file that cannot be read, is one line at
/// start-up, not a "could not connect" at each reconnection.
#[test]
fn postgres_tls_mistakes_are_refused_at_start_up() {
    let nats = Nats::start();
    let port = free_port();
    for (query, needle) in [
        ("sslmode=verify-full", "sslmode=verify-full needs sslrootcert"),
        (
            "sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem",
            "cannot read sslrootcert /nonexistent/ca.pem",
        ),
    ] {
        let mut cmd = command_without_pg(&nats);
        cmd.arg("run")
            .arg("--database-url")
            .arg(format!("postgres://postgres@127.0.0.1:{port}/postgres?{query}"));
        let (output, _) = run(cmd);
        assert_fails_with(&output, &[needle]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("could not connect"), "checked only at connect time: {stderr}");
    }
}

#[test]
fn wrong_password_is_named() {
    let pg = Postgres::builder().hba("host all app 127.0.0.1/32 scram-sha-256").start();
    pg.psql("SET password_encryption = 'scram-sha-256'; CREATE ROLE app LOGIN REPLICATION PASSWORD 'right'");
    let nats = Nats::start();
    let mut cmd = command(&pg, &nats);
    cmd.arg("run").arg("--database-url").arg(pg.url_for("app", Some("wrong"), "postgres"));
    let (output, _) = run(cmd);
    assert_fails_with(&output, &["password authentication failed", "app"]);
    assert!(!String::from_utf8_lossy(&output.stderr).contains("wrong"), "password leaked");
}

#[test]
fn wal_level_replica_says_how_to_fix_it() {
    let pg = Postgres::builder().conf("wal_level = replica").start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let nats = Nats::start();
    let mut cmd = command(&pg, &nats);
    cmd.arg("run");
    let (output, _) = run(cmd);
    assert_fails_with(&output, &["wal_level", "logical", "ALTER SYSTEM"]);
}

#[test]
fn missing_table_is_named() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let mut cmd = command(&pg, &nats);
    cmd.arg("run");
    let (output, _) = run(cmd);
    assert_fails_with(&output, &["public.outbox", "does not exist", "sql/outbox.sql"]);
}

#[test]
fn role_without_replication_is_told_what_to_grant() {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE ROLE plain LOGIN; GRANT SELECT ON outbox TO plain");
    let nats = Nats::start();
    let mut cmd = command(&pg, &nats);
    cmd.arg("run").arg("--database-url").arg(pg.url_for("plain", None, "postgres"));
    let (output, _) = run(cmd);
    assert_fails_with(&output, &["REPLICATION", "plain"]);
}

#[test]
fn jetstream_disabled_is_named() {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let nats = Nats::start_without_jetstream();
    let mut cmd = command(&pg, &nats);
    cmd.arg("run");
    let (output, took) = run(cmd);
    assert_fails_with(&output, &["JetStream is not enabled", "-js"]);
    assert!(took < Duration::from_secs(15), "took {took:?}");
}

#[test]
fn teardown_needs_yes() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let mut cmd = command(&pg, &nats);
    cmd.arg("teardown");
    let (output, _) = run(cmd);
    assert_fails_with(&output, &["--yes"]);
}

#[test]
fn bad_subject_template_is_refused() {
    let pg = Postgres::start();
    let nats = Nats::start();
    let mut cmd = command(&pg, &nats);
    cmd.args(["run", "--subject-template", "outbox.{unclosed"]);
    let (output, _) = run(cmd);
    assert_fails_with(&output, &["--subject-template"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_unreachable_at_start_is_retried_until_it_appears() {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let port = free_port();
    let mut cmd = command_without_pg_url(&pg);
    cmd.arg("run").arg("--nats-url").arg(format!("nats://127.0.0.1:{port}"));
    let app = Pgoutbox::spawn(cmd);
    eventually(Duration::from_secs(15), "a retry logged", || async {
        app.log().contains("NATS unreachable; retrying").then_some(())
    })
    .await;
    let nats = Nats::start_on_port(port);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&crate::support::numbered_rows(0, 10, 10));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "10 rows stored", || async {
        (count(&js, "OUTBOX").await == 10).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn status_json_reports_the_slot_and_exits_by_health() {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let nats = Nats::start();

    let mut before_setup = command(&pg, &nats);
    before_setup.args(["status", "--json"]);
    let output = before_setup.output().expect("status runs");
    assert_eq!(output.status.code(), Some(2), "a missing slot is critical");

    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&crate::support::numbered_rows(0, 5, 5));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "5 rows stored", || async {
        (count(&js, "OUTBOX").await == 5).then_some(())
    })
    .await;
    let mut status = command(&pg, &nats);
    status.args(["status", "--json"]);
    let output = status.output().expect("status runs");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("status --json prints JSON");
    assert_eq!(report["slot"], "pgoutbox");
    assert_eq!(report["active"], true);
    assert_eq!(report["wal_status"], "reserved");
    assert_eq!(report["health"], "healthy");
    for field in ["confirmed_flush_lsn", "current_wal_lsn", "restart_lsn"] {
        assert!(report[field].as_str().is_some_and(|v| v.contains('/')), "{field}: {report}");
    }
    assert!(report["lag_bytes"].as_i64().is_some(), "{report}");
    assert_eq!(report["stream"]["messages"], 5);

    drop(app);
    eventually(Duration::from_secs(10), "slot inactive", || async {
        (pg.psql("SELECT active FROM pg_replication_slots") == "f").then_some(())
    })
    .await;
    let mut inactive = command(&pg, &nats);
    inactive.args(["status"]);
    let output = inactive.output().expect("status runs");
    assert_eq!(output.status.code(), Some(1), "an inactive slot is a warning");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("confirmed_flush_lsn") && table.contains("not active"), "{table}");
}

fn command_without_pg(nats: &Nats) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pgoutbox"));
    cmd.env_remove("PGOUTBOX_DATABASE_URL").env_remove("DATABASE_URL");
    cmd.env("PGOUTBOX_NATS_URL", nats.url());
    cmd
}

fn command_without_pg_url(pg: &Postgres) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pgoutbox"));
    cmd.env_remove("PGOUTBOX_NATS_URL").env_remove("NATS_URL");
    cmd.env("PGOUTBOX_DATABASE_URL", pg.url());
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_one_object_per_line() {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let nats = Nats::start();
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_LOG_FORMAT", "json").env("RUST_LOG", "info").arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    eventually(Duration::from_secs(10), "the streaming line", || async {
        app.log().contains("streaming").then_some(())
    })
    .await;
    let log = app.log();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let object: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(object["level"].is_string() && object["fields"].is_object(), "{line}");
    }
    assert!(log.contains("\"message\":\"streaming\""), "{log}");
}

/// Each subcommand's `--help` offers its own flags only, under their headings.
#[test]
fn help_offers_each_command_its_own_flags_under_headings() {
    let help = |args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pgoutbox"));
        let output = cmd.args(args).arg("--help").output().expect("--help runs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let replay = help(&["replay"]);
    assert!(!replay.contains("--stream-replicas"), "{replay}");
    for command in ["run", "setup"] {
        assert!(help(&[command]).contains("--stream-replicas"), "{command} lost it");
    }
    // --failover and --from-standby are Postgres settings, listed under that heading.
    let run = help(&["run"]);
    for flag in ["--failover", "--from-standby", "--recreate-slot"] {
        assert!(help_section(&run, "Postgres").contains(flag), "{flag} not under Postgres:\n{run}");
    }
    assert!(!help_section(&run, "Options").contains("--failover"), "{run}");
}

/// `pgoutbox <args>` with no pgoutbox settings in the environment, on a terminal `columns`
/// wide as clap sees one without a TTY (the `COLUMNS` variable): its stdout, on success.
fn reference(args: &[&str], columns: u16) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pgoutbox"));
    for (key, _) in std::env::vars() {
        if key.starts_with("PGOUTBOX_") || key == "DATABASE_URL" || key == "NATS_URL" {
            cmd.env_remove(key);
        }
    }
    let output = cmd.args(args).env("COLUMNS", columns.to_string()).output().expect("it runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "pgoutbox {args:?} failed: {stderr}");
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// The longest line of `text`, in characters, with the line.
fn widest(text: &str) -> (usize, &str) {
    text.lines().map(|l| (l.chars().count(), l)).max().unwrap_or_default()
}

/// `-h` is the short help: every line fits an 80-column terminal and the whole in a screen
/// or two, the flags only experts need left to `--help`, which keeps every detail.
#[test]
fn short_help_fits_a_terminal_and_long_help_has_it_all() {
    for command in [&[][..], &["run"], &["setup"], &["status"], &["replay"], &["verify"]] {
        for flag in ["-h", "--help"] {
            let help = reference(&[command, &[flag]].concat(), 80);
            let (width, line) = widest(&help);
            assert!(width <= 80, "{command:?} {flag}: {width} columns: {line:?}");
        }
    }
    let short = reference(&["run", "-h"], 80);
    let long = reference(&["run", "--help"], 80);
    assert!(short.lines().count() <= 60, "run -h is {} lines:\n{short}", short.lines().count());
    assert!(short.lines().count() < long.lines().count(), "{short}");
    assert!(!short.contains("--recreate-slot") && long.contains("--recreate-slot"), "{short}");
    let first = |text: &str, flags: &[&str]| {
        let at = |flag: &str| text.find(flag).unwrap_or_else(|| panic!("{flag} missing"));
        flags.windows(2).all(|w| at(w[0]) < at(w[1]))
    };
    assert!(first(&short, &["--database-url", "--nats-url", "--table"]), "{short}");
    assert!(first(&long, &["--database-url", "--recreate-slot"]), "{long}");
    // Without a terminal or COLUMNS, help is wrapped too, to 100 columns.
    let mut bare = std::process::Command::new(env!("CARGO_BIN_EXE_pgoutbox"));
    let output = bare.env_remove("COLUMNS").args(["run", "--help"]).output().expect("it runs");
    let (width, line) = widest(std::str::from_utf8(&output.stdout).expect("UTF-8"));
    assert!(width <= 100, "{width} columns: {line:?}");
}

/// `--help` shows how the commands are used, with examples.
#[test]
fn long_help_has_examples() {
    let top = reference(&["--help"], 100);
    let examples = top.split("Examples:").nth(1).unwrap_or_else(|| panic!("none in:\n{top}"));
    for command in ["pgoutbox setup", "pgoutbox run", "pgoutbox status", "pgoutbox replay"] {
        assert!(examples.contains(command), "{command} not in the examples:\n{top}");
    }
    for command in ["run", "setup", "status", "replay"] {
        let help = reference(&[command, "--help"], 100);
        assert!(help.contains("Examples:"), "{command} --help has no examples:\n{help}");
        let short = reference(&[command, "-h"], 100);
        assert!(short.contains("--help"), "{command} -h does not point to --help:\n{short}");
    }
}

/// Shell completions and the man page are made from the same definitions as `--help`.
#[test]
fn completions_and_man_page_come_from_the_definitions() {
    let bash = reference(&["completions", "bash"], 100);
    assert!(bash.contains("_pgoutbox") && bash.contains("--database-url"), "{bash}");
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let script = reference(&["completions", shell], 100);
        assert!(script.contains("pgoutbox") && script.contains("database-url"), "{shell}");
    }
    let man = reference(&["man"], 100);
    assert!(man.starts_with(".ie") || man.starts_with(".TH"), "not roff:\n{man}");
    assert!(man.contains(".TH pgoutbox 1") && man.contains("database\\-url"), "{man}");
    let run = reference(&["man", "run"], 100);
    assert!(run.contains(".TH pgoutbox-run 1") && run.contains("recreate\\-slot"), "{run}");
}

/// Another stream already takes subjects pgoutbox's stream needs: JetStream only says
/// "subjects overlap with an existing stream"; pgoutbox names that stream, the subjects of
/// both, and what to run, in one line.
#[tokio::test(flavor = "multi_thread")]
async fn subjects_taken_by_another_stream_are_named() {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let nats = Nats::start();
    let js = jetstream(&nats.url()).await;
    let other = async_nats::jetstream::stream::Config {
        name: "OTHER".into(),
        subjects: vec!["outbox.>".into()],
        ..Default::default()
    };
    js.create_stream(other).await.expect("stream OTHER");
    let mut cmd = command(&pg, &nats);
    cmd.env_remove("RUST_LOG").arg("setup");
    let output = cmd.output().expect("setup runs");
    // Ours and OTHER's, and the ways out: write into OTHER, or change either side.
    let needles = ["OUTBOX", "outbox.*.*", "outbox.dead_letter", "stream OTHER", "outbox.>"];
    let ways = ["--stream OTHER", "--subject-template", "nats stream edit OTHER --subjects"];
    assert_fails_with(&output, &[&needles[..], &ways[..]].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

/// `--version` names the commit the binary was built from (the upgrade guide is keyed to
/// commits; before, it said `0.1.0` alone): this checkout's own.
#[test]
fn version_names_the_commit_it_was_built_from() {
    let binary = env!("CARGO_BIN_EXE_pgoutbox");
    let out = std::process::Command::new(binary).arg("--version").output().expect("--version");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    let expected = format!("pgoutbox {} (commit {head}", env!("CARGO_PKG_VERSION"));
    assert!(out.status.success() && said.starts_with(&expected), "{said:?}, expected {expected}");
}
