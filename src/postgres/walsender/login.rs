//! Opening the replication session: the hosts of the connection string in turn, startup,
//! authentication (trust, cleartext, md5, SCRAM-SHA-256) and `target_session_attrs`.

use std::time::Duration;

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::{md5_hash, sasl};
use postgres_protocol::message::{backend, frontend};
use tokio_postgres::config::TargetSessionAttrs;
use tracing::{debug, warn};

use super::{ConnectionError, READ_CHUNK, ReplicationConnection, unexpected};
use crate::postgres::backend::message_name;
use crate::postgres::socket::{Endpoint, endpoints, open_socket};
use crate::postgres::tls::PgTls;
use crate::postgres::wire::parse_wal_sender_timeout;

impl ReplicationConnection {
    /// Opens a `replication=database` session with the same settings as the SQL connection
    /// (the password command run again for it), and reads the server's `wal_sender_timeout`.
    ///
    /// As with libpq's `connect_timeout`, each step (reaching a host, then logging in) must
    /// finish in time: behind a proxy that black-holes traffic the TCP connection opens but
    /// the server never answers, and keepalive cannot tell.
    pub async fn connect(
        config: &tokio_postgres::Config,
        tls: &PgTls,
    ) -> Result<Self, ConnectionError> {
        let config = &*tls.login(config).await.map_err(ConnectionError::PasswordCommand)?;
        let mut last_error = None;
        for endpoint in endpoints(config) {
            match Self::connect_to(&endpoint, config, tls).await {
                Ok(conn) => return Ok(conn),
                Err(err) => {
                    debug!(%endpoint, error = %err, "trying the next host");
                    last_error = Some(err);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| ConnectionError::Protocol("no host to connect to".into())))
    }

    /// One host of the list, checked against `target_session_attrs` as libpq checks it.
    async fn connect_to(
        endpoint: &Endpoint,
        config: &tokio_postgres::Config,
        tls: &PgTls,
    ) -> Result<Self, ConnectionError> {
        let socket = open_socket(endpoint, config, tls).await?;
        let mut conn = ReplicationConnection {
            socket,
            read_buf: BytesMut::with_capacity(READ_CHUNK),
            write_buf: BytesMut::with_capacity(1024),
            backend_pid: None,
            wal_sender_timeout: None,
        };
        let login = conn.log_in(config);
        match config.get_connect_timeout() {
            Some(&limit) => tokio::time::timeout(limit, login).await.map_err(|_| {
                ConnectionError::Unresponsive(format!("no login within connect_timeout {limit:?}"))
            })??,
            None => login.await?,
        }
        let wanted = match config.get_target_session_attrs() {
            TargetSessionAttrs::ReadWrite => "off",
            TargetSessionAttrs::ReadOnly => "on",
            _ => return Ok(conn),
        };
        let rows = conn.simple_query("SHOW transaction_read_only").await?;
        let read_only = rows.first().and_then(|row| row.first()).and_then(Option::as_deref);
        if read_only != Some(wanted) {
            return Err(ConnectionError::SessionAttrs {
                target: endpoint.to_string(),
                wanted: config.get_target_session_attrs(),
            });
        }
        Ok(conn)
    }

    /// Startup, authentication, then `SHOW wal_sender_timeout`.
    async fn log_in(&mut self, config: &tokio_postgres::Config) -> Result<(), ConnectionError> {
        let user = user_name(config);
        let database = config.get_dbname().unwrap_or(&user).to_owned();
        let mut params = vec![
            ("user", user.as_str()),
            ("database", database.as_str()),
            ("replication", "database"),
            ("application_name", config.get_application_name().unwrap_or("pgoutbox")),
        ];
        let options = crate::postgres::pinned_names::startup_options(config.get_options());
        params.push(("options", options.as_str()));
        frontend::startup_message(params, &mut self.write_buf)?;
        self.flush().await?;
        self.authenticate(&user, config.get_password()).await?;
        self.wait_ready().await?;
        let rows = self.simple_query("SHOW wal_sender_timeout").await?;
        let shown = rows.first().and_then(|row| row.first()).and_then(Option::as_deref);
        self.wal_sender_timeout = match shown.map(parse_wal_sender_timeout) {
            Some(Ok(timeout)) => timeout,
            _ => {
                // Assume the smallest setting that works at all: statuses cost little.
                warn!(?shown, "cannot read wal_sender_timeout; assuming 1s");
                Some(Duration::from_secs(1))
            }
        };
        Ok(())
    }

    async fn authenticate(
        &mut self,
        user: &str,
        password: Option<&[u8]>,
    ) -> Result<(), ConnectionError> {
        let need_password = || {
            password.ok_or_else(|| {
                ConnectionError::Auth("the server asks for a password and none was given".into())
            })
        };
        loop {
            match self.next_backend_message().await? {
                backend::Message::AuthenticationOk => return Ok(()),
                backend::Message::AuthenticationCleartextPassword => {
                    frontend::password_message(need_password()?, &mut self.write_buf)?;
                    self.flush().await?;
                }
                backend::Message::AuthenticationMd5Password(body) => {
                    let hash = md5_hash(user.as_bytes(), need_password()?, body.salt());
                    frontend::password_message(hash.as_bytes(), &mut self.write_buf)?;
                    self.flush().await?;
                }
                backend::Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let mut scram_offered = false;
                    while let Some(mechanism) = mechanisms.next()? {
                        scram_offered |= mechanism == sasl::SCRAM_SHA_256;
                    }
                    if !scram_offered {
                        return Err(ConnectionError::Auth(
                            "the server offers no SASL mechanism we support (SCRAM-SHA-256)".into(),
                        ));
                    }
                    self.authenticate_scram(need_password()?).await?;
                }
                other => {
                    return Err(ConnectionError::Auth(format!(
                        "unsupported authentication request {}",
                        message_name(&other)
                    )));
                }
            }
        }
    }

    async fn authenticate_scram(&mut self, password: &[u8]) -> Result<(), ConnectionError> {
        let mut scram = sasl::ScramSha256::new(password, sasl::ChannelBinding::unsupported());
        frontend::sasl_initial_response(sasl::SCRAM_SHA_256, scram.message(), &mut self.write_buf)?;
        self.flush().await?;
        match self.next_backend_message().await? {
            backend::Message::AuthenticationSaslContinue(body) => {
                scram.update(body.data()).map_err(|e| ConnectionError::Auth(e.to_string()))?
            }
            other => return Err(unexpected(&other)),
        }
        frontend::sasl_response(scram.message(), &mut self.write_buf)?;
        self.flush().await?;
        match self.next_backend_message().await? {
            backend::Message::AuthenticationSaslFinal(body) => {
                scram.finish(body.data()).map_err(|e| ConnectionError::Auth(e.to_string()))
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Reads past ParameterStatus and BackendKeyData up to the first ReadyForQuery.
    pub(super) async fn wait_ready(&mut self) -> Result<(), ConnectionError> {
        loop {
            match self.next_backend_message().await? {
                backend::Message::ReadyForQuery(_) => return Ok(()),
                backend::Message::BackendKeyData(key) => self.backend_pid = Some(key.process_id()),
                backend::Message::ParameterStatus(_) => {}
                other => return Err(unexpected(&other)),
            }
        }
    }
}

/// The role to log in as: the one in the URL, else the OS user, as libpq does.
pub fn user_name(config: &tokio_postgres::Config) -> String {
    config
        .get_user()
        .map(str::to_owned)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "postgres".to_owned())
}
