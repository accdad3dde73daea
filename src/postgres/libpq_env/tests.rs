use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::*;

struct FakeEnv(HashMap<&'static str, &'static str>);

impl Env for FakeEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).map(|v| v.to_string())
    }
}

#[derive(Default)]
struct FakeFiles(HashMap<PathBuf, (String, u32)>);

impl FakeFiles {
    fn with(mut self, path: &str, mode: u32, text: &str) -> Self {
        self.0.insert(PathBuf::from(path), (text.to_owned(), mode));
        self
    }
}

impl Files for FakeFiles {
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        self.0
            .get(path)
            .map(|(text, _)| text.clone().into_bytes())
            .ok_or_else(|| std::io::ErrorKind::NotFound.into())
    }

    fn stat(&self, path: &Path) -> Option<(bool, u32)> {
        self.0.get(path).map(|(_, mode)| (true, *mode))
    }

    fn is_dir(&self, _: &Path) -> bool {
        false
    }
}

fn env(vars: &[(&'static str, &'static str)]) -> FakeEnv {
    let mut all: HashMap<_, _> = [("HOME", "/home/me"), ("USER", "me")].into();
    all.extend(vars.iter().copied());
    FakeEnv(all)
}

fn params(resolved: &Resolved) -> Params {
    conn_string::parse(&resolved.conninfo).unwrap()
}

fn get<'a>(params: &'a Params, key: &str) -> Option<&'a str> {
    params.get(key).map(String::as_str)
}

#[test]
fn nothing_given_names_what_was_looked_for() {
    let err =
        resolve(None, &env(&[("PGUSER", "u"), ("PGPASSWORD", "p")]), &FakeFiles::default(), false)
            .unwrap_err();
    let text = err.to_string();
    for wanted in ["--database-url", "PGOUTBOX_DATABASE_URL", "DATABASE_URL", "PGHOST", "PGSERVICE"]
    {
        assert!(text.contains(wanted), "{text}");
    }
}

#[test]
fn the_string_beats_the_environment_which_beats_the_defaults() {
    let vars = env(&[("PGHOST", "envhost"), ("PGPORT", "6000"), ("PGUSER", "envuser")]);
    let r = resolve(Some("postgres://urluser@urlhost/db"), &vars, &FakeFiles::default(), false)
        .unwrap();
    let p = params(&r);
    assert_eq!(get(&p, "host"), Some("urlhost"));
    assert_eq!(get(&p, "port"), Some("6000"), "unset in the URL, so the environment's");
    assert_eq!(get(&p, "user"), Some("urluser"));
    let r = resolve(None, &env(&[("PGDATABASE", "app")]), &FakeFiles::default(), false).unwrap();
    let p = params(&r);
    assert_eq!((get(&p, "user"), get(&p, "dbname")), (Some("me"), Some("app")));
    assert_eq!(get(&p, "host"), Some("/tmp"), "the local socket, as libpq");
    let r = resolve(None, &env(&[("PGHOST", "h")]), &FakeFiles::default(), false).unwrap();
    assert_eq!(get(&params(&r), "dbname"), Some("me"), "the database defaults to the user");
}

#[test]
fn a_service_fills_what_the_string_left_and_beats_the_environment() {
    let files = FakeFiles::default()
        .with("/home/me/.pg_service.conf", 0o644, "[app]\nhost=svchost\nport=7000\ndbname=svcdb\n")
        .with("/etc/pg/pg_service.conf", 0o644, "[sys]\nhost=syshost\n");
    let vars = env(&[("PGSERVICE", "app"), ("PGPORT", "6000"), ("PGUSER", "envuser")]);
    let r = resolve(Some("dbname=mine"), &vars, &files, false).unwrap();
    let p = params(&r);
    assert_eq!(get(&p, "host"), Some("svchost"));
    assert_eq!(get(&p, "port"), Some("7000"), "libpq applies the service before the environment");
    assert_eq!(get(&p, "dbname"), Some("mine"));
    assert_eq!(get(&p, "user"), Some("envuser"));
    assert!(!p.contains_key("service"));
    let vars = env(&[("PGSYSCONFDIR", "/etc/pg")]);
    let r = resolve(Some("service=sys"), &vars, &files, false).unwrap();
    assert_eq!(get(&params(&r), "host"), Some("syshost"), "the system file is searched last");
    let err = resolve(Some("service=nope"), &vars, &files, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "service \"nope\" is not defined in /home/me/.pg_service.conf or /etc/pg/pg_service.conf"
    );
}

