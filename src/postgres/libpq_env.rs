//! Where the database is, said the ways libpq (and so psql) understands: a connection
//! string, libpq's `PG*` environment variables, a connection service file, and the
//! password file.
//!
//! libpq's precedence, followed here (`conninfo_add_defaults` and `connectOptions2` in
//! `fe-connect.c`): a parameter the connection string sets wins; then the service's
//! parameters (the `service` key, else `PGSERVICE`) for those still unset; then the
//! environment variables; then the defaults (user: the OS user; database: the user;
//! host: the local Unix socket directory; port 5432). A service file's values therefore
//! beat the environment, as in libpq. The password, if none of those gave one, comes from
//! the password file, matched against each host in turn. pgoutbox's
//! `--database-password-command` comes before all of them (see `password_command`).
//!
//! Everything here is pure, behind the [`Env`] and [`Files`] seams, so tests touch
//! neither the process's environment nor the home directory.

mod conn_string;
mod passfile;
mod service_file;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use passfile::{Passfile, Target};

/// libpq parameters by name.
pub type Params = BTreeMap<String, String>;

/// The variables libpq reads, with the parameter each one gives.
const ENVIRONMENT: &[(&str, &str)] = &[
    ("host", "PGHOST"),
    ("hostaddr", "PGHOSTADDR"),
    ("port", "PGPORT"),
    ("dbname", "PGDATABASE"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("passfile", "PGPASSFILE"),
    ("options", "PGOPTIONS"),
    ("application_name", "PGAPPNAME"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
];

/// The variables that, alone, say which database to use (see [`resolve`]).
pub const NAMING_VARIABLES: &[&str] =
    &["PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGSERVICE"];

/// Looks a variable up; a seam so tests need not touch the process environment.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

/// Reads files; a seam so tests need not write to the home directory.
pub trait Files {
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>>;
    /// `Some((regular file, permission bits))`, or `None` when there is no such file.
    fn stat(&self, path: &Path) -> Option<(bool, u32)>;
    fn is_dir(&self, path: &Path) -> bool;
}

/// The real file system.
pub struct RealFiles;

impl Files for RealFiles {
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn stat(&self, path: &Path) -> Option<(bool, u32)> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path).ok()?;
        Some((meta.is_file(), meta.permissions().mode() & 0o7777))
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }
}

/// Where the database is, as a `key=value` string for tokio-postgres (without the
/// password, which never goes through a string), and what to warn about.
#[derive(Debug, Default)]
pub struct Resolved {
    pub conninfo: String,
    pub password: Option<String>,
    /// Said once at start, each in one line (an ignored password file, say).
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibpqError {
    #[error(
        "no database given: pass --database-url, set PGOUTBOX_DATABASE_URL or DATABASE_URL, \
         or libpq's PGHOST, PGHOSTADDR, PGPORT, PGDATABASE or PGSERVICE (with PGUSER, \
         PGPASSWORD, ~/.pgpass or PGPASSFILE, PGSERVICEFILE as psql reads them)"
    )]
    NothingGiven,
    #[error("--database-url is not a valid Postgres connection string: {0}")]
    ConnString(#[from] conn_string::ConnStringError),
    #[error("service file {path}, {source}")]
    ServiceLine { path: String, source: service_file::ServiceLineError },
    #[error("cannot read service file {path}: {reason}")]
    ServiceUnreadable { path: String, reason: String },
    #[error("service {service:?} is not defined in {searched}")]
    UnknownService { service: String, searched: String },
}

/// libpq's parameters from the connection string (if any), the service, the environment
/// and the defaults, in libpq's order. `password_command`: a command will give the
/// password, so the password file is not read.
pub fn resolve(
    conn_string: Option<&str>,
    env: &dyn Env,
    files: &dyn Files,
    password_command: bool,
) -> Result<Resolved, LibpqError> {
    let named_by_env = NAMING_VARIABLES.iter().any(|name| env.var(name).is_some());
    if conn_string.is_none() && !named_by_env {
        return Err(LibpqError::NothingGiven);
    }
    let mut params = match conn_string {
        Some(text) => conn_string::parse(text)?,
        None => Params::new(),
    };
    let service = params.get("service").cloned().or_else(|| env.var("PGSERVICE"));
    if let Some(service) = service {
        for (key, value) in service_params(&service, &params, env, files)? {
            params.entry(key).or_insert(value);
        }
    }
    for (key, variable) in ENVIRONMENT {
        if let (false, Some(value)) = (params.contains_key(*key), env.var(variable)) {
            params.insert((*key).to_owned(), value);
        }
    }
    let user = match params.get("user") {
        Some(user) => user.clone(),
        None => os_user(env).unwrap_or_else(|| "postgres".to_owned()),
    };
    params.insert("user".into(), user.clone());
    params.entry("dbname".into()).or_insert(user);
    let socket_dir = default_socket_dir(files);
    if !params.contains_key("host") && !params.contains_key("hostaddr") {
        params.insert("host".into(), socket_dir.to_owned());
    }
    let mut warnings = Vec::new();
    let mut password = params.remove("password").filter(|p| !p.is_empty());
    if password.is_none() && !password_command {
        let path = params.get("passfile").map(PathBuf::from).or_else(|| home(env, ".pgpass"));
        if let Some(path) = path {
            password = from_passfile(&path, &params, socket_dir, files, &mut warnings);
        }
    }
    for key in ["service", "servicefile", "passfile"] {
        params.remove(key);
    }
    Ok(Resolved { conninfo: conn_string::to_key_values(&params), password, warnings })
}

