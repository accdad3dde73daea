use std::collections::HashMap;

use clap::Parser;

use super::*;
use crate::settings::cli::Cli;

struct FakeEnv(HashMap<&'static str, &'static str>);

impl Env for FakeEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).map(|v| v.to_string())
    }
}

fn config(args: &[&str], env: &[(&'static str, &'static str)]) -> anyhow::Result<Config> {
    let mut argv = vec!["pgoutbox"];
    argv.extend_from_slice(args);
    argv.push("status");
    let cli = Cli::try_parse_from(argv)?;
    let files = crate::postgres::libpq_env::RealFiles;
    Config::from_args(&cli.common, &FakeEnv(env.iter().copied().collect()), &files)
}

#[test]
fn nats_credentials_leave_the_server_addresses() {
    let url = "nats://app:s3cret@127.0.0.1:4222,nats://t0ken@127.0.0.2:4222";
    let c = config(&["--nats-url", url], &[("DATABASE_URL", "postgres://u@h:1/db")]).unwrap();
    let addresses = format!("{:?}", c.nats.servers);
    assert!(!addresses.contains("s3cret") && !addresses.contains("t0ken"), "{addresses}");
    assert_eq!(c.nats.servers[1].host(), "127.0.0.2");
    assert_eq!(c.nats.auth.user_password, Some(("app".into(), "s3cret".into())));
}

#[test]
fn database_url_falls_back_to_the_unprefixed_variable() {
    let c = config(&[], &[("DATABASE_URL", "postgres://u@h:1/db")]).unwrap();
    assert_eq!(c.database.get_dbname(), Some("db"));
    let c = config(
        &[],
        &[("DATABASE_URL", "postgres://u@h:1/db"), ("PGOUTBOX_DATABASE_URL", "host=x dbname=mine")],
    )
    .unwrap();
    assert_eq!(c.database.get_dbname(), Some("mine"));
    let c = config(&["--database-url", "dbname=flag"], &[("PGOUTBOX_DATABASE_URL", "dbname=env")])
        .unwrap();
    assert_eq!(c.database.get_dbname(), Some("flag"));
}

#[test]
fn nats_url_defaults_and_falls_back() {
    let base = [("DATABASE_URL", "dbname=x")];
    let c = config(&[], &base).unwrap();
    assert_eq!(c.nats.servers.len(), 1);
    assert_eq!(c.nats.servers[0].port(), 4222);
    let c = config(&[], &[base[0], ("NATS_URL", "nats://a:1,nats://b:2")]).unwrap();
    assert_eq!(c.nats.servers.len(), 2);
    let c =
        config(&[], &[base[0], ("NATS_URL", "nats://a:1"), ("PGOUTBOX_NATS_URL", "nats://c:3")])
            .unwrap();
    assert_eq!(c.nats.servers[0].port(), 3);
}

#[test]
fn missing_database_url_says_how_to_give_one() {
    let err = config(&[], &[]).err().unwrap().to_string();
    assert!(err.contains("--database-url"), "{err}");
}

