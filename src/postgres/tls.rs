//! Postgres TLS for both connections, with libpq's `sslmode` and `sslrootcert`.
//!
//! tokio-postgres parses neither `verify-ca`/`verify-full` nor `sslrootcert`, so both are
//! taken out of the connection string here and turned into one rustls configuration that
//! the SQL connection (through tokio-postgres-rustls) and the replication connection (our
//! own SSLRequest) share. As in libpq: `require` without a root certificate encrypts but
//! does not verify; with one it verifies the chain like `verify-ca`; `verify-full` also
//! checks the host name; `prefer` (the default) and `allow` use TLS when the server offers
//! it, without verification. `sslcert` and `sslkey` give a client certificate, for servers
//! whose `pg_hba.conf` asks for one (`cert` or `clientcert=verify-full`).
//!
//! [`PgTls`] also carries the `--database-password-command`, the other thing every new
//! connection needs beyond tokio-postgres's `Config`: it is passed wherever a connection
//! is opened, so one value reaches them all.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;

use crate::postgres::conninfo::{ConnInfoError, TlsError};
use crate::postgres::password_command::{PasswordCommand, PasswordCommandError};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// TLS settings for Postgres, as given in the connection string, with the rustls
/// configuration built once from them when the settings are validated: a missing or
/// unreadable `sslrootcert` is a start-up error, and no reconnection reads the CA file.
#[derive(Debug, Clone)]
pub struct PgTls {
    pub mode: SslMode,
    pub root_cert: Option<PathBuf>,
    /// `sslcert` and `sslkey`.
    client_cert: Option<(PathBuf, PathBuf)>,
    client: Option<Arc<rustls::ClientConfig>>,
    password_command: Option<Arc<PasswordCommand>>,
}

impl PgTls {
    fn new(
        mode: SslMode,
        root_cert: Option<PathBuf>,
        client_cert: Option<(PathBuf, PathBuf)>,
    ) -> Result<PgTls, TlsError> {
        let mut tls = PgTls { mode, root_cert, client_cert, client: None, password_command: None };
        tls.client = tls.build_client_config()?.map(Arc::new);
        Ok(tls)
    }

    /// Runs `command` for the password of each new connection.
    pub fn with_password_command(mut self, command: Option<PasswordCommand>) -> Self {
        self.password_command = command.map(Arc::new);
        self
    }

    /// The settings to log in with: `config` with the password command's fresh password
    /// when one is configured, else `config` as it is.
    pub async fn login<'a>(
        &self,
        config: &'a tokio_postgres::Config,
    ) -> Result<Cow<'a, tokio_postgres::Config>, PasswordCommandError> {
        let Some(command) = &self.password_command else { return Ok(Cow::Borrowed(config)) };
        let mut fresh = config.clone();
        fresh.password(command.password().await?);
        Ok(Cow::Owned(fresh))
    }

    /// The rustls configuration for this mode; `None` when TLS is disabled.
    pub fn client_config(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.client.clone()
    }

    /// Whether a server that refuses TLS must be refused in turn.
    pub fn required(&self) -> bool {
        matches!(self.mode, SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull)
    }

    pub fn tokio_postgres_mode(&self) -> tokio_postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }

    fn build_client_config(&self) -> Result<Option<rustls::ClientConfig>, TlsError> {
        if self.mode == SslMode::Disable {
            return Ok(None);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let algorithms = provider.signature_verification_algorithms;
        let verify = match (self.mode, &self.root_cert) {
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                let mode = if self.mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" };
                return Err(TlsError::NeedsRootCert { mode });
            }
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => None,
            (_, Some(path)) => Some(load_roots(path)?),
        };
        let verifier: Arc<dyn ServerCertVerifier> = match verify {
            None => Arc::new(EncryptOnly { algorithms }),
            Some(roots) => {
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| TlsError::Rustls(e.to_string()))?;
                if self.mode == SslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(ChainOnly { webpki })
                }
            }
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let unusable = |path: &PathBuf, reason: String| TlsError::ClientCert {
                    path: path.clone(),
                    reason,
                };
                let chain = CertificateDer::pem_file_iter(cert)
                    .map_err(|e| unusable(cert, e.to_string()))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| unusable(cert, e.to_string()))?;
                let private =
                    PrivateKeyDer::from_pem_file(key).map_err(|e| unusable(key, e.to_string()))?;
                builder
                    .with_client_auth_cert(chain, private)
                    .map_err(|e| unusable(cert, e.to_string()))?
            }
        };
        Ok(Some(config))
    }
}

