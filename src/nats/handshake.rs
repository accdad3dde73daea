//! Opening the publishing connection (see `outbound.rs` beside this file): TCP, the
//! server's `INFO`, TLS when either side asks for it, `CONNECT` with the configured
//! authentication, and a `PING` answered by `PONG`, which is how a NATS server says the
//! login was accepted. The credentials files are read again at each connect (`credentials`). It follows what async-nats does for the same settings, so that both
//! connections of one pgoutbox log in alike; the claims, the stream and the tail stay on
//! async-nats's.

use std::io;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::ServerAddr;
use base64::Engine;
use bytes::{Buf, BytesMut};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::nats::connect::NatsSettings;
use crate::nats::credentials::NatsAuth;
use crate::nats::credentials::{self, CredentialsError};
use crate::nats::low_water::LowWater;
use crate::nats::wire::{self, ServerInfo, ServerOp, WireError};

/// How long one server may take to accept the connection and the login.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Transport for T {}

/// No server of the list accepted the publishing connection: each one's failure, in the
/// order they were tried.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(|(server, why)| format!("{server}: {why}")).collect::<Vec<_>>().join("; "))]
pub struct OpenError(pub Vec<(String, ServerError)>);

/// Why one server did not accept the publishing connection.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("no answer in {} s", HANDSHAKE_TIMEOUT.as_secs())]
    Timeout,
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("the server sent PONG before INFO")]
    PongBeforeInfo,
    /// `-ERR` during the login: a refused login, most often.
    #[error("the server said: {0}")]
    Refused(String),
    #[error("the server closed the connection")]
    Closed,
    #[error("TLS: {0}")]
    Tls(io::Error),
    #[error(transparent)]
    Credentials(#[from] crate::nats::credentials::CredentialsError),
}

/// A logged-in connection, with what the server said about itself and any bytes it sent
/// after the `PONG`.
pub struct Opened {
    pub transport: Box<dyn Transport>,
    /// The receive low-water mark of the connection's socket, whatever is layered on it.
    pub low_water: LowWater,
    pub info: ServerInfo,
    pub unread: BytesMut,
}

/// Opens publishing connections to the configured servers and those the cluster announced,
/// starting with the one that last worked, so that an attempt after a server died goes on
/// to the next.
pub struct Dialer<'a> {
    settings: &'a NatsSettings,
    known: Mutex<Known>,
}

struct Known {
    servers: Vec<ServerAddr>,
    first: usize,
}

impl<'a> Dialer<'a> {
    pub fn new(settings: &'a NatsSettings) -> Self {
        let known = Known { servers: settings.servers.clone(), first: 0 };
        Dialer { settings, known: Mutex::new(known) }
    }

    /// Tries each server once, in turn; the error names each server's failure.
    pub async fn open(&self) -> Result<Opened, OpenError> {
        let servers = {
            let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            let (after, before) = known.servers.split_at(known.first.min(known.servers.len()));
            before.iter().chain(after).cloned().collect::<Vec<_>>()
        };
        let mut failures = Vec::new();
        for server in servers {
            let name = format!("{}:{}", server.host(), server.port());
            let opened =
                tokio::time::timeout(HANDSHAKE_TIMEOUT, open(&server, &self.settings.auth))
                    .await
                    .unwrap_or(Err(ServerError::Timeout));
            match opened {
                Ok(opened) => {
                    self.worked(&server, &opened.info.connect_urls);
                    return Ok(opened);
                }
                Err(why) => failures.push((name, why)),
            }
        }
        Err(OpenError(failures))
    }

    fn worked(&self, server: &ServerAddr, announced: &[String]) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        for url in announced {
            if let Ok(addr) = url.parse::<ServerAddr>()
                && !known.servers.contains(&addr)
            {
                known.servers.push(addr);
            }
        }
        known.first = known.servers.iter().position(|s| s == server).unwrap_or(0);
    }
}

async fn open(server: &ServerAddr, auth: &NatsAuth) -> Result<Opened, ServerError> {
    let tcp = tokio::net::TcpStream::connect((server.host(), server.port())).await?;
    tcp.set_nodelay(true)?;
    let low_water = LowWater::of(tcp.as_fd())?;
    let mut transport: Box<dyn Transport> = Box::new(tcp);
    let mut unread = BytesMut::with_capacity(16 * 1024);
    let info = match next_op(&mut transport, &mut unread).await? {
        Step::Info(info) => info,
        Step::Pong => return Err(ServerError::PongBeforeInfo),
    };
    let tls = auth.tls_ca.is_some() || server.tls_required() || info.tls_required;
    if tls {
        transport = upgrade(transport, server.host(), auth).await?;
    }
    let connect = connect_fields(auth, &info, auth.tls_ca.is_some() || server.tls_required())?;
    let login = format!("CONNECT {connect}\r\nPING\r\n");
    transport.write_all(login.as_bytes()).await?;
    transport.flush().await?;
    // `INFO` may come again meanwhile; `-ERR` is a refused login.
    while let Step::Info(_) = next_op(&mut transport, &mut unread).await? {}
    Ok(Opened { transport, low_water, info, unread })
}

enum Step {
    Info(ServerInfo),
    Pong,
}

