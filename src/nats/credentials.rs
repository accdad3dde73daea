//! The NATS login's credentials, read from their files at each connect: a `.creds` file or
//! an NKey seed rotated on disk is used by the next connection, on both of pgoutbox's
//! connections (async-nats's, through its auth callback, and the publishing one).

use std::io;

/// How to authenticate to NATS. async-nats ignores credentials embedded in a URL, so they
/// are taken out of the first server's URL here: `user:password@` or a lone `token@`.
#[derive(Default, Clone)]
pub struct NatsAuth {
    pub user_password: Option<(String, String)>,
    pub token: Option<String>,
    pub creds_file: Option<std::path::PathBuf>,
    pub nkey_file: Option<std::path::PathBuf>,
    pub tls_ca: Option<std::path::PathBuf>,
    pub tls_client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// The configured credentials could not be read or used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("reading {flag} {path}: {source}")]
    Unreadable { flag: &'static str, path: String, source: io::Error },
    #[error("--nats-creds {0} holds no JWT and seed")]
    NoJwtAndSeed(String),
    #[error("{flag}: {source}")]
    BadKey { flag: &'static str, source: nkeys::error::Error },
    #[error("signing the nonce: {0}")]
    Signing(nkeys::error::Error),
}

/// What one `CONNECT` carries, the server's nonce signed.
#[derive(Debug, Default)]
pub struct Login {
    pub jwt: Option<String>,
    /// The NKey's public key (an `--nats-nkey` login).
    pub nkey: Option<String>,
    pub signature: Option<Vec<u8>>,
    pub user_password: Option<(String, String)>,
    pub token: Option<String>,
}

/// Reads the credentials files now and signs `nonce` with their key.
pub fn login(auth: &NatsAuth, nonce: &[u8]) -> Result<Login, CredentialsError> {
    let mut login = Login {
        user_password: auth.user_password.clone(),
        token: auth.token.clone(),
        ..Login::default()
    };
    if let Some(path) = &auth.creds_file {
        let contents = read(path, "--nats-creds")?;
        let (jwt, seed) = parse_creds(&contents)
            .ok_or_else(|| CredentialsError::NoJwtAndSeed(path.display().to_string()))?;
        let key = nkeys::KeyPair::from_seed(seed)
            .map_err(|source| CredentialsError::BadKey { flag: "--nats-creds", source })?;
        login.jwt = Some(jwt.to_owned());
        login.signature = Some(key.sign(nonce).map_err(CredentialsError::Signing)?);
    }
    if let Some(path) = &auth.nkey_file {
        let seed = read(path, "--nats-nkey")?;
        let key = nkeys::KeyPair::from_seed(seed.trim())
            .map_err(|source| CredentialsError::BadKey { flag: "--nats-nkey", source })?;
        login.nkey = Some(key.public_key());
        login.signature = Some(key.sign(nonce).map_err(CredentialsError::Signing)?);
    }
    Ok(login)
}

/// Whether any credential is configured (else the login carries none).
pub fn any(auth: &NatsAuth) -> bool {
    auth.creds_file.is_some()
        || auth.nkey_file.is_some()
        || auth.user_password.is_some()
        || auth.token.is_some()
}

fn read(path: &std::path::Path, flag: &'static str) -> Result<String, CredentialsError> {
    std::fs::read_to_string(path).map_err(|source| CredentialsError::Unreadable {
        flag,
        path: path.display().to_string(),
        source,
    })
}

/// The user JWT and the NKey seed of a creds file, each the first line after its
/// `-----BEGIN …-----` marker.
fn parse_creds(contents: &str) -> Option<(&str, &str)> {
    let after = |marker: &str| {
        let mut lines = contents.lines().map(str::trim).skip_while(|line| {
            !(line.starts_with("---") && line.contains("BEGIN") && line.contains(marker))
        });
        lines.next()?;
        lines.find(|line| !line.is_empty()).filter(|line| !line.starts_with("---"))
    };
    Some((after("JWT")?, after("SEED")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_creds_file_gives_its_jwt_and_seed() {
        let creds = "-----BEGIN NATS USER JWT-----\neyJhbGc.x.y\n------END NATS USER JWT------\n\n\
                     ************************* IMPORTANT *************************\n\n\
                     -----BEGIN USER NKEY SEED-----\n  SUAEXAMPLE\n------END USER NKEY SEED------\n";
        assert_eq!(parse_creds(creds), Some(("eyJhbGc.x.y", "SUAEXAMPLE")));
        assert_eq!(parse_creds("-----BEGIN NATS USER JWT-----\n------END\n"), None);
        assert_eq!(parse_creds(""), None);
    }

    #[test]
    fn a_rotated_seed_is_read_at_the_next_login() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seed");
        let auth = NatsAuth { nkey_file: Some(path.clone()), ..NatsAuth::default() };
        let (first, second) = (nkeys::KeyPair::new_user(), nkeys::KeyPair::new_user());
        std::fs::write(&path, first.seed().unwrap()).unwrap();
        assert_eq!(login(&auth, b"n").unwrap().nkey, Some(first.public_key()));
        std::fs::write(&path, second.seed().unwrap()).unwrap();
        assert_eq!(login(&auth, b"n").unwrap().nkey, Some(second.public_key()));
    }
}
