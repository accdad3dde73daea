//! docs/configuration.md is generated from the flags' definition (its table of settings,
//! their variables and keys) and from `--help`, so it cannot drift: this test renders it
//! again and fails on any difference. To update the file after changing a flag:
//! `PGOUTBOX_UPDATE_DOCS=1 cargo test --test main configuration_doc`.

use std::process::Command;

const INTRO: &str = r#"# Configuration

Every setting is a flag, an environment variable and a key of the TOML file `--config`
names, all three from one definition: `--retention 7d`, `PGOUTBOX_RETENTION=7d` and
`retention = "7d"`. The variable is the flag's name in capitals after `PGOUTBOX_`, the key
is its name; a flag wins over its variable, and both over the file. `--database-url` also
falls back to `DATABASE_URL`, and `--nats-url` to `NATS_URL`. A command's one-off flags
(what `replay` and `verify` select, `status --json` and `--watch`, `teardown --yes` and
`--only-table`) are flags alone. Log verbosity is set with `RUST_LOG` (for example
`RUST_LOG=info,pgoutbox=debug`).

One file serves every command: each reads the keys of its own flags and ignores the
others', so `status` reads `http-addr` and `stream` from the file `run` reads `retention`
from. Values are what the flag takes: strings (`"2m"`, `"32MiB"`), integers (`partitions =
4`, a size in bytes), `true` or `false` for a switch, and a list for a flag given several
times (`trusted-owner = ["app", "billing"]`). `[[table]]` entries name several tables, each
with its own per-table keys (docs/how-to/several-tables.md). A key no command takes is
refused in one line with its line number and the nearest key: `--config pgoutbox.toml: line
3: unknown key "retension"; did you mean "retention"?`.

```toml
database-url = "postgres://pgoutbox@db.internal/app"
nats-url = "nats://nats.internal:4222"
stream = "EVENTS"
trusted-owner = ["app"]
http-addr = "0.0.0.0:9717"      # run serves there; status reads there
retention = "7d"                # run's; setup and status ignore it
durability-horizon = "2m"
```

This file is generated from the flags' definition (the table below, and `pgoutbox --help`)
and checked by `tests/cases/configuration_doc.rs`; regenerate it with
`PGOUTBOX_UPDATE_DOCS=1 cargo test --test main configuration_doc`. `-h` shows each
command's short help: the flags most runs need, one line each. The same definitions make
the man pages (`pgoutbox man [COMMAND]`) and the shell completions (`pgoutbox completions
bash|zsh|fish|elvish|powershell`).
"#;

fn help(args: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgoutbox"));
    for (key, _) in std::env::vars() {
        if key.starts_with("PGOUTBOX_") || key == "DATABASE_URL" || key == "NATS_URL" {
            cmd.env_remove(key);
        }
    }
    // Wrapped to 100 columns, as without a terminal; lines without clap's trailing indent.
    cmd.env("COLUMNS", "100");
    let output = cmd.args(args).arg("--help").output().expect("pgoutbox --help runs");
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).expect("UTF-8 help");
    help.lines().map(|line| format!("{}\n", line.trim_end())).collect()
}

