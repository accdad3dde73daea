//! One module per subcommand; each is an `async fn` from settings to `anyhow::Result`.

pub mod reference;
pub mod replay;
pub mod run;
pub mod setup;
pub mod status;
pub mod teardown;
pub mod verify;
