//! Where NATS is and how pgoutbox authenticates: the servers of `--nats-url` (else
//! `PGOUTBOX_NATS_URL`, `NATS_URL`), the credentials from the first server's URL and the
//! files named.

use anyhow::anyhow;

use super::{DEFAULT_NATS_URL, Env};
use crate::nats::connect::NatsSettings;
use crate::nats::credentials::NatsAuth;
use crate::postgres::conninfo::percent_decode;
use crate::settings::cli::CommonArgs;

/// The servers and authentication the arguments and the environment give.
pub(super) fn settings(args: &CommonArgs, env: &dyn Env) -> anyhow::Result<NatsSettings> {
    let nats_url = (args.nats_url.clone())
        .filter(|url| !url.is_empty())
        .or_else(|| env.var("PGOUTBOX_NATS_URL"))
        .or_else(|| env.var("NATS_URL"))
        .unwrap_or_else(|| DEFAULT_NATS_URL.to_owned());
    let servers = nats_url
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| anyhow!("--nats-url is not a valid NATS server list: {err}"))?;
    let Some(first) = servers.first() else {
        return Err(anyhow!("--nats-url names no server"));
    };
    let auth = nats_auth(args, first);
    // The credentials now live in `auth`; async-nats logs server addresses with `Debug`
    // (at debug level), so the addresses keep none.
    let servers = servers.into_iter().map(without_credentials).collect();
    Ok(NatsSettings { servers, auth })
}

/// The NATS authentication the arguments and the first server's URL ask for.
fn nats_auth(args: &CommonArgs, first: &async_nats::ServerAddr) -> NatsAuth {
    let (user_password, token) = match (first.username(), first.password()) {
        (Some(user), Some(pass)) => (Some((percent_decode(user), percent_decode(pass))), None),
        (Some(token), None) => (None, Some(percent_decode(token))),
        _ => (None, None),
    };
    NatsAuth {
        user_password,
        token,
        creds_file: args.nats_creds.clone(),
        nkey_file: args.nats_nkey.clone(),
        tls_ca: args.nats_tls_ca.clone(),
        tls_client: args.nats_tls_cert.clone().zip(args.nats_tls_key.clone()),
    }
}

/// The server's address without the user, password or token of its URL.
fn without_credentials(addr: async_nats::ServerAddr) -> async_nats::ServerAddr {
    let mut url = addr.clone().into_inner();
    if url.set_username("").is_err() || url.set_password(None).is_err() {
        return addr; // a URL that cannot carry credentials carries none
    }
    async_nats::ServerAddr::from_url(url).unwrap_or(addr)
}
