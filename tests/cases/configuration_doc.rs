//! docs/configuration.md is generated from `--help`, so it cannot drift: this test renders
//! it again and fails on any difference. To update the file after changing a flag:
//! `PGOUTBOX_UPDATE_DOCS=1 cargo test --test main configuration_doc`.

use std::process::Command;

const INTRO: &str = "# Configuration

Every setting is a flag with an environment variable; flags win over the environment.
`--database-url` also falls back to `DATABASE_URL`, and `--nats-url` to `NATS_URL`.
Log verbosity is set with `RUST_LOG` (for example `RUST_LOG=info,pgoutbox=debug`).

This file is generated from `pgoutbox --help` and checked by `tests/cases/configuration_doc.rs`;
regenerate it with `PGOUTBOX_UPDATE_DOCS=1 cargo test --test main configuration_doc`.
`-h` shows each command's short help: the flags most runs need, one line each. The same
definitions make the man pages (`pgoutbox man [COMMAND]`) and the shell completions
(`pgoutbox completions bash|zsh|fish|elvish|powershell`).
";

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

fn render() -> String {
    let mut doc = String::from(INTRO);
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