/// Reads until `INFO` or `PONG`; `-ERR` and the end of the connection are errors.
async fn next_op(
    transport: &mut Box<dyn Transport>,
    buf: &mut BytesMut,
) -> Result<Step, ServerError> {
    loop {
        let parsed = wire::parse(buf)?;
        if let Some((op, used)) = parsed {
            let step = match op {
                ServerOp::Info(info) => Some(Step::Info(info)),
                ServerOp::Pong => Some(Step::Pong),
                ServerOp::Err(why) => return Err(ServerError::Refused(why)),
                ServerOp::Ping | ServerOp::Ok | ServerOp::Message(_) => None,
            };
            buf.advance(used);
            match step {
                Some(step) => return Ok(step),
                None => continue,
            }
        }
        if transport.read_buf(buf).await? == 0 {
            return Err(ServerError::Closed);
        }
    }
}

/// The `CONNECT` fields, as async-nats sends them for the same settings.
fn connect_fields(
    auth: &NatsAuth,
    info: &ServerInfo,
    tls_required: bool,
) -> Result<serde_json::Value, CredentialsError> {
    let mut fields = serde_json::json!({
        "verbose": false,
        "pedantic": false,
        "lang": "rust",
        "version": env!("CARGO_PKG_VERSION"),
        "protocol": 1,
        "name": "pgoutbox",
        "tls_required": tls_required,
        "echo": true,
        "headers": true,
        "no_responders": true,
    });
    let nonce = info.nonce.as_deref().unwrap_or_default().as_bytes();
    let login = credentials::login(auth, nonce)?;
    let base64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    if let Some(jwt) = login.jwt {
        fields["jwt"] = jwt.into();
    }
    if let Some(nkey) = login.nkey {
        fields["nkey"] = nkey.into();
    }
    if let Some(signature) = login.signature {
        fields["sig"] = base64(&signature).into();
    }
    if let Some((user, password)) = login.user_password {
        fields["user"] = user.into();
        fields["pass"] = password.into();
    }
    if let Some(token) = login.token {
        fields["auth_token"] = token.into();
    }
    Ok(fields)
}

/// TLS over the connection, verified against `--nats-tls-ca` (or the system's roots),
/// with the client certificate when one is configured.
async fn upgrade(
    transport: Box<dyn Transport>,
    host: &str,
    auth: &NatsAuth,
) -> Result<Box<dyn Transport>, ServerError> {
    let config = tls_config(auth).map_err(ServerError::Tls)?;
    let name = ServerName::try_from(host.to_owned())
        .map_err(|err| ServerError::Tls(io::Error::new(io::ErrorKind::InvalidInput, err)))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tls = connector.connect(name, transport).await.map_err(ServerError::Tls)?;
    Ok(Box::new(tls))
}

fn tls_config(auth: &NatsAuth) -> io::Result<rustls::ClientConfig> {
    let invalid =
        |err: &dyn std::fmt::Display| io::Error::new(io::ErrorKind::InvalidData, err.to_string());
    let mut roots = rustls::RootCertStore::empty();
    match &auth.tls_ca {
        Some(ca) => {
            for cert in CertificateDer::pem_file_iter(ca).map_err(|err| invalid(&err))? {
                roots.add(cert.map_err(|err| invalid(&err))?).map_err(|err| invalid(&err))?;
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| invalid(&err))?
        .with_root_certificates(roots);
    match &auth.tls_client {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(|err| invalid(&err))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|err| invalid(&err))?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|err| invalid(&err))?;
            builder.with_client_auth_cert(chain, key).map_err(|err| invalid(&err))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_login_carries_each_configured_credential() {
        let info = ServerInfo::default();
        let auth = NatsAuth {
            user_password: Some(("app".into(), "secret".into())),
            token: Some("t0k3n".into()),
            ..NatsAuth::default()
        };
        let fields = connect_fields(&auth, &info, true).unwrap();
        assert_eq!(fields["user"], "app");
        assert_eq!(fields["pass"], "secret");
        assert_eq!(fields["auth_token"], "t0k3n");
        assert_eq!(fields["tls_required"], true);
        assert_eq!(
            (fields["headers"].clone(), fields["no_responders"].clone()),
            (true.into(), true.into())
        );
        let none = connect_fields(&NatsAuth::default(), &info, false).unwrap();
        assert!(none.get("user").is_none() && none.get("sig").is_none());
    }

    #[test]
    fn an_nkey_login_signs_the_servers_nonce() {
        let dir = tempfile::tempdir().unwrap();
        let key = nkeys::KeyPair::new_user();
        let seed = dir.path().join("seed");
        std::fs::write(&seed, format!("{}\n", key.seed().unwrap())).unwrap();
        let auth = NatsAuth { nkey_file: Some(seed), ..NatsAuth::default() };
        let info = ServerInfo { nonce: Some("n0nce".into()), ..ServerInfo::default() };
        let fields = connect_fields(&auth, &info, false).unwrap();
        assert_eq!(fields["nkey"], key.public_key());
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(fields["sig"].as_str().unwrap())
            .unwrap();
        key.verify(b"n0nce", &sig).unwrap();
    }
}
