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

/// Connects to the first host that answers, each within `connect_timeout`.
pub(super) async fn open_socket(
    config: &tokio_postgres::Config,
    tls: &PgTls,
) -> Result<Box<dyn Socket>, ConnectionError> {
    let ports = config.get_ports();
    let localhost = [Host::Tcp("localhost".to_owned())];
    let hosts = match config.get_hosts() {
        [] => &localhost[..],
        hosts => hosts,
    };
    let mut last_error = None;
    for (i, host) in hosts.iter().enumerate() {
        let port = ports.get(i).or_else(|| ports.first()).copied().unwrap_or(5432);
        let (target, result) = match host {
            Host::Tcp(name) => {
                let attempt = async {
                    let stream = TcpStream::connect((name.as_str(), port)).await?;
                    stream.set_nodelay(true)?;
                    configure_tcp(&stream, config)?;
                    Ok(stream)
                };
                let stream = match config.get_connect_timeout() {
                    Some(&limit) => match tokio::time::timeout(limit, attempt).await {
                        Ok(result) => result,
                        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
                    },
                    None => attempt.await,
                };
                match stream {
                    Ok(stream) => return negotiate_tls(stream, name, tls).await,
                    Err(source) => (format!("{name}:{port}"), Err(source)),
                }
            }
            Host::Unix(dir) => {
                let path = dir.join(format!(".s.PGSQL.{port}"));
                let result = UnixStream::connect(&path).await.map(|s| Box::new(s) as _);
                (path.display().to_string(), result)
            }
        };
        match result {
            Ok(socket) => return Ok(socket),
            Err(source) => last_error = Some(ConnectionError::Connect { target, source }),
        }
    }
    Err(last_error.unwrap_or_else(|| ConnectionError::Protocol("no host to connect to".into())))
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
}
