//! `--config`: a file setting every setting of `run`, each key taken from clap's definition,
//! starts pgoutbox, which streams; `status` reads the same file. A key no command takes
//! stops pgoutbox in one line naming the nearest one, and a variable wins over the file.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use clap::CommandFactory;
use pgoutbox::settings::cli::Cli;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::{Nats, Postgres, eventually, free_port, metric};

/// The outbox the file names, every column role named otherwise than by default.
const TABLE: &str = "CREATE ROLE cfg_owner; CREATE SCHEMA cfg; CREATE TABLE cfg.events (\
    evt_id bigserial PRIMARY KEY, body jsonb NOT NULL, hdrs jsonb, agg_type text NOT NULL, \
    agg_id text NOT NULL, evt_type text NOT NULL, made_at timestamptz NOT NULL DEFAULT now(), \
    ttl text, deliver_at timestamptz)";

fn insert(n: u32) -> String {
    format!(
        "INSERT INTO cfg.events (body, agg_type, agg_id, evt_type) \
         VALUES ('{{\"n\": {n}}}', 'order', 'o-{n}', 'created')"
    )
}

/// A TOML value: a string, quoted as TOML quotes it.
fn text(value: &str) -> String {
    toml::Value::from(value).to_string()
}

/// What the file sets each of `run`'s settings to, as TOML: a value other than the default
/// wherever one works against these servers; `Err` says why a setting is left out.
fn values(
    dir: &Path,
    pg: &Postgres,
    nats: &Nats,
    http: u16,
) -> BTreeMap<&'static str, Result<String, &'static str>> {
    let path = |name: &str| text(&dir.join(name).display().to_string());
    let (major, minor) = nats.release();
    let since = |wanted: (u32, u32), value: &str| match (major, minor) >= wanted {
        true => Ok(text(value)),
        false => Err("this nats-server is too old for it"),
    };
    let failover = crate::support::pg_bin::major() >= 17;
    let monitor = format!("http://127.0.0.1:{}", nats.monitor_port());
    BTreeMap::from([
        ("database-url", Ok(text(&pg.url()))),
        ("slot", Ok(text("cfg_slot"))),
        ("publication", Ok(text("cfg_pub"))),
        ("own-schema", Ok(text("cfg_own"))),
        ("database-password-command", Ok(text("echo unused-under-trust"))),
        ("database-password-command-timeout", Ok(text("5s"))),
        ("nats-url", Ok(text(&format!("tls://127.0.0.1:{}", nats.port())))),
        ("nats-monitor-url", Ok(format!("[{}]", text(&monitor)))),
        ("stream", Ok(text("CFG"))),
        ("subject-template", Ok(text("cfg.{agg_type}.{evt_type}.{$partition}"))),
        ("dead-letter-subject", Ok(text("cfg_dead.letters"))),
        ("transaction-subject", Ok(text("cfg_dead.transactions"))),
        ("nats-creds", Ok(path("user.creds"))),
        ("nats-nkey", Ok(path("user.nk"))),
        ("nats-tls-ca", Ok(path("ca.pem"))),
        ("nats-tls-cert", Ok(path("client.pem"))),
        ("nats-tls-key", Ok(path("client.key"))),
        ("table", Ok(format!("[{}]", text("cfg.events")))),
        ("id-column", Ok(text("evt_id"))),
        ("payload-column", Ok(text("body"))),
        ("headers-column", Ok(text("hdrs"))),
        ("aggregate-type-column", Ok(text("agg_type"))),
        ("aggregate-id-column", Ok(text("agg_id"))),
        ("partitions", Ok("4".into())),
        ("event-type-column", Ok(text("evt_type"))),
        ("created-at-column", Ok(text("made_at"))),
        // true streams emitted messages alone: no row of the table would be streamed.
        ("messages-only", Ok("false".into())),
        ("replay-table", Ok(text("cfg.events_replays"))),
        ("trusted-owner", Ok(format!("[{}, {}]", text("cfg_owner"), text("postgres")))),
        ("cloudevents", Ok(text("structured"))),
        ("cloudevents-source", Ok(text("/tests/config-file"))),
        ("ttl-column", since((2, 11), "ttl")),
        ("schedule-column", since((2, 12), "deliver_at")),
        ("schedule-subject-prefix", Ok(text("cfg_held"))),
        (
            "allow-nats-header",
            Ok(format!("[{}, {}]", text("Nats-Example-A"), text("Nats-Example-B"))),
        ),
        ("log-format", Ok(text("json"))),
        ("failover", if failover { Ok("true".into()) } else { Err("PostgreSQL 17+") }),
        ("from-standby", Err("needs a standby (and conflicts with failover)")),
        ("recreate-slot", Ok("true".into())),
        ("stream-replicas", Err("one server: 1, the default")),
        ("object-store", Ok(text("cfg_payloads"))),
        ("object-store-over", Ok(text("256KiB"))),
        ("object-store-max-size", Ok(text("128MiB"))),
        ("object-store-replicas", Ok("1".into())),
        // Never: a bucket may not expire before the stream's messages, kept forever here.
        ("object-store-max-age", Ok(text("0s"))),
        ("message-prefix", Ok(text("cfg"))),
        ("http-addr", Ok(text(&format!("127.0.0.1:{http}")))),
        ("backfill", Ok("true".into())),
        ("recover", Ok("false".into())), // conflicts with backfill
        ("recover-margin", Ok(text("5m"))),
        ("retention", Ok(text("7d"))),
        ("stall-timeout", Ok(text("90s"))),
        ("durability-horizon", Ok(text("5s"))),
        ("verify-every", Ok(text("1m"))),
        ("max-in-flight-bytes", Ok(text("16MiB"))),
    ])
}

