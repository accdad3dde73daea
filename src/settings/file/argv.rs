//! The file's settings applied by clap itself: the command line is written again, each
//! setting from the first of these that has it, and parsed again:
//!
//! 1. a `[[table]]` entry's own keys (for that entry's arguments);
//! 2. the command line as given (a setting given by its variable is left to clap to read
//!    again, and the file's value for it is dropped);
//! 3. the file's top level.
//!
//! So a file's value is read by its flag's own parser, with its units and checks, and
//! `requires` and `conflicts_with` hold across the file and the command line.

use std::collections::BTreeMap;
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, CommandFactory, FromArgMatches};

use super::{FileError, FileSettings, Key, Value, keys};
use crate::settings::cli::{Cli, CommonArgs};
use crate::settings::config::Env;

/// A setting's arguments, by its long name: `--name=value` once per value, `--name` for a
/// switch, none for a switch off or a setting left to its variable.
type Layer = BTreeMap<String, Vec<OsString>>;

/// The variables read for these besides clap's own (`config`): empty ones are unset.
const URL_VARIABLES: [(&str, [&str; 2]); 2] = [
    ("database_url", ["PGOUTBOX_DATABASE_URL", "DATABASE_URL"]),
    ("nats_url", ["PGOUTBOX_NATS_URL", "NATS_URL"]),
];

/// The running command's arguments with `file` read in (`matches`: the command line as
/// given), and the arguments of each `[[table]]` entry.
pub(super) fn apply(
    file: &FileSettings,
    matches: &ArgMatches,
    env: &dyn Env,
) -> Result<(Cli, Vec<CommonArgs>), FileError> {
    let mut cli = Cli::command();
    cli.build();
    let (name, sub_matches) = matches.subcommand().ok_or_else(|| plain("no command"))?;
    let sub = cli.find_subcommand(name).ok_or_else(|| plain("no such command"))?;
    let settings = Settings::of(&cli, sub);
    let given = settings.given(matches, sub_matches, env);
    if !file.tables.is_empty() && given.contains_key("table") {
        return Err(plain(
            "--table (or PGOUTBOX_TABLE) and [[table]] entries in --config both name tables: \
             name them in one place",
        ));
    }
    let top = settings.layer(&file.top)?;
    let parsed =
        settings.parse(name, &[&given, &top]).map_err(|err| clap_error(&err, &file.top))?;
    let mut tables = Vec::new();
    for entry in &file.tables {
        let mut own = settings.layer(&entry.keys)?;
        own.insert("table".into(), vec![flag("table", Some(entry.table.as_ref()))]);
        let at = |err: clap::Error| {
            let FileError { line, message } = clap_error(&err, &entry.keys);
            let message = format!("[[table]] {}: {message}", entry.table);
            FileError { line: line.or(Some(entry.line)), message }
        };
        tables.push(settings.parse(name, &[&own, &given, &top]).map_err(at)?.common);
    }
    Ok((parsed, tables))
}

/// The flags of the running command, by long name: the shared ones (before the command's
/// name on a command line) and its own (after).
struct Settings<'a> {
    shared: Vec<&'a Arg>,
    own: Vec<&'a Arg>,
}

impl<'a> Settings<'a> {
    fn of(cli: &'a clap::Command, sub: &'a clap::Command) -> Self {
        let shared = cli.get_arguments().filter(|a| keys::is_setting_like(a)).collect();
        let own = sub.get_arguments().filter(|a| keys::is_setting_like(a) && !a.is_global_set());
        Settings { shared, own: own.collect() }
    }