/// The service's parameters: from the user's file (`servicefile`, `PGSERVICEFILE` or
/// `~/.pg_service.conf`), else from `PGSYSCONFDIR/pg_service.conf`, as libpq looks.
fn service_params(
    service: &str,
    params: &Params,
    env: &dyn Env,
    files: &dyn Files,
) -> Result<Params, LibpqError> {
    let user_file = params
        .get("servicefile")
        .map(PathBuf::from)
        .or_else(|| env.var("PGSERVICEFILE").map(PathBuf::from))
        .or_else(|| home(env, ".pg_service.conf"));
    let system_file = env.var("PGSYSCONFDIR").map(|dir| Path::new(&dir).join("pg_service.conf"));
    let searched: Vec<PathBuf> = user_file.into_iter().chain(system_file).collect();
    for path in &searched {
        let shown = path.display().to_string();
        let bytes = match files.read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => {
                return Err(LibpqError::ServiceUnreadable { path: shown, reason: err.to_string() });
            }
        };
        let text = String::from_utf8_lossy(&bytes);
        match service_file::find(&text, service) {
            Ok(Some(found)) => return Ok(found),
            Ok(None) => {}
            Err(source) => return Err(LibpqError::ServiceLine { path: shown, source }),
        }
    }
    let searched = match searched.is_empty() {
        true => "any service file (set PGSERVICEFILE or PGSYSCONFDIR)".to_owned(),
        false => searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" or "),
    };
    Err(LibpqError::UnknownService { service: service.to_owned(), searched })
}

/// The password file's password for the first host that has one, as libpq's
/// `passwordFromFile`: a file others may read is ignored with a warning.
fn from_passfile(
    path: &Path,
    params: &Params,
    socket_dir: &str,
    files: &dyn Files,
    warnings: &mut Vec<String>,
) -> Option<String> {
    let shown = path.display();
    let (regular, mode) = files.stat(path)?;
    if !regular {
        warnings.push(format!("password file {shown} is not a plain file; not read"));
        return None;
    }
    if mode & 0o077 != 0 {
        warnings.push(format!(
            "password file {shown} has group or world access (mode {mode:04o}); not read: \
             permissions should be u=rw (0600) or less, as libpq requires"
        ));
        return None;
    }
    let file = match files.read(path) {
        Ok(bytes) => Passfile::parse(&bytes),
        Err(err) => {
            warnings.push(format!("cannot read password file {shown}: {err}"));
            return None;
        }
    };
    for line in &file.malformed_lines {
        warnings.push(format!(
            "password file {shown}, line {line}: not host:port:database:user:password; skipped"
        ));
    }
    let list = |key: &str| -> Vec<String> {
        params.get(key).map(|v| v.split(',').map(str::to_owned).collect()).unwrap_or_default()
    };
    let (hosts, addrs, ports) = (list("host"), list("hostaddr"), list("port"));
    let get = |key: &str| params.get(key).map(String::as_str).unwrap_or_default();
    (0..hosts.len().max(addrs.len()).max(1)).find_map(|i| {
        let named = hosts.get(i).filter(|h| !h.is_empty()).or_else(|| addrs.get(i));
        // An empty host or the default socket directory is `localhost` in the file.
        let host = match named.map(String::as_str) {
            None | Some("") => "localhost",
            Some(dir) if dir == socket_dir => "localhost",
            Some(host) => host,
        };
        let port = ports.get(i).or_else(|| ports.first()).filter(|p| !p.is_empty());
        let target = Target {
            host,
            port: port.map_or("5432", String::as_str),
            database: get("dbname"),
            user: get("user"),
        };
        file.lookup(target).map(str::to_owned)
    })
}

/// libpq's default Unix socket directory: Debian's and Red Hat's where it exists, else
/// PostgreSQL's own `/tmp`.
fn default_socket_dir(files: &dyn Files) -> &'static str {
    if files.is_dir(Path::new("/var/run/postgresql")) { "/var/run/postgresql" } else { "/tmp" }
}

fn os_user(env: &dyn Env) -> Option<String> {
    env.var("USER").or_else(|| env.var("LOGNAME"))
}

fn home(env: &dyn Env, name: &str) -> Option<PathBuf> {
    env.var("HOME").map(|home| Path::new(&home).join(name))
}

#[cfg(test)]
mod tests;