/// The file: a key for every flag of `run` as clap defines it (but `--config`), each from
/// [`values`]; a flag it does not know fails the test, as does a value for no flag.
fn every_run_setting(mut values: BTreeMap<&'static str, Result<String, &'static str>>) -> String {
    let mut cli = Cli::command();
    cli.build();
    let run = cli.find_subcommand("run").expect("the run command");
    let mut file = String::from("# Every setting of pgoutbox run\n");
    for arg in run.get_arguments() {
        let Some(long) = arg.get_long().filter(|l| !matches!(*l, "help" | "version" | "config"))
        else {
            continue;
        };
        match values.remove(long) {
            Some(Ok(value)) => file.push_str(&format!("{long} = {value}\n")),
            Some(Err(why)) => file.push_str(&format!("# {long}: not set here, {why}\n")),
            None => panic!("run --{long} is new: give it a value in config_file.rs"),
        }
    }
    assert!(values.is_empty(), "values for no flag of run: {:?}", values.keys());
    file
}

/// A nats-server with mutual TLS and an NKey user, and the files pgoutbox logs in with:
/// the seed, and a creds file of the same user (its JWT unused without an operator).
fn nats_with_tls_and_nkey(dir: &Path) -> Nats {
    crate::support::certs::ca_and_server(dir, "IP:127.0.0.1,DNS:localhost");
    crate::support::certs::client(dir);
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().expect("a seed");
    std::fs::write(dir.join("user.nk"), &seed).expect("write the seed");
    let creds = format!(
        "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QifQ.e30.unused\n------END NATS USER JWT------\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    );
    std::fs::write(dir.join("user.creds"), creds).expect("write the creds");
    let file = |name: &str| dir.join(name).display().to_string();
    let config = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}\n\
         authorization {{ users = [ {{ nkey: {} }} ] }}\n",
        file("server.pem"),
        file("server.key"),
        file("ca.pem"),
        user.public_key()
    );
    let path = dir.join("nats.conf");
    std::fs::write(&path, config).expect("write nats.conf");
    Nats::start_with_args(&["-c", path.to_str().expect("a UTF-8 path")])
}

