//! Runs the real `pgoutbox` binary against the throwaway servers.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{Nats, Postgres};

/// A running `pgoutbox` process; killed on drop. Its stderr (the log) goes to a file.
pub struct Pgoutbox {
    child: Child,
    http_port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// `target/<profile>/examples/consumer`, which `scripts/test.sh` builds first (`cargo test
/// --all-targets` builds examples only as test harnesses).
pub fn example_consumer_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    let binary = profile.join("examples").join("consumer");
    assert!(
        binary.is_file(),
        "no {binary:?}: build it with `cargo build --example consumer` \
         (scripts/test.sh does)"
    );
    binary
}

/// The binary with the servers' URLs set and no PGOUTBOX_* settings, nor libpq's PG*
/// variables, nor OTEL_* ones, inherited.
pub fn command(pg: &Postgres, nats: &Nats) -> Command {
    command_of(std::path::Path::new(env!("CARGO_BIN_EXE_pgoutbox")), pg, nats)
}

/// [`command`] of another build of pgoutbox (an earlier release, for the upgrade test).
pub fn command_of(binary: &std::path::Path, pg: &Postgres, nats: &Nats) -> Command {
    let mut cmd = Command::new(binary);
    for (key, _) in std::env::vars() {
        let ours = key.starts_with("PG") || key.starts_with("OTEL_");
        if ours || key == "DATABASE_URL" || key == "NATS_URL" {
            cmd.env_remove(key);
        }
    }
    cmd.env("PGOUTBOX_DATABASE_URL", pg.url())
        .env("PGOUTBOX_NATS_URL", nats.url())
        .env("RUST_LOG", "info,pgoutbox=debug")
        .env("PGOUTBOX_HTTP_ADDR", format!("127.0.0.1:{}", super::free_port()));
    cmd
}

impl Pgoutbox {
    /// `pgoutbox run` plus `args`.
    pub fn run(pg: &Postgres, nats: &Nats, args: &[&str]) -> Pgoutbox {
        let mut cmd = command(pg, nats);
        cmd.arg("run").args(args);
        Pgoutbox::spawn(cmd)
    }

    /// `pgoutbox run` reaching NATS at `nats_url` (a fault proxy in front of `nats`), with
    /// no durability horizon: the fault tests check that the slot is never confirmed past
    /// an unstored row (the strictest case is a slot confirmed as soon as rows are
    /// acknowledged) and that it catches up within seconds, not 150 s.
    pub fn run_via(pg: &Postgres, nats: &Nats, nats_url: &str) -> Pgoutbox {
        let mut cmd = command(pg, nats);
        cmd.env("PGOUTBOX_NATS_URL", nats_url).env("PGOUTBOX_DURABILITY_HORIZON", "0s");
        cmd.arg("run");
        Pgoutbox::spawn(cmd)
    }

    pub fn spawn(mut cmd: Command) -> Pgoutbox {
        let http_port = cmd
            .get_envs()
            .find(|(k, _)| *k == "PGOUTBOX_HTTP_ADDR")
            .and_then(|(_, v)| v?.to_str()?.rsplit(':').next()?.parse().ok())
            .unwrap_or(0);
        let dir = tempfile::tempdir().expect("temp dir for the pgoutbox log");
        let log = dir.path().join("pgoutbox.log");
        let file = File::create(&log).expect("create pgoutbox log");
        let child =
            cmd.stdout(Stdio::null()).stderr(file).spawn().expect("start the pgoutbox binary");
        Pgoutbox { child, http_port, log, _dir: dir }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `error:` line it printed (the one line a stop says why in), or "".
    pub fn error_line(&self) -> String {
        let log = self.log();
        log.lines().rfind(|l| l.starts_with("error:")).unwrap_or_default().to_owned()
    }

    /// The port of its HTTP endpoints (from the PGOUTBOX_HTTP_ADDR it was started with).
    pub fn http_port(&self) -> u16 {
        self.http_port
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running (it has not exited or crashed).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Asks for a graceful stop.
    pub fn sigterm(&self) {
        signal(self.child.id(), "TERM");
    }

    /// SIGSTOP: frozen, as in a descheduled VM, until [`Pgoutbox::resume`].
    pub fn pause(&self) {
        signal(self.child.id(), "STOP");
    }

    pub fn resume(&self) {
        signal(self.child.id(), "CONT");
    }

    /// Kills without warning, as a crash would.
    pub fn kill9(&mut self) {
        signal(self.child.id(), "KILL");
        let _ = self.child.wait();
    }

    /// Waits for the process to end, failing the test after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for pgoutbox") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "pgoutbox did not exit in {timeout:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// On a nats-server older than `since`: asserts that pgoutbox refused to start with
    /// `line` and answers true (the test ends there). On a newer one: false.
    pub fn refused_before(&mut self, nats: &Nats, since: (u32, u32), line: &str) -> bool {
        if nats.release() >= since {
            return false;
        }
        let status = self.wait_exit(Duration::from_secs(30));
        assert!(!status.success(), "{}", self.log());
        assert!(self.log().contains(line), "one line saying what to do:\n{}", self.log());
        true
    }
}

impl Drop for Pgoutbox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- pgoutbox log ---\n{}", self.log());
        }
    }
}

fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status();
}

/// The lines of a `--help` text under `heading`: indented or blank, up to the next heading.
pub fn help_section<'a>(help: &'a str, heading: &str) -> &'a str {
    let rest = help.split(&format!("\n{heading}:\n")).nth(1).unwrap_or_default();
    let lines = rest.split_inclusive('\n').take_while(|l| l.starts_with(' ') || *l == "\n");
    &rest[..lines.map(str::len).sum::<usize>()]
}
