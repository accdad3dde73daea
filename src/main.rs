//! The `pgoutbox` binary: parse, set up logging, dispatch, and turn errors into one line.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use pgoutbox::commands;
use pgoutbox::postgres::libpq_env::RealFiles;
use pgoutbox::settings::cli::{Cli, Command, CommonArgs, LogFormat};
use pgoutbox::settings::config::{Config, ProcessEnv};

/// mimalloc: glibc's allocator spent a quarter of the drain's CPU in malloc/free and
/// arena locks (measured with perf; see docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    // `run` is a service and logs its lifecycle; the other commands print their result and
    // nothing else unless RUST_LOG asks for more.
    let default_level = match cli.command {
        // Without the NATS client's own lines: pgoutbox says "NATS connected" itself.
        Command::Run(_) => "info,async_nats=warn",
        _ => "warn",
    };
    // The file --config names may set the log format: it is read first.
    let given_format = cli.common.log_format;
    let (cli, tables) = match pgoutbox::settings::file::resolve(cli, &matches, &ProcessEnv) {
        Ok(resolved) => resolved,
        Err(err) => {
            init_tracing(given_format, default_level);
            return report(&err, given_format);
        }
    };
    let log_format = cli.common.log_format;
    init_tracing(log_format, default_level);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(dispatch(cli, &tables));
    match result {
        Ok(code) => code,
        Err(err) if err.downcast_ref::<commands::replay::NothingSelected>().is_some() => {
            eprintln!("{err}");
            ExitCode::from(commands::replay::NothingSelected::EXIT_CODE)
        }
        Err(err) => report(&err, log_format),
    }
}

/// Says why pgoutbox stops, once: as a JSON log line for a log pipeline, else as one plain
/// line.
fn report(err: &anyhow::Error, log_format: LogFormat) -> ExitCode {
    match log_format {
        LogFormat::Json => tracing::error!("{err:#}"),
        LogFormat::Text => eprintln!("error: {err:#}"),
    }
    ExitCode::FAILURE
}

/// `tables`: the arguments of each `[[table]]` entry of `--config`.
async fn dispatch(cli: Cli, tables: &[CommonArgs]) -> anyhow::Result<ExitCode> {
    // `completions` and `man` read no setting: a mistake in one must not stop them.
    let config = || Config::load(&cli.common, tables, &ProcessEnv, &RealFiles);
    match cli.command {
        Command::Run(args) => {
            let config = config()?.with_slot_args(&args.slot);
            commands::run::run(&config, &args).await?
        }
        Command::Setup(args) => {
            let config = config()?.with_slot_args(&args.slot);
            commands::setup::run(&config, &args).await?
        }
        Command::Teardown { yes, only_table } => {
            commands::teardown::run(&config()?, yes, only_table.as_deref()).await?
        }
        Command::Replay(args) => commands::replay::run(&config()?, &args).await?,
        Command::Verify(args) => return commands::verify::run(&config()?, &args).await,
        Command::Status(args) => {
            let health = commands::status::run(&config()?, &args).await;
            return Ok(ExitCode::from(health as u8));
        }
        Command::Completions { shell } => commands::reference::completions(shell)?,
        Command::Man { command } => commands::reference::man(command.as_deref())?,
    }
    Ok(ExitCode::SUCCESS)
}

fn init_tracing(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