#[test]
fn a_service_line_that_does_not_parse_names_its_file_and_line() {
    let files = FakeFiles::default().with("/s.conf", 0o600, "[app]\nhost=h\nport 5432\n");
    let vars = env(&[("PGSERVICEFILE", "/s.conf"), ("PGSERVICE", "app")]);
    let err = resolve(None, &vars, &files, false).unwrap_err();
    assert_eq!(err.to_string(), "service file /s.conf, line 3: expected key=value");
}

#[test]
fn the_password_comes_from_the_string_then_the_environment_then_the_passfile() {
    let files = FakeFiles::default().with("/home/me/.pgpass", 0o600, "h:5432:d:u:fromfile\n");
    let given = |url: &str, vars: &[(&'static str, &'static str)]| {
        resolve(Some(url), &env(vars), &files, false).unwrap().password
    };
    assert_eq!(
        given("host=h dbname=d user=u password=s", &[("PGPASSWORD", "e")]).as_deref(),
        Some("s")
    );
    assert_eq!(given("host=h dbname=d user=u", &[("PGPASSWORD", "e")]).as_deref(), Some("e"));
    assert_eq!(given("host=h dbname=d user=u", &[]).as_deref(), Some("fromfile"));
    assert_eq!(given("host=h dbname=d user=other", &[]), None);
    let r = resolve(Some("host=h dbname=d user=u"), &env(&[]), &files, true).unwrap();
    assert_eq!(r.password, None, "a password command makes the file unread");
    assert!(!r.conninfo.contains("fromfile"));
}

#[test]
fn the_passfile_matches_later_hosts_the_default_socket_and_its_own_path() {
    let files =
        FakeFiles::default().with("/pw", 0o400, "b:6000:d:u:second\nlocalhost:5432:d:u:local\n");
    let vars = env(&[("PGPASSFILE", "/pw")]);
    let r = resolve(Some("host=a,b port=5999,6000 dbname=d user=u"), &vars, &files, false).unwrap();
    assert_eq!(r.password.as_deref(), Some("second"));
    let r = resolve(Some("dbname=d user=u"), &vars, &files, false).unwrap();
    assert_eq!(r.password.as_deref(), Some("local"), "the default socket is localhost");
    let r = resolve(Some("dbname=d user=u passfile=/none"), &vars, &files, false).unwrap();
    assert_eq!(r.password, None, "the passfile key beats PGPASSFILE");
}

#[test]
fn a_passfile_others_can_read_is_ignored_with_a_warning() {
    let files = FakeFiles::default().with("/home/me/.pgpass", 0o644, "*:*:*:*:secret\nbroken\n");
    let r = resolve(Some("host=h"), &env(&[]), &files, false).unwrap();
    assert_eq!(r.password, None);
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains("/home/me/.pgpass has group or world access"),
        "{:?}",
        r.warnings
    );
    let files = FakeFiles::default().with("/home/me/.pgpass", 0o600, "broken\n*:*:*:*:secret\n");
    let r = resolve(Some("host=h"), &env(&[]), &files, false).unwrap();
    assert_eq!(r.password.as_deref(), Some("secret"));
    assert_eq!(
        r.warnings,
        vec![
            "password file /home/me/.pgpass, line 1: not host:port:database:user:password; skipped"
        ]
    );
}

#[test]
fn libpq_variables_reach_the_connection_string() {
    let vars = env(&[
        ("PGHOSTADDR", "127.0.0.1"),
        ("PGSSLMODE", "require"),
        ("PGAPPNAME", "my app"),
        ("PGCONNECT_TIMEOUT", "3"),
        ("PGTARGETSESSIONATTRS", "read-write"),
    ]);
    let r = resolve(None, &vars, &FakeFiles::default(), false).unwrap();
    let p = params(&r);
    assert_eq!(get(&p, "hostaddr"), Some("127.0.0.1"));
    assert!(!p.contains_key("host"), "a hostaddr needs no default host");
    assert_eq!(get(&p, "sslmode"), Some("require"));
    assert_eq!(get(&p, "application_name"), Some("my app"));
    assert_eq!(get(&p, "connect_timeout"), Some("3"));
    assert_eq!(get(&p, "target_session_attrs"), Some("read-write"));
}
