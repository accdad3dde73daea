//! One module per subcommand; each is an `async fn` from settings to `anyhow::Result`.

/// Prints a line to stdout, as `println!` would, but a reader that went away (`pgoutbox
/// status --json | head -1`) ends the process quietly with 141, the code of a process that
/// SIGPIPE ended, instead of `println!`'s panic. Every command's stdout goes through it.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::commands::say_line(format_args!($($arg)*))
    };
}

pub mod reference;
pub mod replay;
pub mod run;
pub mod setup;
pub mod status;
pub mod teardown;
pub mod verify;

/// [`say!`]'s writer: the line, or the end of the process when stdout is closed.
pub(crate) fn say_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(err) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        stdout_failed(err)
    }
}

/// Ends the process for a write to stdout that failed: quietly with 141 when the reader
/// closed the pipe, else with one line saying why.
pub(crate) fn stdout_failed(err: std::io::Error) -> ! {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(141);
    }
    eprintln!("error: writing to stdout: {err}");
    std::process::exit(1)
}
