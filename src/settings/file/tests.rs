use clap::Parser;

use super::*;
use crate::settings::cli::Cli;

/// The arguments `argv` gives, and which of them were given (`explicit`).
fn args(argv: &[&str]) -> CommonArgs {
    let mut full = vec!["pgoutbox"];
    full.extend_from_slice(argv);
    full.push("status");
    Cli::try_parse_from(full).expect("valid arguments").common
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
    let file = FileSettings::parse(EXAMPLE).expect("the example parses");
    let Ok((top, tables)) = merge(args(&[]), &file, &|_| false) else { panic!("merged") };
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
fn an_unknown_key_is_refused_with_its_name_and_line() {
    let err = FileSettings::parse("stream = \"E\"\nstrem = \"X\"\n").unwrap_err().to_string();
    assert!(err.contains("line 2") && err.contains("strem"), "{err}");
    let err = FileSettings::parse("[[table]]\ntable = \"a.b\"\n\nsubject = \"x\"\n").unwrap_err();
    let err = err.to_string();
    assert!(err.contains("line 4") && err.contains("subject"), "{err}");
    let err = FileSettings::parse("cloudevents = \"xml\"\n").unwrap_err().to_string();
    assert!(err.contains("line 1") && err.contains("xml"), "{err}");
}

#[test]
fn a_flag_beats_the_top_level_and_never_a_table_key() {
    let file = FileSettings::parse(EXAMPLE).unwrap();
    let given = args(&["--stream", "MINE", "--dead-letter-subject", "flag.dead"]);
    let explicit = |id: &str| matches!(id, "stream" | "dead_letter_subject");
    let (top, tables) = merge(given, &file, &explicit).unwrap();
    assert_eq!(top.stream, "MINE");
    assert_eq!(tables[0].dead_letter_subject, "orders.dead_letter", "the entry's own key");
    assert_eq!(tables[1].dead_letter_subject, "flag.dead", "the flag over the top level");
    // A default is not a flag given: the file's top level wins over it.
    let (top, _) = merge(args(&["--stream", "OUTBOX"]), &file, &|_| false).unwrap();
    assert_eq!(top.stream, "EVENTS");
}

#[test]
fn table_flag_with_table_entries_is_refused() {
    let file = FileSettings::parse(EXAMPLE).unwrap();
    let explicit = |id: &str| id == "table";
    let err = merge(args(&["--table", "x"]), &file, &explicit).err().unwrap().to_string();
    assert!(err.contains("[[table]]") && err.contains("one place"), "{err}");
    // Without entries, --table names the tables, shared settings from the file.
    let file = FileSettings::parse("stream = \"E\"").unwrap();
    let (top, tables) = merge(args(&["--table", "x"]), &file, &explicit).unwrap();
    assert_eq!((top.table, tables.len(), top.stream.as_str()), (vec!["x".into()], 0, "E"));
}

#[test]
fn partitions_are_a_table_key_and_a_top_level_default() {
    let text = "partitions = 4\n\n[[table]]\ntable = \"a.outbox\"\n\n\
                [[table]]\ntable = \"b.outbox\"\npartitions = 16\n";
    let file = FileSettings::parse(text).expect("parses");
    let Ok((top, tables)) = merge(args(&[]), &file, &|_| false) else { panic!("merged") };
    assert_eq!(top.partitions, Some(4));
    assert_eq!((tables[0].partitions, tables[1].partitions), (Some(4), Some(16)));
}
