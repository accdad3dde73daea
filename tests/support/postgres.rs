//! A throwaway PostgreSQL cluster with `wal_level = logical`, in its own temp dir, on a free
//! loopback port. Postgres refuses to run as root, so when the tests run as root the cluster
//! runs as the `postgres` system user and its directory is handed to that user.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::free_port;
use super::pg_bin::server;

pub struct Postgres {
    dir: tempfile::TempDir,
    port: u16,
    running: bool,
}

#[derive(Default)]
pub struct PostgresBuilder {
    conf: Vec<String>,
    hba: Vec<String>,
}

impl PostgresBuilder {
    /// A line appended to postgresql.conf.
    pub fn conf(mut self, line: &str) -> Self {
        self.conf.push(line.to_owned());
        self
    }

    /// A pg_hba.conf line placed before the default trust lines (first match wins).
    pub fn hba(mut self, line: &str) -> Self {
        self.hba.push(line.to_owned());
        self
    }

    pub fn start(self) -> Postgres {
        let dir = cluster_dir();
        let data = dir.path().join("data");
        let out = as_postgres(server().command("initdb"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .expect("run initdb");
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        let mut conf = vec![
            "wal_level = logical".to_owned(),
            "max_wal_senders = 10".to_owned(),
            "max_replication_slots = 10".to_owned(),
            "fsync = off".to_owned(),
            "full_page_writes = off".to_owned(),
            "shared_buffers = 32MB".to_owned(),
            "max_connections = 50".to_owned(),
            "listen_addresses = '127.0.0.1'".to_owned(),
            format!("unix_socket_directories = '{}'", dir.path().display()),
        ];
        conf.extend(self.conf);
        append(&data.join("postgresql.conf"), &conf.join("\n"));
        if !self.hba.is_empty() {
            let path = data.join("pg_hba.conf");
            let default = std::fs::read_to_string(&path).expect("read pg_hba.conf");
            std::fs::write(&path, format!("{}\n{default}", self.hba.join("\n")))
                .expect("write hba");
        }
        // Another process may grab the port between probing and binding: start_on tries a few.
        Postgres::start_on(dir)
    }
}

impl Postgres {
    /// A cluster on data already in `dir/data` (a copy made by `standby`), started on a
    /// free port.
    pub(super) fn start_on(dir: tempfile::TempDir) -> Postgres {
        let mut pg = Postgres { dir, port: 0, running: false };
        for _ in 0..5 {
            pg.port = free_port();
            if pg.try_start() {
                return pg;
            }
        }
        panic!("PostgreSQL did not start; log:\n{}", pg.log());
    }

    pub fn start() -> Postgres {
        Postgres::builder().start()
    }

    pub fn builder() -> PostgresBuilder {
        PostgresBuilder::default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn url(&self) -> String {
        self.url_for("postgres", None, "postgres")
    }

    pub fn url_for(&self, user: &str, password: Option<&str>, db: &str) -> String {
        let auth = match password {
            Some(p) => format!("{user}:{p}"),
            None => user.to_owned(),
        };
        format!("postgres://{auth}@127.0.0.1:{}/{db}", self.port)
    }

    pub fn psql(&self, sql: &str) -> String {
        self.psql_db("postgres", sql)
    }

    pub fn psql_db(&self, db: &str, sql: &str) -> String {
        self.run_psql(db, sql).unwrap_or_else(|err| panic!("psql failed: {err}\nSQL: {sql}"))
    }

    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        self.run_psql("postgres", sql)
    }

    pub fn try_psql_db(&self, db: &str, sql: &str) -> Result<String, String> {
        self.run_psql(db, sql)
    }

    fn run_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        run_psql(self.port, db, sql)
    }

    /// Runs `sql` on another thread (e.g. a writer while the test kills things).
    pub fn psql_in_background(
        &self,
        sql: String,
    ) -> std::thread::JoinHandle<Result<String, String>> {
        let port = self.port;
        std::thread::spawn(move || run_psql(port, "postgres", &sql))
    }

    /// A psql runner that a thread can own.
    pub fn client_handle(&self) -> Psql {
        Psql { port: self.port }
    }

    /// Commits numbered rows (see [`super::numbered_rows`]) from `from` on, alternating 1-row
    /// and 100-row transactions with `pause_seconds` after each, until [`Writer::finish`].
    pub fn start_writer(&self, from: usize, pause_seconds: f64) -> Writer {
        let psql = self.client_handle();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut next = from;
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let sql = super::mixed_rows(next, next + 101, 100, pause_seconds);
                psql.try_psql(&sql)?;
                next += 101;
            }
            Ok(next)
        });
        Writer { stop, handle }
    }

    /// `pg_ctl stop -m fast|immediate`.
    pub fn stop(&mut self, mode: &str) {
        let out = self.pg_ctl(&["stop", "-w", "-m", mode]);
        assert!(out.status.success(), "pg_ctl stop: {}", String::from_utf8_lossy(&out.stderr));
        self.running = false;
    }

    /// Starts again on the same port with the same data.
    pub fn start_again(&mut self) {
        assert!(self.try_start(), "PostgreSQL did not restart; log:\n{}", self.log());
    }

    pub fn restart(&mut self, mode: &str) {
        self.stop(mode);
        self.start_again();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn try_start(&mut self) -> bool {
        let options = format!("-p {}", self.port);
        let log = self.dir.path().join("server.log");
        let out =
            self.pg_ctl(&["start", "-w", "-t", "30", "-o", &options, "-l", &log.to_string_lossy()]);
        self.running = out.status.success();
        self.running
    }

    pub(super) fn pg_ctl(&self, args: &[&str]) -> Output {
        as_postgres(server().command("pg_ctl"))
            .arg("-D")
            .arg(self.data_dir())
            .args(args)
            .output()
            .expect("run pg_ctl")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.running {
            let _ = self.pg_ctl(&["stop", "-w", "-m", "immediate"]);
        }
    }
}

