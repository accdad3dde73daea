use std::time::Duration;

use clap::CommandFactory;

use super::*;
use crate::settings::cli::{CloudEventsMode, LogFormat};

/// An environment holding `0`'s variables (clap still reads the process's own).
struct FakeEnv(&'static [(&'static str, &'static str)]);

impl Env for FakeEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string())
    }
}

/// `argv` (after `pgoutbox`, the command included) with the file `toml` read in.
fn resolved(toml: &str, argv: &[&str]) -> Result<(Cli, Vec<CommonArgs>), String> {
    resolved_with(toml, argv, &[])
}

fn resolved_with(
    toml: &str,
    argv: &[&str],
    env: &'static [(&'static str, &'static str)],
) -> Result<(Cli, Vec<CommonArgs>), String> {
    let file = FileSettings::parse(toml).map_err(|err| err.to_string())?;
    let matches = Cli::command()
        .try_get_matches_from(std::iter::once("pgoutbox").chain(argv.iter().copied()))
        .map_err(|err| err.to_string())?;
    argv::apply(&file, &matches, &FakeEnv(env)).map_err(|err| err.to_string())
}

fn error(toml: &str, argv: &[&str]) -> String {
    resolved(toml, argv).err().unwrap_or_else(|| panic!("{toml:?} with {argv:?} was taken"))
}

const EXAMPLE: &str = r#"
stream = "EVENTS"
dead-letter-subject = "events.dead_letter"      # default for every [[table]]

[[table]]
table = "orders.outbox"
subject-template = "orders.{event_type}"
dead-letter-subject = "orders.dead_letter"

[[table]]
table = "billing.outbox"
subject-template = "billing.{aggregate_type}.{event_type}"
cloudevents = "binary"
ttl-column = "ttl"
"#;

#[test]
fn the_example_parses_and_each_entry_inherits_the_top_level() {
    let (cli, tables) = resolved(EXAMPLE, &["status"]).expect("the example is taken");
    let top = cli.common;
    assert_eq!(top.stream, "EVENTS");
    assert_eq!(top.dead_letter_subject, "events.dead_letter");
    assert_eq!(tables.len(), 2);
    let (orders, billing) = (&tables[0], &tables[1]);
    assert_eq!(orders.table, ["orders.outbox"]);
    assert_eq!(orders.dead_letter_subject, "orders.dead_letter");
    assert_eq!(orders.subject_template, "orders.{event_type}");
    assert_eq!(orders.cloudevents, None);
    assert_eq!(billing.dead_letter_subject, "events.dead_letter", "inherited");
    assert_eq!(billing.cloudevents, Some(CloudEventsMode::Binary));
    assert_eq!(billing.ttl_column.as_deref(), Some("ttl"));
    assert_eq!(billing.id_column, "id", "the flag's default");
    assert_eq!(billing.stream, "EVENTS");
}