fn load_roots(path: &PathBuf) -> Result<Arc<RootCertStore>, TlsError> {
    let unusable = |reason: String| TlsError::RootCert { path: path.clone(), reason };
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError::UnreadableRootCert { path: path.clone(), reason: e.to_string() })?;
    for cert in certs {
        let cert = cert.map_err(|e| unusable(e.to_string()))?;
        roots.add(cert).map_err(|e| unusable(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(unusable("it holds no certificate".to_owned()));
    }
    Ok(Arc::new(roots))
}

/// Takes `sslmode`, `sslrootcert`, `sslcert` and `sslkey` out of a `key=value` connection
/// string and returns the rest for tokio-postgres.
pub fn split_connection_string(text: &str) -> Result<(String, PgTls), ConnInfoError> {
    let (mut mode, mut root_cert) = (SslMode::Prefer, None);
    let (mut cert, mut key_file) = (None, None);
    let take = |key: &str, value: &str| -> Result<bool, ConnInfoError> {
        match key {
            "sslmode" => {
                mode = match value {
                    "disable" => SslMode::Disable,
                    "allow" | "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => return Err(ConnInfoError::UnknownSslMode(other.to_owned())),
                };
                Ok(true)
            }
            "sslrootcert" => {
                root_cert = Some(PathBuf::from(value));
                Ok(true)
            }
            "sslcert" => {
                cert = Some(PathBuf::from(value));
                Ok(true)
            }
            "sslkey" => {
                key_file = Some(PathBuf::from(value));
                Ok(true)
            }
            _ => Ok(false),
        }
    };
    let rest = crate::postgres::conninfo::strip_params(text, take)?;
    let client_cert = match (cert, key_file) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err(TlsError::CertWithoutKey.into()),
    };
    Ok((rest, PgTls::new(mode, root_cert, client_cert)?))
}

/// `require` without a root certificate: encrypted, the server not authenticated (libpq's
/// behaviour). Handshake signatures are still checked.
#[derive(Debug)]
struct EncryptOnly {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to the root certificate; the host name is not checked.
#[derive(Debug)]
struct ChainOnly {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssl_options_are_taken_out_of_key_value_strings() {
        let (rest, tls) =
            split_connection_string("host=h password='a b' sslmode=require dbname=d").unwrap();
        assert_eq!(rest, "host=h password='a b' dbname=d");
        assert_eq!(tls.mode, SslMode::Require);
        let err =
            split_connection_string("sslmode=verify-ca sslrootcert='/x y/ca.pem'").unwrap_err();
        assert!(matches!(err, ConnInfoError::Tls(TlsError::UnreadableRootCert { .. })), "{err}");
        assert!(split_connection_string("sslmode=sometimes").is_err());
        let (_, tls) = split_connection_string("host=h").unwrap();
        assert_eq!(tls.mode, SslMode::Prefer, "libpq's default");
        let err = split_connection_string("sslmode=require sslcert=/c.pem").unwrap_err();
        assert_eq!(err, ConnInfoError::Tls(TlsError::CertWithoutKey));
        let err = split_connection_string("sslmode=require sslcert=/no/c.pem sslkey=/no/k.pem")
            .unwrap_err();
        assert!(err.to_string().starts_with("client certificate /no/c.pem"), "{err}");
    }

    #[test]
    fn verify_modes_need_a_root_certificate() {
        let err = PgTls::new(SslMode::VerifyFull, None, None).unwrap_err();
        assert_eq!(err, TlsError::NeedsRootCert { mode: "verify-full" });
        assert!(PgTls::new(SslMode::Require, None, None).unwrap().client_config().is_some());
        assert!(PgTls::new(SslMode::Disable, None, None).unwrap().client_config().is_none());
    }
}
