//! Which PostgreSQL the tests run: the version matrix.
//!
//! - `PGOUTBOX_PG_BINDIR=<dir>`: those server binaries, whatever their version.
//! - `PGOUTBOX_TEST_PG=<major>` (14 to 18): Debian's `/usr/lib/postgresql/<major>/bin` when
//!   installed, else the binaries `scripts/fetch-postgres.sh <major>` cached in
//!   `${PGOUTBOX_PG_CACHE:-/var/tmp/pgoutbox-postgres}/<major>/`.
//! - Neither: `pg_config --bindir`, the newest `/usr/lib/postgresql/*/bin`, then PATH
//!   (Debian's 15 on these machines).
//!
//! The cached builds ship their own shared libraries in `<major>/lib`, so every server
//! process gets `LD_LIBRARY_PATH`. They have no `psql`: the client comes from Debian's
//! packages (any psql talks to any of these servers for what the tests ask).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The server binaries in use, found once per test binary.
pub struct ServerBin {
    pub bin: PathBuf,
    /// Set as `LD_LIBRARY_PATH` for initdb, pg_ctl and postgres when present.
    pub lib: Option<PathBuf>,
    pub psql: PathBuf,
    pub major: u32,
}

pub fn server() -> &'static ServerBin {
    static SERVER: OnceLock<ServerBin> = OnceLock::new();
    SERVER.get_or_init(|| {
        let bin = server_bin_dir();
        let lib = bin.parent().map(|p| p.join("lib")).filter(|l| l.join("libpq.so.5").exists());
        let mut version = Command::new(bin.join("postgres"));
        version.arg("--version");
        if let Some(lib) = &lib {
            version.env("LD_LIBRARY_PATH", lib);
        }
        let out = version.output().unwrap_or_else(|e| panic!("{}/postgres: {e}", bin.display()));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let major = text
            .split_whitespace()
            .find_map(|w| w.split('.').next()?.parse::<u32>().ok())
            .unwrap_or_else(|| panic!("no version in `postgres --version`: {text}"));
        let psql = psql_path(&bin);
        eprintln!("PostgreSQL under test: {} ({})", text.trim(), bin.display());
        ServerBin { bin, lib, psql, major }
    })
}

/// The major version the tests run against (e.g. to test `--failover` on 17 and its
/// refusal below).
pub fn major() -> u32 {
    server().major
}

impl ServerBin {
    /// A command for one of the server binaries, with the libraries it needs.
    pub fn command(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(name));
        if let Some(lib) = &self.lib {
            cmd.env("LD_LIBRARY_PATH", lib);
        }
        cmd
    }
}

fn has_initdb(dir: &Path) -> bool {
    dir.join("initdb").is_file()
}

fn server_bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("PGOUTBOX_PG_BINDIR") {
        return PathBuf::from(dir);
    }
    if let Ok(major) = std::env::var("PGOUTBOX_TEST_PG") {
        let debian = PathBuf::from(format!("/usr/lib/postgresql/{major}/bin"));
        if has_initdb(&debian) {
            return debian;
        }
        let cache = std::env::var("PGOUTBOX_PG_CACHE")
            .unwrap_or_else(|_| "/var/tmp/pgoutbox-postgres".to_owned());
        let cached = Path::new(&cache).join(&major).join("bin");
        assert!(
            has_initdb(&cached),
            "PGOUTBOX_TEST_PG={major}: no PostgreSQL {major} in {}; run scripts/fetch-postgres.sh {major}",
            cached.display()
        );
        return cached;
    }
    debian_bin_dir().unwrap_or_else(|| {
        panic!("PostgreSQL server binaries not found: install them with `apt-get install -y postgresql`, set PGOUTBOX_PG_BINDIR, or PGOUTBOX_TEST_PG=<major> after scripts/fetch-postgres.sh")
    })
}

/// `pg_config --bindir`, the newest `/usr/lib/postgresql/*/bin`, then PATH.
fn debian_bin_dir() -> Option<PathBuf> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_initdb(&dir) {
            return Some(dir);
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| has_initdb(d))
        .collect();
    versions.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    if let Some(dir) = versions.pop() {
        return Some(dir);
    }
    std::env::var_os("PATH").iter().flat_map(std::env::split_paths).find(|d| has_initdb(d))
}

/// psql beside the server when it has one, else Debian's.
fn psql_path(server_bin: &Path) -> PathBuf {
    if server_bin.join("psql").is_file() {
        return server_bin.join("psql");
    }
    debian_bin_dir()
        .map(|d| d.join("psql"))
        .filter(|p| p.is_file())
        .or_else(|| {
            std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths)
                .map(|d| d.join("psql"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("psql not found: apt-get install -y postgresql-client"))
}
