//! `--config <file>`: the settings in a TOML file, keys spelled as the flags.
//!
//! clap's definition is the only one: a key is the long name of a flag, its value is read
//! by that flag's own parser (units, validation, conflicts), and the key of a flag of any
//! command is accepted, so that one file serves `run`, `setup` and `status` alike; each
//! command reads the keys of its own flags and ignores the others. A command's one-off
//! flags (`cli::ONE_OFF`) are not keys. A key no command knows is refused with its line
//! and the nearest known key: a misspelt key silently ignored would stream with a default
//! nobody chose.
//!
//! `[[table]]` entries take the per-table keys (`cli::PER_TABLE`), each defaulting to the
//! top level, then to the flag's default. A flag given on the command line or by its
//! `PGOUTBOX_*` variable wins over the file's top level, never over a `[[table]]` key: an
//! entry names one table on purpose. How: [`resolve`] parses the command line again with
//! the file's values as arguments (`argv`).

use std::path::Path;

use anyhow::{Context, anyhow};
use toml::de::{DeTable, DeValue};

use crate::settings::cli::{Cli, Command, CommonArgs};
use crate::settings::config::Env;

mod argv;
mod keys;

/// The file's settings: its top-level keys and its `[[table]]` entries.
#[derive(Debug, Default)]
pub struct FileSettings {
    top: Vec<Key>,
    tables: Vec<Entry>,
}

/// One key of the file, with its line and its value as argument text.
#[derive(Debug)]
struct Key {
    name: String,
    line: usize,
    value: Value,
}

#[derive(Debug)]
enum Value {
    /// `true` or `false`: a switch given or not.
    Bool(bool),
    /// A string or number, or a list of them: the flag given once per item.
    Items(Vec<String>),
}

/// A `[[table]]` entry: the table it names and its own keys.
#[derive(Debug)]
struct Entry {
    table: String,
    line: usize,
    keys: Vec<Key>,
}

/// The command line with the file `--config` names read in: every setting from the
/// command line or its variable, else from the file, else its default; and the arguments
/// of each `[[table]]` entry (empty: no entries, `--table` names the tables). The file is
/// not read without `--config`, nor by `completions` and `man`, which read no setting.
pub fn resolve(
    cli: Cli,
    matches: &clap::ArgMatches,
    env: &dyn Env,
) -> anyhow::Result<(Cli, Vec<CommonArgs>)> {
    let reads_settings = !matches!(cli.command, Command::Completions { .. } | Command::Man { .. });
    let Some(path) = cli.common.config.clone().filter(|_| reads_settings) else {
        return Ok((cli, Vec::new()));
    };
    let file = FileSettings::read(&path)?;
    argv::apply(&file, matches, env).map_err(|err| anyhow!("--config {}: {err}", path.display()))
}

impl FileSettings {
    /// The file at `path`, parsed; its errors name the file, and the line of a bad key.
    pub fn read(path: &Path) -> anyhow::Result<FileSettings> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --config {}", path.display()))?;
        Self::parse(&text).map_err(|err| anyhow!("--config {}: {err}", path.display()))
    }

    /// The settings in `text`, or one line saying where and why not.
    pub(super) fn parse(text: &str) -> Result<FileSettings, FileError> {
        let line_of = |offset: usize| text.get(..offset).unwrap_or(text).matches('\n').count() + 1;
        let document = DeTable::parse(text).map_err(|err| FileError {
            line: err.span().map(|span| line_of(span.start)),
            message: err.message().replace('\n', " "),
        })?;
        let known = keys::Known::of(&<Cli as clap::CommandFactory>::command());
        let mut file = FileSettings::default();
        for (key, value) in document.get_ref() {
            let (name, line) = (key.get_ref().as_ref(), line_of(key.span().start));
            let at = |message: String| FileError { line: Some(line), message };
            match (name, value.get_ref()) {
                ("table", DeValue::Array(items))
                    if items.iter().any(|i| i.get_ref().is_table()) =>
                {
                    for item in items {
                        let start = line_of(item.span().start);
                        file.tables.push(entry(item.get_ref(), start, &known, &line_of)?);
                    }
                }
                ("table", DeValue::Table(_)) => {
                    return Err(at("[table] is written [[table]], once per table".into()));
                }
                _ => {
                    known.top_level(name).map_err(|e| at(e.to_string()))?;
                    let value = setting(name, value.get_ref()).map_err(|e| at(e.to_string()))?;
                    file.top.push(Key { name: name.to_owned(), line, value });
                }
            }
        }
        Ok(file)
    }
}

/// One `[[table]]` entry (`value`, at `line`): its table and its per-table keys.
fn entry(
    value: &DeValue<'_>,
    line: usize,
    known: &keys::Known,
    line_of: &dyn Fn(usize) -> usize,
) -> Result<Entry, FileError> {
    let at = |line: usize| move |message: String| FileError { line: Some(line), message };
    let Some(table) = value.as_table() else {
        return Err(at(line)("table: either [[table]] entries or a list of tables".into()));
    };
    let mut entry = Entry { table: String::new(), line, keys: Vec::new() };
    for (key, value) in table {
        let (name, line) = (key.get_ref().as_ref(), line_of(key.span().start));
        match (name, value.get_ref().as_str()) {
            ("table", Some(named)) => entry.table = named.to_owned(),
            ("table", None) => return Err(at(line)("[[table]] table: a string".into())),
            _ => {
                known.per_table(name).map_err(|e| at(line)(e.to_string()))?;
                let value = setting(name, value.get_ref()).map_err(|e| at(line)(e.to_string()))?;
                entry.keys.push(Key { name: name.to_owned(), line, value });
            }
        }
    }
    if entry.table.is_empty() {
        return Err(at(line)("[[table]] without table = \"schema.table\"".into()));
    }
    Ok(entry)
}

/// `key`'s value as argument text: a boolean, or a string, an integer or a list of them.
fn setting(key: &str, value: &DeValue<'_>) -> Result<Value, ValueRefused> {
    let item = |value: &DeValue<'_>| match value {
        DeValue::String(text) => Ok(text.to_string()),
        DeValue::Integer(number) => {
            i128::from_str_radix(number.as_str(), number.radix()).map(|n| n.to_string()).map_err(
                |_| ValueRefused::TooLarge { key: key.to_owned(), number: number.to_string() },
            )
        }
        DeValue::Boolean(on) => Ok(on.to_string()),
        other => Err(ValueRefused::NotAValue { key: key.to_owned(), kind: other.type_str() }),
    };
    match value {
        DeValue::Boolean(on) => Ok(Value::Bool(*on)),
        DeValue::Array(items) => {
            items.iter().map(|i| item(i.get_ref())).collect::<Result<_, _>>().map(Value::Items)
        }
        other => item(other).map(|text| Value::Items(vec![text])),
    }
}

/// Why a key's value is no value of a flag.
#[derive(Debug, thiserror::Error)]
enum ValueRefused {
    #[error("{key}: {number} is too large")]
    TooLarge { key: String, number: String },
    #[error(
        "{key}: a {kind} is no value of a flag; give a string, an integer, true or false, or a \
         list of them"
    )]
    NotAValue { key: String, kind: &'static str },
}

/// Why the file cannot be read as settings: one line, with the line of the file when known
/// (the toml crate's own rendering spans several, with a snippet).
#[derive(Debug, thiserror::Error)]
#[error("{}{message}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
pub struct FileError {
    line: Option<usize>,
    message: String,
}

#[cfg(test)]
mod tests;
