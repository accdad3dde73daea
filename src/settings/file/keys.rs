//! The keys a `--config` file may hold, read from clap's definition: the long name of every
//! flag of every command but the one-off ones (`cli::ONE_OFF`), so that one file serves
//! every command. A key no command knows is named with the nearest one that is.

use std::collections::{BTreeMap, BTreeSet};

use clap::{Arg, ArgAction};

use crate::settings::cli::{ONE_OFF, PER_TABLE};

/// The keys of every command, and the one-off flags with the commands that take them.
pub(super) struct Known {
    settings: BTreeSet<String>,
    one_off: BTreeMap<String, Vec<String>>,
}

impl Known {
    /// The keys `cli`'s definition gives (the pgoutbox command, with its subcommands).
    pub(super) fn of(cli: &clap::Command) -> Known {
        let mut known = Known { settings: BTreeSet::new(), one_off: BTreeMap::new() };
        let commands = std::iter::once(cli).chain(cli.get_subcommands());
        for command in commands {
            for arg in command.get_arguments().filter(|arg| is_setting_like(arg)) {
                let long = arg.get_long().unwrap_or_default().to_owned();
                if is_one_off(command.get_name(), arg.get_id().as_str()) {
                    known.one_off.entry(long).or_default().push(command.get_name().into());
                } else {
                    known.settings.insert(long);
                }
            }
        }
        known.settings.remove("config");
        known
    }

    /// Whether `key` may be set at the top level of the file; else why not.
    pub(super) fn top_level(&self, key: &str) -> Result<(), KeyRefused> {
        if self.settings.contains(key) {
            return Ok(());
        }
        if key == "config" {
            return Err(KeyRefused::NamesAFile);
        }
        if let Some(commands) = self.one_off.get(key) {
            let commands = commands.join(" and ");
            return Err(KeyRefused::OneOff { key: key.to_owned(), commands });
        }
        Err(unknown(key, self.settings.iter().map(String::as_str)))
    }

    /// Whether `key` may be set in a `[[table]]` entry; else why not.
    pub(super) fn per_table(&self, key: &str) -> Result<(), KeyRefused> {
        let keys = PER_TABLE.map(|id| id.replace('_', "-"));
        if keys.iter().any(|k| k == key) {
            return Ok(());
        }
        if self.settings.contains(key) {
            return Err(KeyRefused::NotPerTable { key: key.to_owned() });
        }
        Err(unknown(key, keys.iter().map(String::as_str).chain(["table"])))
    }
}

/// Why a key of the file is refused: each one line.
#[derive(Debug, thiserror::Error)]
pub(super) enum KeyRefused {
    #[error("config: a file names no other file; set its keys here")]
    NamesAFile,
    #[error("{key} is a one-off flag of {commands}, given on its command line, not a key")]
    OneOff { key: String, commands: String },
    #[error("[[table]] {key}: a setting of every table, at the top level of the file")]
    NotPerTable { key: String },
    #[error("unknown key {key:?}{}", nearest.as_ref().map(|n| format!("; did you mean {n:?}?")).unwrap_or_default())]
    Unknown { key: String, nearest: Option<String> },
}

/// A flag a file could set: one with a long name that is no help or version.
pub(super) fn is_setting_like(arg: &Arg) -> bool {
    let informational = matches!(
        arg.get_action(),
        ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
    );
    arg.get_long().is_some() && !informational
}

/// Whether argument `id` of `command` is one of its one-off flags.
pub(super) fn is_one_off(command: &str, id: &str) -> bool {
    ONE_OFF.contains(&(command, id))
}

/// `unknown key "retension"; did you mean "retention"?`: the nearest of `known` by
/// Jaro-Winkler similarity, which weighs a shared beginning (`subject` is nearer
/// `subject-template` than `table`), ties broken by edit distance.
fn unknown<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> KeyRefused {
    let distance = |k: &str| {
        let similarity = (strsim::jaro_winkler(key, k) * 1e6) as i64;
        (-similarity, strsim::levenshtein(key, k))
    };
    let nearest = known.min_by_key(|k| distance(k)).map(str::to_owned);
    KeyRefused::Unknown { key: key.to_owned(), nearest }
}