/// pgoutbox with none of the harness's settings: the file gives them.
fn bare(pg: &Postgres, nats: &Nats) -> Command {
    let mut cmd = command(pg, nats);
    for variable in ["PGOUTBOX_DATABASE_URL", "PGOUTBOX_NATS_URL", "PGOUTBOX_HTTP_ADDR"] {
        cmd.env_remove(variable);
    }
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn a_config_file_with_every_run_setting_starts_run_and_it_streams() {
    let dir = tempfile::tempdir().expect("dir");
    let nats = nats_with_tls_and_nkey(dir.path());
    let pg = Postgres::start();
    pg.psql(TABLE);
    pg.psql(&insert(1)); // before the slot: --backfill publishes it
    let http = free_port();
    let file = dir.path().join("pgoutbox.toml");
    let toml = every_run_setting(values(dir.path(), &pg, &nats, http));
    std::fs::write(&file, &toml).expect("write the file");
    let config = file.to_str().expect("a UTF-8 path");
    let mut run = bare(&pg, &nats);
    run.args(["--config", config, "run"]);
    let app = Pgoutbox::spawn(run);
    // With --backfill, a seed slot streams first; it becomes cfg_slot a horizon later.
    let streaming = || app.log().contains(r#""message":"streaming""#);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !streaming() {
        assert!(Instant::now() < deadline, "never streamed:\n{toml}\n{}", app.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pg.psql(&insert(2));
    // status reads the same file: run's keys are not its own, and are ignored.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let output = bare(&pg, &nats).args(["--config", config, "status", "--json"]).output();
        let output = output.expect("status runs");
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        // The row --backfill seeded (no transaction: no end), and the row streamed, with
        // its transaction's end.
        if report["stream"]["messages"] == 3 {
            break;
        }
        let why = String::from_utf8_lossy(&output.stderr);
        assert!(Instant::now() < deadline, "{report} {why}\n{toml}\n{}", app.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // /metrics at the file's http-addr, once the acks are counted.
    let series = "pgoutbox_rows_published_total{table=\"cfg.events\"} ";
    eventually(Duration::from_secs(10), "two rows published on /metrics", || async {
        (metric(http, series) == Some(2.0)).then_some(())
    })
    .await;
    let log = app.log();
    assert!(log.lines().all(|l| l.starts_with('{')), "log-format = \"json\":\n{log}");
}

#[test]
fn an_unknown_key_stops_pgoutbox_in_one_line_naming_the_nearest() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("pgoutbox.toml");
    std::fs::write(&file, "stream = \"EVENTS\"\nretension = \"7d\"\n").expect("write the file");
    let output = Command::new(env!("CARGO_BIN_EXE_pgoutbox"))
        .env_remove("PGOUTBOX_CONFIG")
        .args(["--config", file.to_str().expect("a UTF-8 path"), "run"])
        .output()
        .expect("pgoutbox runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let said = format!(
        "error: --config {}: line 2: unknown key \"retension\"; did you mean \"retention\"?\n",
        file.display()
    );
    assert_eq!(stderr, said);
}

#[test]
fn a_variable_wins_over_the_file() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("pgoutbox.toml");
    let unreachable = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let toml = format!("retention = \"not a duration\"\ndatabase-url = {}\n", text(&unreachable));
    std::fs::write(&file, toml).expect("write the file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgoutbox"));
    let ours = |key: &str| key.starts_with("PGOUTBOX_") || key == "DATABASE_URL";
    for (key, _) in std::env::vars().filter(|(key, _)| ours(key)) {
        cmd.env_remove(key);
    }
    let output = cmd
        .env("PGOUTBOX_RETENTION", "7d")
        .args(["--config", file.to_str().expect("a UTF-8 path"), "run"])
        .output()
        .expect("pgoutbox runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(!stderr.contains("retention"), "the variable's value was not used: {stderr}");
    assert!(stderr.contains("could not connect to Postgres"), "the file's URL was: {stderr}");
}
