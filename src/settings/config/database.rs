//! Where the database is and how pgoutbox logs in, as libpq would find it: the connection
//! string of `--database-url` (else `PGOUTBOX_DATABASE_URL`, `DATABASE_URL`), the `PG*`
//! variables, the service and password files, `--database-password-command`.

use anyhow::anyhow;

use super::{Env, SETTINGS};
use crate::postgres::libpq_env::{self, Files};
use crate::postgres::password_command::PasswordCommand;
use crate::postgres::tls::PgTls;
use crate::settings::cli::CommonArgs;

/// The connection's settings, its TLS and password command apart; each warning libpq's
/// rules give is logged.
pub(super) fn settings(
    args: &CommonArgs,
    env: &dyn Env,
    files: &dyn Files,
) -> anyhow::Result<(tokio_postgres::Config, PgTls)> {
    // clap reads PGOUTBOX_DATABASE_URL, empty or not; libpq's way is to skip empty ones.
    let database_url = (args.database_url.clone())
        .filter(|url| !url.is_empty())
        .or_else(|| env.var("PGOUTBOX_DATABASE_URL"))
        .or_else(|| env.var("DATABASE_URL"));
    let password_command = args
        .database_password_command
        .clone()
        .map(|command| PasswordCommand::new(command, args.database_password_command_timeout));
    let resolved =
        libpq_env::resolve(database_url.as_deref(), env, files, password_command.is_some())?;
    for warning in &resolved.warnings {
        tracing::warn!("{warning}");
    }
    let (database_url, pg_tls) = crate::postgres::tls::split_connection_string(&resolved.conninfo)
        .map_err(|err| anyhow!("{SETTINGS}: {err}"))?;
    let pg_tls = pg_tls.with_password_command(password_command);
    let (database_url, tcp) = crate::postgres::conninfo::split_tcp_settings(&database_url)
        .map_err(|err| anyhow!("{SETTINGS}: {err}"))?;
    let mut database: tokio_postgres::Config =
        database_url.parse().map_err(|err| anyhow!("{SETTINGS} are not valid: {err}"))?;
    if let Some(password) = resolved.password {
        database.password(password);
    }
    database.ssl_mode(pg_tls.tokio_postgres_mode());
    tcp.apply(&mut database);
    Ok((database, pg_tls))
}
