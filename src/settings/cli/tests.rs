//! One definition: every setting of every command is a flag, the variable
//! `PGOUTBOX_<FLAG>` and a key of `--config`; the one-off flags (`ONE_OFF`) are flags alone.

use std::collections::BTreeMap;

use clap::CommandFactory;

use super::*;

/// Every flag of every command but help and version: (command, argument).
fn flags() -> Vec<(String, clap::Arg)> {
    let mut cli = Cli::command();
    cli.build();
    let commands = std::iter::once(&cli).chain(cli.get_subcommands());
    let mut flags = Vec::new();
    for command in commands {
        for arg in command.get_arguments().filter(|a| a.get_long().is_some()) {
            let informational = matches!(
                arg.get_action(),
                clap::ArgAction::Help | clap::ArgAction::HelpLong | clap::ArgAction::Version
            );
            // A shared flag once, as the pgoutbox command's.
            let propagated = command.get_name() != "pgoutbox" && arg.is_global_set();
            if !informational && !propagated {
                flags.push((command.get_name().to_owned(), arg.clone()));
            }
        }
    }
    flags
}

/// `retention` → `PGOUTBOX_RETENTION`.
fn variable(long: &str) -> String {
    format!("PGOUTBOX_{}", long.replace('-', "_").to_uppercase())
}

#[test]
fn every_setting_has_its_variable_and_is_a_config_key() {
    let mut checked = 0;
    for (command, arg) in flags() {
        let (id, long) = (arg.get_id().as_str(), arg.get_long().unwrap_or_default());
        let env = arg.get_env().and_then(|v| v.to_str()).map(str::to_owned);
        if ONE_OFF.contains(&(command.as_str(), id)) {
            assert_eq!(env, None, "{command} --{long} is one-off: no variable");
            continue;
        }
        assert_eq!(env, Some(variable(long)), "{command} --{long}'s variable");
        if long != "config" {
            let toml = format!("{long} = \"x\"\n");
            let read = crate::settings::file::FileSettings::parse(&toml);
            assert!(read.is_ok(), "{command} --{long} is no --config key: {:?}", read.err());
        }
        checked += 1;
    }
    assert!(checked > 50, "only {checked} settings found");
}

#[test]
fn a_flag_of_several_commands_is_one_setting() {
    let mut seen: BTreeMap<String, (String, Option<String>, Option<String>)> = BTreeMap::new();
    for (command, arg) in flags() {
        let long = arg.get_long().unwrap_or_default().to_owned();
        let env = arg.get_env().and_then(|v| v.to_str()).map(str::to_owned);
        let value =
            arg.get_value_names().map(|names| names.iter().map(|n| n.to_string()).collect());
        if let Some((first, env0, value0)) = seen.get(&long) {
            let same = (env0, value0) == (&env, &value);
            assert!(same, "--{long} of {first} and of {command} differ: {env0:?} {env:?}");
        } else {
            seen.insert(long, (command, env, value));
        }
    }
    assert!(seen.contains_key("http-addr"));
}

#[test]
fn the_lists_name_flags_that_exist() {
    let flags = flags();
    for (command, id) in ONE_OFF {
        let found = flags.iter().any(|(c, a)| c == command && a.get_id() == id);
        assert!(found, "ONE_OFF names {command} {id}, which is no flag");
    }
    for id in PER_TABLE {
        let found = flags.iter().any(|(c, a)| c == "pgoutbox" && a.get_id() == id);
        assert!(found, "PER_TABLE names {id}, which is no shared flag");
    }
}