#[test]
fn an_unknown_key_is_refused_in_one_line_with_the_nearest_known_one() {
    let err = FileSettings::parse("stream = \"E\"\nretension = \"7d\"\n").unwrap_err().to_string();
    assert_eq!(err, r#"line 2: unknown key "retension"; did you mean "retention"?"#);
    let err = FileSettings::parse("[[table]]\ntable = \"a.b\"\n\nsubject = \"x\"\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"line 4: unknown key "subject"; did you mean "subject-template"?"#
    );
    let err = FileSettings::parse("[[table]]\ntable = \"a.b\"\nslot = \"x\"\n").unwrap_err();
    assert!(err.to_string().contains("line 3: [[table]] slot: a setting of every table"), "{err}");
    let err = FileSettings::parse("ids = [\"1\"]\n").unwrap_err().to_string();
    assert!(err.contains("ids is a one-off flag of replay"), "{err}");
    let err = FileSettings::parse("json = true\n").unwrap_err().to_string();
    assert!(err.contains("one-off flag of status and verify"), "{err}");
    // A value its flag refuses: clap's own message, on the key's line.
    let err = error("stream = \"E\"\ncloudevents = \"xml\"\n", &["status"]);
    assert!(err.starts_with("line 2: invalid value 'xml' for '--cloudevents"), "{err}");
    assert!(!err.contains('\n'), "one line: {err}");
}

#[test]
fn every_setting_of_run_is_a_key_read_by_its_flags_parser() {
    let toml = r#"
        retention = "7d"
        durability-horizon = "2m"
        http-addr = "127.0.0.1:9999"
        max-in-flight-bytes = 1048576
        backfill = true
        log-format = "json"
        trusted-owner = ["app", "billing"]
        allow-nats-header = "Nats-TTL"
        object-store = "payloads"
        object-store-over = "256KiB"
        database-password-command-timeout = "3s"
    "#;
    let (cli, _) = resolved(toml, &["run"]).expect("run takes every key");
    let Command::Run(run) = cli.command else { panic!("run") };
    assert_eq!(run.retention, Some(Duration::from_secs(7 * 86_400)));
    assert_eq!(cli.common.durability_horizon, Duration::from_secs(120));
    assert_eq!(run.http_addr.map(|a| a.port()), Some(9999));
    assert_eq!((run.max_in_flight_bytes, run.backfill), (1 << 20, true));
    assert_eq!(run.slot.objects.object_store.as_deref(), Some("payloads"));
    assert_eq!(run.slot.objects.object_store_over, Some(256 << 10));
    assert_eq!(cli.common.trusted_owner, ["app", "billing"]);
    assert_eq!(cli.common.allow_nats_header, ["Nats-TTL"]);
    assert_eq!(cli.common.log_format, LogFormat::Json);
    assert_eq!(cli.common.database_password_command_timeout, Duration::from_secs(3));
    let err = error("retention = \"7x\"\n", &["run"]);
    assert!(err.starts_with("line 1: invalid value '7x' for '--retention <DURATION>'"), "{err}");
}

#[test]
fn one_file_serves_every_command_each_reading_its_own_keys() {
    let toml = "http-addr = \"127.0.0.1:9999\"\nretention = \"7d\"\nmax-lag-bytes = 42\n\
                tenant-trigger = true\nstream = \"S\"\n";
    let (cli, _) = resolved(toml, &["status"]).expect("status ignores run's keys");
    let Command::Status(status) = cli.command else { panic!("status") };
    assert_eq!((status.max_lag_bytes, cli.common.stream.as_str()), (42, "S"));
    assert_eq!(status.http_addr.map(|a| a.port()), Some(9999), "shared with run");
    let (cli, _) = resolved(toml, &["setup"]).expect("setup ignores status's keys");
    let Command::Setup(setup) = cli.command else { panic!("setup") };
    assert!(setup.tenant_trigger);
    resolved(toml, &["teardown", "--yes"]).expect("teardown too");
}

#[test]
fn switches_lists_and_conflicts_are_claps_own() {
    let (cli, _) = resolved("backfill = false\nrecover = true\n", &["run"]).expect("taken");
    let Command::Run(run) = cli.command else { panic!("run") };
    assert!(run.recover && !run.backfill);
    let err = error("backfill = true\nrecover = true\n", &["run"]);
    assert!(err.contains("cannot be used with") && err.contains("'--recover'"), "{err}");
    let err = error("stream = \"S\"\nbackfill = true\n", &["run", "--recover"]);
    assert!(err.starts_with("line 2: the argument '--") && err.contains("'--recover'"), "{err}");
    let err = error("nats-tls-cert = \"/c.pem\"\n", &["status"]);
    assert!(err.contains("not provided: --nats-tls-key <FILE>"), "{err}");
    let err = error("backfill = \"yes\"\n", &["run"]);
    assert_eq!(err, "line 1: backfill: true or false");
    let err = FileSettings::parse("stream = 1.5\n").unwrap_err().to_string();
    assert!(err.starts_with("line 1: stream: a float is no value"), "{err}");
    let (cli, _) = resolved("table = [\"a.outbox\", \"b.outbox\"]\n", &["status"]).unwrap();
    assert_eq!(cli.common.table, ["a.outbox", "b.outbox"], "a list is the flag repeated");
}

#[test]
fn a_flag_beats_the_top_level_and_never_a_table_key() {
    let argv = ["--stream", "MINE", "status", "--dead-letter-subject", "flag.dead"];
    let (cli, tables) = resolved(EXAMPLE, &argv).expect("taken");
    assert_eq!(cli.common.stream, "MINE");
    assert_eq!(tables[0].dead_letter_subject, "orders.dead_letter", "the entry's own key");
    assert_eq!(tables[1].dead_letter_subject, "flag.dead", "the flag over the top level");
    assert_eq!(tables[1].stream, "MINE");
    // A value equal to the default, given, is given: it wins over the file.
    let (cli, _) = resolved(EXAMPLE, &["--stream", "OUTBOX", "status"]).unwrap();
    assert_eq!(cli.common.stream, "OUTBOX");
}

#[test]
fn a_url_variable_read_besides_clap_beats_the_file() {
    let toml = "database-url = \"dbname=file\"\nnats-url = \"nats://file:4222\"\n";
    let env = &[("DATABASE_URL", "dbname=env"), ("NATS_URL", "nats://env:4222")];
    let (cli, _) = resolved_with(toml, &["status"], env).unwrap();
    assert_eq!((cli.common.database_url, cli.common.nats_url), (None, None), "left to config");
    let (cli, _) = resolved(toml, &["status"]).unwrap();
    assert_eq!(cli.common.database_url.as_deref(), Some("dbname=file"));
}

#[test]
fn table_flag_with_table_entries_is_refused() {
    let err = error(EXAMPLE, &["--table", "x", "status"]);
    assert!(err.contains("[[table]]") && err.contains("one place"), "{err}");
    // Without entries, --table names the tables, shared settings from the file.
    let (cli, tables) = resolved("stream = \"E\"", &["--table", "x", "status"]).unwrap();
    let top = cli.common;
    assert_eq!((top.table, tables.len(), top.stream.as_str()), (vec!["x".into()], 0, "E"));
}

#[test]
fn partitions_are_a_table_key_and_a_top_level_default() {
    let text = "partitions = 4\n\n[[table]]\ntable = \"a.outbox\"\n\n\
                [[table]]\ntable = \"b.outbox\"\npartitions = 16\n";
    let (cli, tables) = resolved(text, &["status"]).expect("taken");
    assert_eq!(cli.common.partitions, Some(4));
    assert_eq!((tables[0].partitions, tables[1].partitions), (Some(4), Some(16)));
    let err = error("[[table]]\ntable = \"a.outbox\"\n\npartitions = \"x\"\n", &["status"]);
    assert!(err.starts_with("line 4: [[table]] a.outbox: invalid value 'x'"), "{err}");
    let err = FileSettings::parse("[[table]]\nid-column = \"x\"\n").unwrap_err().to_string();
    assert!(err.contains("line 1: [[table]] without table"), "{err}");
}
