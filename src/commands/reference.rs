//! `pgoutbox completions` and `pgoutbox man`: the shell completions and the man pages, made
//! from the clap definitions `--help` shows, so the three never disagree. Neither reads a
//! setting nor connects to anything.

use std::io::Write;

use clap::CommandFactory;

use crate::settings::cli::Cli;

/// Writes the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    // clap_complete panics on a write error: it writes into memory, and we to stdout.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "pgoutbox", &mut script);
    print(&script)
}

/// Writes `bytes` to stdout; a reader that went away (`| head`) is no error.
fn print(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => Err(err.into()),
        _ => Ok(()),
    }
}

/// Writes the man page (roff) of pgoutbox, or of one of its commands, to stdout.
pub fn man(command: Option<&str>) -> anyhow::Result<()> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    // Built, the subcommands are named `pgoutbox-run`, ... as their pages are.
    cmd.build();
    let page = match command {
        None => cmd,
        Some(name) => match cmd.find_subcommand(name) {
            Some(sub) => sub.clone(),
            None => {
                let names: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).collect();
                anyhow::bail!("pgoutbox has no command {name}: one of {}", names.join(", "));
            }
        },
    };
    let prose = page.get_after_long_help().map(|text| text.to_string()).unwrap_or_default();
    // clap_mangen writes no text for a flag with a short help alone and hidden from `-h`:
    // the page is the long help, so every flag gets its text as such. The prose after the
    // flags is written below, as examples are on a man page, rather than as clap_mangen's
    // filled "EXTRA" section.
    let page = page
        .mut_args(|arg| match (arg.get_long_help(), arg.get_help()) {
            (None, Some(help)) => {
                let help = help.clone();
                arg.long_help(help)
            }
            _ => arg,
        })
        .after_help(None::<&str>)
        .after_long_help(None::<&str>);
    let source = format!("pgoutbox {}", env!("CARGO_PKG_VERSION"));
    let mut roff = Vec::new();
    clap_mangen::Man::new(page).source(source).render(&mut roff)?;
    roff.extend_from_slice(roff_sections(&prose).as_bytes());
    print(&roff)
}

/// `--help`'s prose as man page sections: `Examples:` and `Environment:` begin one each,
/// the lines under them kept as they are (no filling, one indent less), escaped for roff.
fn roff_sections(prose: &str) -> String {
    let mut roff = String::new();
    let mut open = false;
    for line in prose.lines() {
        if let Some(title) = ["Examples:", "Environment:"].iter().find(|h| **h == line) {
            if open {
                roff.push_str(".fi\n");
            }
            roff.push_str(&format!(".SH {}\n.nf\n", title.trim_end_matches(':').to_uppercase()));
            open = true;
            continue;
        }
        if !open {
            continue;
        }
        // The page indents a section's text itself; its preamble defines \*(Aq as a
        // typewriter apostrophe.
        let line = line.strip_prefix("  ").unwrap_or(line);
        let line = line.replace('\\', r"\e").replace('-', r"\-").replace('\'', r"\*(Aq");
        if line.starts_with('.') {
            roff.push_str(r"\&");
        }
        roff.push_str(&line);
        roff.push('\n');
    }
    if open {
        roff.push_str(".fi\n");
    }
    roff
}

#[cfg(test)]
mod tests {
    use super::roff_sections;

    #[test]
    fn examples_become_a_section_of_lines_kept_as_they_are() {
        let prose = "Examples:\n  # one\n  pgoutbox run --table 'a.b' \\\n\nEnvironment:\n.x";
        assert_eq!(
            roff_sections(prose),
            ".SH EXAMPLES\n.nf\n# one\npgoutbox run \\-\\-table \\*(Aqa.b\\*(Aq \\e\n\n\
             .fi\n.SH ENVIRONMENT\n.nf\n\\&.x\n.fi\n"
        );
    }
}