/// Runs psql against one server, from any thread.
pub struct Psql {
    port: u16,
}

impl Psql {
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        run_psql(self.port, "postgres", sql)
    }
}

/// A background writer of numbered rows; see [`Postgres::start_writer`].
pub struct Writer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Result<usize, String>>,
}

impl Writer {
    /// Stops after the transactions under way; returns the number after the last row written.
    pub fn finish(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        match self.handle.join() {
            Ok(Ok(next)) => next,
            Ok(Err(err)) => panic!("the writer's inserts failed: {err}"),
            Err(_) => panic!("the writer thread panicked"),
        }
    }
}

fn run_psql(port: u16, db: &str, sql: &str) -> Result<String, String> {
    use std::io::Write;
    use std::process::Stdio;
    let out = Command::new(&server().psql)
        .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", "postgres"])
        .args(["-p", &port.to_string(), "-d", db, "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().expect("stdin").write_all(sql.as_bytes())?;
            child.wait_with_output()
        })
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

pub(super) fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).expect("open config");
    writeln!(file, "\n{text}").expect("write config");
}

/// A temp dir for a cluster, owned by the user the cluster runs as.
pub(super) fn cluster_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("pgoutbox-pg-").tempdir().expect("temp dir");
    give_to_postgres(dir.path());
    dir
}

/// Hands `path` to the user the cluster runs as (when the tests run as root).
pub fn give_to_postgres(path: &Path) {
    if let Some((uid, gid)) = postgres_user() {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown to postgres");
    }
}

/// The `postgres` user's uid and gid when we run as root (so must switch), else `None`.
fn postgres_user() -> Option<(u32, u32)> {
    let euid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&euid.stdout).trim() != "0" {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let line = passwd.lines().find(|l| l.starts_with("postgres:")).expect(
        "no `postgres` system user; install PostgreSQL with `apt-get install -y postgresql`",
    );
    let fields: Vec<&str> = line.split(':').collect();
    Some((fields[2].parse().expect("uid"), fields[3].parse().expect("gid")))
}

fn as_postgres(mut cmd: Command) -> Command {
    if let Some((uid, gid)) = postgres_user() {
        cmd.uid(uid).gid(gid);
    }
    cmd
}