/// Every setting as clap's definition gives it: its key, its variable and the commands
/// that take it, in the order `pgoutbox --help` and each command's list them; then the
/// one-off flags.
fn settings_table() -> String {
    use clap::CommandFactory;
    use pgoutbox::settings::cli::{Cli, ONE_OFF, PER_TABLE};
    let mut cli = Cli::command();
    cli.build();
    let mut rows: Vec<(String, String, Vec<String>)> = Vec::new();
    let mut add = |command: &str, arg: &clap::Arg| {
        let Some(long) = arg.get_long().filter(|l| !matches!(*l, "help" | "version" | "config"))
        else {
            return;
        };
        let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or_default().to_owned();
        match rows.iter_mut().find(|row| row.0 == long) {
            Some(row) => row.2.push(command.to_owned()),
            None => rows.push((long.to_owned(), env, vec![command.to_owned()])),
        }
    };
    for arg in cli.get_arguments() {
        add("every command", arg);
    }
    for command in ["run", "setup", "status", "replay", "verify", "teardown"] {
        let sub = cli.find_subcommand(command).expect("the command");
        for arg in sub.get_arguments().filter(|a| !a.is_global_set()) {
            if !ONE_OFF.contains(&(command, arg.get_id().as_str())) {
                add(command, arg);
            }
        }
    }
    let mut table = String::from(
        "\n## Every setting\n\n| key | variable | read by | in `[[table]]` |\n| --- | --- | --- | --- |\n",
    );
    for (long, env, commands) in rows {
        let per_table = PER_TABLE.contains(&long.replace('-', "_").as_str());
        let per_table = if per_table { "yes" } else { "" };
        table
            .push_str(&format!("| `{long}` | `{env}` | {} | {per_table} |\n", commands.join(", ")));
    }
    let one_off: Vec<String> = ONE_OFF
        .iter()
        .map(|(command, id)| format!("`{command} --{}`", id.replace('_', "-")))
        .collect();
    table.push_str(&format!("\nFlags alone (one-off): {}.\n", one_off.join(", ")));
    table
}

fn render() -> String {
    let mut doc = String::from(INTRO);
    doc.push_str(&settings_table());
    let shared = help(&[]);
    doc.push_str(&format!("\n## `pgoutbox`\n\n```text\n{shared}```\n"));
    for command in ["run", "setup", "status", "replay", "verify", "teardown"] {
        let own = without_shared(&help(&[command]), &shared);
        doc.push_str(&format!("\n## `pgoutbox {command}`\n\n{SHARED_NOTE}\n\n```text\n{own}```\n"));
    }
    doc
}

const SHARED_NOTE: &str = "With the flags of `pgoutbox` above, which every command takes.";

/// The headings under which `--help` lists flags.
const FLAG_HEADINGS: [&str; 6] =
    ["Arguments:", "Options:", "Postgres:", "NATS:", "Outbox table:", "Operations:"];

/// A command's `--help` without the flags `shared` (the top level's help) shows the same,
/// and without the headings that leaves empty.
fn without_shared(help: &str, shared: &str) -> String {
    let shared: Vec<String> =
        blocks(shared).into_iter().filter(|(_, flag)| *flag).map(|b| b.0).collect();
    let mut out = String::new();
    let mut heading = None;
    for (block, flag) in blocks(help) {
        if FLAG_HEADINGS.contains(&block.trim_end()) {
            heading = Some(block);
        } else if !flag {
            out.push_str(&block);
        } else if !shared.contains(&block) {
            out.push_str(&heading.take().unwrap_or_default());
            out.push_str(&block);
        }
    }
    out
}

/// `help` cut before each heading and, under the flags' headings, before each flag: each
/// piece with whether it is a flag.
fn blocks(help: &str) -> Vec<(String, bool)> {
    let mut blocks: Vec<(String, bool)> = Vec::new();
    let mut under_flags = false;
    for line in help.split_inclusive('\n') {
        let is_heading = !line.starts_with(' ') && line.trim_end().ends_with(':');
        let is_flag = under_flags && (line.starts_with("  -") || line.starts_with("      -"));
        if is_heading {
            under_flags = FLAG_HEADINGS.contains(&line.trim_end());
        }
        match blocks.last_mut() {
            Some((block, _)) if !is_heading && !is_flag => block.push_str(line),
            _ => blocks.push((line.to_owned(), is_flag)),
        }
    }
    blocks
}

#[test]
fn configuration_doc_matches_help() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let rendered = render();
    if std::env::var_os("PGOUTBOX_UPDATE_DOCS").is_some() {
        std::fs::write(path, &rendered).expect("write docs/configuration.md");
    }
    let current = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        current == rendered,
        "docs/configuration.md is out of date with --help; regenerate it with \
         PGOUTBOX_UPDATE_DOCS=1 cargo test --test main configuration_doc"
    );
}
