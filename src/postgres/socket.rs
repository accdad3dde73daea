//! How the replication connection reaches the server: TCP or a Unix socket, TCP keepalive
//! and `TCP_USER_TIMEOUT` as the connection string says, and TLS.

use std::io;

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_postgres::config::Host;

use super::ConnectionError;
use crate::postgres::tls::PgTls;

/// Anything the connection can run over: TCP or a Unix socket.
pub(super) trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

/// One host of the connection string: where to connect, as libpq reads `host`, `hostaddr`
/// and `port` (a `hostaddr` is dialled, its `host` names the server for TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Endpoint {
    pub address: Host,
    pub tls_name: String,
    pub port: u16,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.address {
            Host::Tcp(name) => write!(f, "{name}:{}", self.port),
            Host::Unix(dir) => {
                write!(f, "{}", dir.join(format!(".s.PGSQL.{}", self.port)).display())
            }
        }
    }
}

/// The hosts to try, in order.
pub(super) fn endpoints(config: &tokio_postgres::Config) -> Vec<Endpoint> {
    let (hosts, addrs, ports) = (config.get_hosts(), config.get_hostaddrs(), config.get_ports());
    let count = hosts.len().max(addrs.len()).max(1);
    (0..count)
        .map(|i| {
            let host = hosts.get(i).cloned();
            let name = match &host {
                Some(Host::Tcp(name)) => Some(name.clone()),
                _ => None,
            };
            let address = match (addrs.get(i), host) {
                (Some(addr), _) => Host::Tcp(addr.to_string()),
                (None, Some(host)) => host,
                (None, None) => Host::Tcp("localhost".to_owned()),
            };
            let tls_name = name.unwrap_or_else(|| match &address {
                Host::Tcp(addr) => addr.clone(),
                Host::Unix(_) => String::new(),
            });
            let port = ports.get(i).or_else(|| ports.first()).copied().unwrap_or(5432);
            Endpoint { address, tls_name, port }
        })
        .collect()
}

/// Opens a socket to `endpoint`: TCP within `connect_timeout` with TLS as `sslmode` says,
/// or a Unix socket.
pub(super) async fn open_socket(
    endpoint: &Endpoint,
    config: &tokio_postgres::Config,
    tls: &PgTls,
) -> Result<Box<dyn Socket>, ConnectionError> {
    match &endpoint.address {
        Host::Tcp(address) => open_tcp(address, endpoint, config, tls).await,
        Host::Unix(_) => UnixStream::connect(endpoint.to_string())
            .await
            .map(|s| Box::new(s) as _)
            .map_err(|source| ConnectionError::Connect { target: endpoint.to_string(), source }),
    }
}

