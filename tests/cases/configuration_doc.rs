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
";

fn help(args: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgoutbox"));
    for (key, _) in std::env::vars() {
        if key.starts_with("PGOUTBOX_") || key == "DATABASE_URL" || key == "NATS_URL" {
            cmd.env_remove(key);
        }
    }
    let output = cmd.args(args).arg("--help").output().expect("pgoutbox --help runs");
    assert!(output.status.success());
    String::from_utf8(output.stdout).expect("UTF-8 help")
}

fn render() -> String {
    let mut doc = String::from(INTRO);
    for (title, args) in [
        ("pgoutbox", &[][..]),
        ("pgoutbox run", &["run"][..]),
        ("pgoutbox setup", &["setup"][..]),
        ("pgoutbox status", &["status"][..]),
        ("pgoutbox replay", &["replay"][..]),
        ("pgoutbox teardown", &["teardown"][..]),
    ] {
        doc.push_str(&format!("\n## `{title}`\n\n```text\n{}```\n", help(args)));
    }
    doc
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