    fn find(&self, long: &str) -> Option<&'a Arg> {
        self.shared.iter().chain(&self.own).copied().find(|arg| arg.get_long() == Some(long))
    }

    /// The settings the command line or the environment gave (clap's `matches` of the
    /// pgoutbox command and of the running one, `sub`).
    fn given(&self, matches: &ArgMatches, sub: &ArgMatches, env: &dyn Env) -> Layer {
        let mut layer = Layer::new();
        for arg in self.shared.iter().chain(&self.own) {
            let (id, long) = (arg.get_id().as_str(), arg.get_long().unwrap_or_default());
            let source = |m: &ArgMatches| m.try_get_raw(id).ok().and_then(|_| m.value_source(id));
            let sources = [sub, matches].map(|m| (m, source(m)));
            let variables = URL_VARIABLES.iter().find(|(url, _)| *url == id).map(|v| v.1);
            let from_env = match variables {
                Some(names) => names.iter().any(|name| env.var(name).is_some()),
                None => sources.iter().any(|(_, s)| *s == Some(ValueSource::EnvVariable)),
            };
            let command_line = sources.iter().find(|(_, s)| *s == Some(ValueSource::CommandLine));
            let arguments = match command_line {
                Some((m, _)) => given_arguments(arg, m),
                None if from_env => Vec::new(), // clap reads the variable again
                None => continue,
            };
            layer.insert(long.to_owned(), arguments);
        }
        layer
    }

    /// The arguments of the keys of this command among `keys` (the others are another
    /// command's, and ignored).
    fn layer(&self, keys: &[Key]) -> Result<Layer, FileError> {
        let mut layer = Layer::new();
        for key in keys {
            let Some(arg) = self.find(&key.name) else { continue };
            let switch = matches!(arg.get_action(), ArgAction::SetTrue);
            let arguments = match (&key.value, switch) {
                (Value::Bool(true), true) => vec![flag(&key.name, None)],
                (Value::Bool(false), true) => Vec::new(),
                (Value::Bool(on), false) => vec![flag(&key.name, Some(&on.to_string()))],
                (Value::Items(_), true) => {
                    let message = format!("{}: true or false", key.name);
                    return Err(FileError { line: Some(key.line), message });
                }
                (Value::Items(items), false) => {
                    items.iter().map(|item| flag(&key.name, Some(item))).collect()
                }
            };
            layer.insert(key.name.clone(), arguments);
        }
        Ok(layer)
    }

    /// The command line each setting takes from the first of `layers` that has it, parsed.
    fn parse(&self, command: &str, layers: &[&Layer]) -> Result<Cli, clap::Error> {
        let mut argv = vec![OsString::from("pgoutbox")];
        let from = |args: &[&Arg]| -> Vec<OsString> {
            let long = |arg: &&Arg| arg.get_long().unwrap_or_default().to_owned();
            let chosen = args.iter().filter_map(|a| layers.iter().find_map(|l| l.get(&long(a))));
            chosen.flatten().cloned().collect()
        };
        argv.extend(from(&self.shared));
        argv.push(command.into());
        argv.extend(from(&self.own));
        let matches = Cli::command().try_get_matches_from(argv)?;
        Cli::from_arg_matches(&matches)
    }
}

/// The arguments of `arg` as the command line gave them (in `matches`).
fn given_arguments(arg: &Arg, matches: &ArgMatches) -> Vec<OsString> {
    let long = arg.get_long().unwrap_or_default();
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        return vec![flag(long, None)];
    }
    let values = matches.try_get_raw(arg.get_id().as_str()).ok().flatten();
    let with_value = |value: &std::ffi::OsStr| {
        let mut argument = OsString::from(format!("--{long}="));
        argument.push(value);
        argument
    };
    values.into_iter().flatten().map(with_value).collect()
}

/// `--long`, or `--long=value` (a value that starts with `-` is still a value).
fn flag(long: &str, value: Option<&str>) -> OsString {
    match value {
        Some(value) => format!("--{long}={value}").into(),
        None => format!("--{long}").into(),
    }
}

fn plain(message: &str) -> FileError {
    FileError { line: None, message: message.to_owned() }
}

/// clap's error in one line (its lines before the usage, without `error: `), with the line
/// of the key of `keys` it names.
fn clap_error(err: &clap::Error, keys: &[Key]) -> FileError {
    let rendered = err.to_string();
    let lines = rendered.lines().take_while(|line| !line.trim().is_empty()).map(str::trim);
    let message = lines.collect::<Vec<_>>().join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message).to_owned();
    // The key clap names first: `'--recover' cannot be used with '--backfill'`.
    let named = |key: &Key| {
        let at = |end: &str| message.find(&format!("'--{}{end}", key.name));
        at("'").or(at(" ")).or(at("[")).map(|position| (position, key.line))
    };
    let line = keys.iter().filter_map(named).min().map(|(_, line)| line);
    FileError { line, message }
}