/// TCP, then TLS, both within `connect_timeout` (as in libpq: a server that accepts the
/// connection and then answers nothing is given up on like one that never accepts it).
async fn open_tcp(
    address: &str,
    endpoint: &Endpoint,
    config: &tokio_postgres::Config,
    tls: &PgTls,
) -> Result<Box<dyn Socket>, ConnectionError> {
    let connect_error = |source| ConnectionError::Connect { target: endpoint.to_string(), source };
    let attempt = async {
        let stream = TcpStream::connect((address, endpoint.port)).await.map_err(connect_error)?;
        stream.set_nodelay(true).map_err(connect_error)?;
        configure_tcp(&stream, config).map_err(connect_error)?;
        negotiate_tls(stream, &endpoint.tls_name, tls).await
    };
    match config.get_connect_timeout() {
        Some(&limit) => tokio::time::timeout(limit, attempt).await.unwrap_or_else(|_| {
            Err(connect_error(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")))
        }),
        None => attempt.await,
    }
}

/// Sets TCP keepalive and `TCP_USER_TIMEOUT` as the connection string says (see
/// `conninfo`), as tokio-postgres does for the SQL connection: without them a partition that
/// drops packets silently leaves this socket waiting for about 15 minutes.
fn configure_tcp(stream: &TcpStream, config: &tokio_postgres::Config) -> io::Result<()> {
    let socket = socket2::SockRef::from(stream);
    if config.get_keepalives() {
        let mut keepalive = socket2::TcpKeepalive::new().with_time(config.get_keepalives_idle());
        if let Some(interval) = config.get_keepalives_interval() {
            keepalive = keepalive.with_interval(interval);
        }
        if let Some(count) = config.get_keepalives_retries() {
            keepalive = keepalive.with_retries(count);
        }
        socket.set_tcp_keepalive(&keepalive)?;
    }
    #[cfg(target_os = "linux")]
    if let Some(&timeout) = config.get_tcp_user_timeout() {
        socket.set_tcp_user_timeout(Some(timeout))?;
    }
    Ok(())
}

/// Asks the server for TLS (SSLRequest) unless `sslmode=disable`, and upgrades the socket
/// when it agrees. Unix sockets never use TLS, as with libpq.
async fn negotiate_tls(
    mut stream: TcpStream,
    host: &str,
    tls: &PgTls,
) -> Result<Box<dyn Socket>, ConnectionError> {
    let Some(client_config) = tls.client_config() else {
        return Ok(Box::new(stream));
    };
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    stream.write_all(&request).await?;
    match stream.read_u8().await? {
        b'S' => {
            let name = ServerName::try_from(host.to_owned())
                .map_err(|e| ConnectionError::Tls(format!("host {host:?}: {e}")))?;
            let connector = tokio_rustls::TlsConnector::from(client_config);
            let stream = connector
                .connect(name, stream)
                .await
                .map_err(|e| ConnectionError::Tls(format!("TLS handshake with {host}: {e}")))?;
            Ok(Box::new(stream))
        }
        b'N' if !tls.required() => Ok(Box::new(stream)),
        b'N' => Err(ConnectionError::Tls(format!("{host} does not accept TLS connections"))),
        other => Err(ConnectionError::Protocol(format!("answer {other:#04x} to SSLRequest"))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn tcp_options_reach_the_socket() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let mut config = tokio_postgres::Config::new();
        config
            .keepalives_idle(Duration::from_secs(20))
            .keepalives_interval(Duration::from_secs(7))
            .keepalives_retries(4)
            .tcp_user_timeout(Duration::from_millis(1500));
        configure_tcp(&stream, &config).unwrap();
        let socket = socket2::SockRef::from(&stream);
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(20));
        assert_eq!(socket.tcp_keepalive_interval().unwrap(), Duration::from_secs(7));
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), 4);
        assert_eq!(socket.tcp_user_timeout().unwrap(), Some(Duration::from_millis(1500)));
    }

    fn parsed(conninfo: &str) -> Vec<String> {
        let config: tokio_postgres::Config = conninfo.parse().unwrap();
        endpoints(&config).iter().map(|e| format!("{e} tls={}", e.tls_name)).collect()
    }

    #[test]
    fn hosts_pair_with_their_ports_and_hostaddr_is_dialled() {
        assert_eq!(parsed("user=u"), ["localhost:5432 tls=localhost"]);
        assert_eq!(
            parsed("postgresql://u@a:6000,b/db"),
            ["a:6000 tls=a", "b:5432 tls=b"],
            "a host without a port gets the default, as in libpq"
        );
        assert_eq!(
            parsed("host=db.example hostaddr=10.0.0.7 port=5433 user=u"),
            ["10.0.0.7:5433 tls=db.example"],
            "hostaddr is dialled; host still names the server for TLS"
        );
        assert_eq!(parsed("hostaddr=10.0.0.7 user=u"), ["10.0.0.7:5432 tls=10.0.0.7"]);
        assert_eq!(parsed("host=/run/pg port=5499 user=u"), ["/run/pg/.s.PGSQL.5499 tls="]);
    }
}
