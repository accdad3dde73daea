//! The `pgoutbox` binary: parse, set up logging, dispatch, and turn errors into one line.

use std::process::ExitCode;

use clap::Parser;
use pgoutbox::commands;
use pgoutbox::settings::cli::{Cli, Command, LogFormat};
use pgoutbox::settings::config::{Config, ProcessEnv};

/// mimalloc: glibc's allocator spent a quarter of the drain's CPU in malloc/free and
/// arena locks (measured with perf; see docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.common.log_format);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(dispatch(cli))
}

async fn dispatch(cli: Cli) -> ExitCode {
    let config = match Config::from_args(&cli.common, &ProcessEnv) {
        Ok(config) => config,
        Err(err) => return fail(err),
    };
    let result = match cli.command {
        Command::Run(args) => commands::run::run(&config, &args).await,
        Command::Setup(args) => commands::setup::run(&config, &args).await,
        Command::Teardown { yes } => commands::teardown::run(&config, yes).await,
        Command::Status { json, max_lag_bytes, http_addr } => {
            let health = commands::status::run(&config, json, max_lag_bytes, http_addr).await;
            return ExitCode::from(health as u8);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => fail(err),
    }
}

fn fail(err: anyhow::Error) -> ExitCode {
    tracing::error!("{err:#}");
    eprintln!("error: {err:#}");
    ExitCode::FAILURE
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
