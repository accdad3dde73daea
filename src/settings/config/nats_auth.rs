//! The NATS credentials of the settings: from the first server's URL and the files named.

use crate::nats::credentials::NatsAuth;
use crate::postgres::conninfo::percent_decode;
use crate::settings::cli::CommonArgs;

/// The NATS authentication the arguments and the first server's URL ask for.
pub(super) fn nats_auth(args: &CommonArgs, first: &async_nats::ServerAddr) -> NatsAuth {
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
pub(super) fn without_credentials(addr: async_nats::ServerAddr) -> async_nats::ServerAddr {
    let mut url = addr.clone().into_inner();
    if url.set_username("").is_err() || url.set_password(None).is_err() {
        return addr; // a URL that cannot carry credentials carries none
    }
    async_nats::ServerAddr::from_url(url).unwrap_or(addr)
}