#[test]
fn bad_settings_are_refused_with_the_flag_named() {
    let base = [("DATABASE_URL", "dbname=x")];
    for (args, flag) in [
        (vec!["--subject-template", "outbox.{a"], "--subject-template"),
        (vec!["--table", "a.b.c"], "--table"),
        (vec!["--slot", "Bad-Slot"], "--slot"),
        (vec!["--dead-letter-subject", "a..b"], "--dead-letter-subject"),
        (vec!["--database-url", "postgres://x:notaport"], "--database-url"),
    ] {
        let err = format!("{:#}", config(&args, &base).err().unwrap());
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

#[test]
fn stream_subjects_add_the_dead_letter_subject_unless_covered() {
    let base = [("DATABASE_URL", "dbname=x")];
    let c = config(&[], &base).unwrap();
    assert_eq!(c.stream_subjects(), ["outbox.*.*", "outbox.dead_letter"]);
    let c = config(&["--subject-template", "outbox.{event_type}"], &base).unwrap();
    assert_eq!(c.stream_subjects(), ["outbox.*"]);
}

#[test]
fn the_transaction_subject_joins_the_stream_and_may_not_overlap_an_event_s() {
    let base = [("DATABASE_URL", "dbname=x")];
    let c = config(&["--transaction-subject", "outbox.transactions"], &base).unwrap();
    assert_eq!(c.stream_subjects(), ["outbox.*.*", "outbox.dead_letter", "outbox.transactions"]);
    assert_eq!(c.pipeline.transaction_subject.as_deref(), Some("outbox.transactions"));
    for (subject, flag) in [
        ("outbox.order.created", "--subject-template"),
        ("outbox.dead_letter", "--dead-letter-subject"),
        ("outbox.*", "--transaction-subject"),
    ] {
        let err =
            format!("{:#}", config(&["--transaction-subject", subject], &base).err().unwrap());
        assert!(err.contains(flag) && !err.contains('\n'), "{subject}: {err}");
    }
}

#[test]
fn cloudevents_and_nats_controls_are_read_and_checked() {
    let db = [("DATABASE_URL", "postgres://u@h:1/shop")];
    let c =
        config(&["--cloudevents", "--ttl-column=ttl", "--allow-nats-header=Nats-Trace-Dest"], &db)
            .unwrap();
    let roles = &c.entry().roles;
    let cloudevents = roles.cloudevents.as_ref().expect("--cloudevents alone is binary");
    assert_eq!((cloudevents.mode, cloudevents.database.as_str()), (ContentMode::Binary, "shop"));
    assert_eq!(roles.allowed_nats_headers, ["nats-trace-dest"]);
    assert!(Config::required_columns(c.entry()).contains(&("TTL column", "ttl")));
    assert!(c.stream_features().message_ttl);
    let c = config(&["--cloudevents=structured"], &db).unwrap();
    assert_eq!(
        c.entry().roles.cloudevents.as_ref().map(|ce| ce.mode),
        Some(ContentMode::Structured)
    );
    for never in ["Nats-Expected-Last-Sequence", "Nats-Schedule", "Trace-Id"] {
        let err = config(&[&format!("--allow-nats-header={never}")], &db).err().expect(never);
        assert!(err.to_string().starts_with("--allow-nats-header: "), "{err}");
    }
}

#[test]
fn several_tables_share_the_settings_and_qualify_their_ids() {
    let db = [("DATABASE_URL", "dbname=x")];
    let c = config(&["--table", "orders.outbox", "--table", "billing.outbox"], &db).unwrap();
    let tables: Vec<String> = c.pipeline.tables.iter().map(|e| e.table.to_string()).collect();
    assert_eq!(tables, ["orders.outbox", "billing.outbox"]);
    assert!(c.pipeline.tables.iter().all(|e| e.message_id == MessageId::Qualified));
    assert_eq!(c.table.to_string(), "orders.outbox");
    assert_eq!(c.stream_subjects(), ["outbox.*.*", "outbox.dead_letter"]);
    let one = config(&["--table", "outbox"], &db).unwrap();
    assert_eq!(one.entry().message_id, MessageId::Row, "one table keeps its plain ids");
    let err = config(&["--table", "a.t,public.t,t"], &db).err().unwrap().to_string();
    assert!(err.contains("names public.t twice"), "{err}");
}

/// `Config::load` with a file holding `toml`, the command line `args` before `status`.
fn loaded(
    toml: &str,
    args: &[&str],
    env: &[(&'static str, &'static str)],
) -> anyhow::Result<Config> {
    use clap::{CommandFactory, FromArgMatches};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgoutbox.toml");
    std::fs::write(&path, toml).unwrap();
    let path = path.to_str().unwrap().to_owned();
    let mut argv = vec!["pgoutbox", "--config", path.as_str()];
    argv.extend_from_slice(args);
    argv.push("status");
    let matches = Cli::command().try_get_matches_from(argv)?;
    let env = FakeEnv(env.iter().copied().collect());
    let (cli, tables) =
        crate::settings::file::resolve(Cli::from_arg_matches(&matches)?, &matches, &env)?;
    let files = crate::postgres::libpq_env::RealFiles;
    Config::load(&cli.common, &tables, &env, &files)
}

#[test]
fn a_config_file_gives_each_table_its_subjects() {
    let toml = r#"
        database-url = "dbname=file"
        dead-letter-subject = "events.dead_letter"
        [[table]]
        table = "orders.outbox"
        subject-template = "orders.{event_type}"
        dead-letter-subject = "orders.dead_letter"
        [[table]]
        table = "billing.outbox"
        subject-template = "billing.{aggregate_type}.{event_type}"
    "#;
    let c = loaded(toml, &[], &[]).unwrap();
    assert_eq!(c.database.get_dbname(), Some("file"));
    let subjects: Vec<_> = c.pipeline.tables.iter().map(|e| e.template.to_string()).collect();
    assert_eq!(subjects, ["orders.{event_type}", "billing.{aggregate_type}.{event_type}"]);
    assert_eq!(c.pipeline.tables[1].dead_letter_subject, "events.dead_letter");
    assert!(c.pipeline.tables.iter().all(|e| e.message_id == MessageId::Qualified));
    assert_eq!(
        c.stream_subjects(),
        ["orders.*", "billing.*.*", "events.dead_letter", "outbox.*.*"],
        "orders.* covers orders.dead_letter; outbox.*.* is the emitted messages'"
    );
    assert_eq!(c.dead_letter_subjects(), ["orders.dead_letter", "events.dead_letter"]);
    // PGOUTBOX_DATABASE_URL wins over the file too (clap reads it; here, as libpq's
    // DATABASE_URL, the environment `config` is given).
    let c = loaded(toml, &[], &[("PGOUTBOX_DATABASE_URL", "dbname=env")]).unwrap();
    assert_eq!(c.database.get_dbname(), Some("env"));
    let tenants = "[[table]]\ntable = \"tenant_*.outbox\"\n\
                   subject-template = \"tenants.{$schema}.{event_type}\"\n";
    let c = loaded(tenants, &[], &[("DATABASE_URL", "dbname=x")]).unwrap();
    let entry = &c.pipeline.tables[0];
    assert_eq!(entry.pattern.as_ref().map(ToString::to_string).as_deref(), Some("tenant_*.outbox"));
    assert_eq!(entry.message_id, MessageId::Qualified, "two tenants' ids collide");
    assert_eq!(c.stream_subjects()[0], "tenants.*.*");
    let err = loaded(
        "[[table]]\ntable = \"a.t\"\nsubject-template = \"a.{\"\n",
        &[],
        &[("DATABASE_URL", "dbname=x")],
    );
    let err = format!("{:#}", err.err().unwrap());
    assert!(err.contains("[[table]] a.t in --config"), "{err}");
}

#[test]
fn a_replay_names_its_table_when_there_are_several() {
    let base = [("DATABASE_URL", "dbname=x")];
    let one = config(&[], &base).unwrap();
    assert_eq!(one.replay_entry(None).unwrap().table.to_string(), "public.outbox");
    let two = config(&["--table", "public.outbox,billing.outbox"], &base).unwrap();
    let refused = two.replay_entry(None).unwrap_err().to_string();
    assert!(refused.contains("--from-table names one of: public.outbox, billing.outbox"));
    let named = two.replay_entry(Some("billing.outbox")).unwrap();
    assert_eq!(named.table.to_string(), "billing.outbox");
    assert_eq!(named.message_id, MessageId::Qualified);
    let unknown = two.replay_entry(Some("sales.outbox")).unwrap_err().to_string();
    assert!(unknown.contains("not a configured table"), "{unknown}");
    assert!(two.replay_entry(Some("a.b.c")).is_err());
}

#[test]
fn a_replay_of_a_pattern_names_one_of_its_tables_and_uses_the_patterns_replay_table() {
    let base = [("DATABASE_URL", "dbname=x")];
    let tenants = config(&["--table", "tenant_*.outbox"], &base).unwrap();
    let refused = tenants.replay_entry(None).unwrap_err().to_string();
    assert!(refused.contains("pattern (tenant_*.outbox), --from-table"), "{refused}");
    // The pattern itself is no table: named as such, before any SQL is sent.
    let pattern = tenants.replay_entry(Some("tenant_*.outbox")).unwrap_err().to_string();
    assert!(pattern.contains("not a pattern") && pattern.contains("tenant_1.outbox"), "{pattern}");
    let one = tenants.replay_entry(Some("tenant_7.outbox")).unwrap();
    assert_eq!(one.table.to_string(), "tenant_7.outbox");
    let other = tenants.replay_entry(Some("other.outbox")).unwrap_err().to_string();
    assert!(other.contains("matched by no configured pattern"), "{other}");
    assert_eq!(tenants.pipeline.replay_table.to_string(), "public.pgoutbox_replay");
    // A table named exactly keeps its replay table beside it, a pattern before it or not.
    let mixed = config(&["--table", "tenant_*.outbox,billing.outbox"], &base).unwrap();
    assert_eq!(mixed.pipeline.replay_table.to_string(), "billing.outbox_replay");
    let named = mixed.replay_entry(Some("billing.outbox")).unwrap();
    assert!(named.pattern.is_none(), "the exact entry, not the pattern's");
}

#[test]
fn a_chosen_replay_table_replaces_the_default_and_may_not_be_an_outbox_table() {
    let base = [("DATABASE_URL", "dbname=x")];
    let chosen = |args: &[&str]| config(args, &base).map(|c| c.pipeline.replay_table.to_string());
    assert_eq!(
        chosen(&["--table", "tenant_*.outbox", "--replay-table", "ops.replays"]).unwrap(),
        "ops.replays"
    );
    assert_eq!(chosen(&["--replay-table", "replays"]).unwrap(), "public.replays");
    for (args, why) in [
        (&["--replay-table", "public.outbox"][..], "is an outbox table (--table public.outbox)"),
        (&["--table", "tenant_*.outbox", "--replay-table", "tenant_9.outbox"], "is an outbox"),
        (&["--replay-table", "ops.*"], "names one table, not a pattern"),
        (&["--replay-table", "a.b.c"], "--replay-table"),
    ] {
        let refused = chosen(args).unwrap_err().to_string();
        assert!(refused.contains(why), "{args:?}: {refused}");
    }
}

#[test]
fn a_schedule_prefix_overlapping_the_events_or_the_dead_letters_is_refused() {
    let env = [("DATABASE_URL", "postgres://u@h:1/db")];
    let with = |prefix: &'static str| {
        let held = ["--schedule-column", "deliver_at", "--schedule-subject-prefix", prefix];
        config(&[&held[..], &["--dead-letter-subject", "held.letters"]].concat(), &env)
    };
    for (prefix, overlaps) in [("outbox", "--subject-template"), ("held", "dead-letter")] {
        let Err(err) = with(prefix) else { panic!("{prefix} was taken") };
        let err = err.to_string();
        assert!(err.contains(overlaps) && err.contains("overlap"), "{prefix}: {err}");
    }
    assert!(with("schedules.OUTBOX").is_ok());
}

#[test]
fn partitions_and_their_placeholder_come_together_or_are_refused_in_one_line() {
    let env = [("DATABASE_URL", "postgres://u@h:1/db")];
    let template = ["--subject-template", "orders.{$partition}.{event_type}"];
    let c = config(&[&template[..], &["--partitions", "8"]].concat(), &env).unwrap();
    assert_eq!(c.entry().template.partitions(), Some(8));
    assert_eq!(c.entry().template.wildcard(), "orders.*.*");
    let columns = Config::required_columns(c.entry());
    assert!(
        columns
            .iter()
            .any(|(role, column)| role.contains("{$partition}") && *column == "aggregate_id")
    );
    for (args, why) in [
        (&[&template[..], &["--partitions", "0"]].concat(), "--partitions 0"),
        (&template.to_vec(), "--partitions is not set"),
        (&vec!["--partitions", "4"], "has no {$partition}"),
    ] {
        let Err(err) = config(args, &env) else { panic!("{args:?} was taken") };
        let err = format!("{err:#}");
        assert!(err.contains(why) && !err.contains('\n'), "{args:?}: {err}");
    }
}

#[test]
fn the_former_name_of_allow_nats_headers_variable_is_refused_saying_the_new_one() {
    let env = [("DATABASE_URL", "dbname=x"), ("PGOUTBOX_ALLOW_NATS_HEADERS", "Nats-A")];
    let err = config(&[], &env).err().unwrap().to_string();
    assert!(err.contains("is now PGOUTBOX_ALLOW_NATS_HEADER"), "{err}");
}
