//! A throwaway `nats-server -js` on free loopback ports, with its own store directory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::lazyfs::{Journal, LazyFs};
use super::{free_port, http_get};

pub struct Nats {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    monitor_port: u16,
    extra: Vec<String>,
    jetstream: bool,
    child: Option<Child>,
    /// Stopped by [`Nats::pause`]: resumed before it is stopped or killed.
    paused: bool,
    /// The store on a lazy filesystem ([`Nats::start_on_lazy_disk`]).
    disk: Option<LazyFs>,
}

impl Nats {
    pub fn start() -> Nats {
        Nats::start_with_args(&[])
    }

    /// Extra arguments are appended, e.g. `["-c", "path/to/nats.conf"]`.
    pub fn start_with_args(extra: &[&str]) -> Nats {
        Nats::launch(None, true, extra)
    }

    /// With its store on a lazy filesystem ([`LazyFs`]): what nats-server did not sync is
    /// lost at [`Nats::power_loss`], as a disk loses it. `jetstream` holds lines of the
    /// config file's `jetstream { }` block, e.g. `sync_interval: "1s"` (by default the server
    /// syncs every 2 minutes; `sync_interval: always` at each write).
    pub fn start_on_lazy_disk(jetstream: &str) -> Nats {
        Nats::start_on_lazy_disk_with_args(&[], jetstream)
    }

    /// The same with extra arguments (a cluster's).
    pub fn start_on_lazy_disk_with_args(extra: &[&str], jetstream: &str) -> Nats {
        Nats::launch_on(None, true, extra, Some(jetstream))
    }

    /// On a given port, e.g. one pgoutbox was already told to use.
    pub fn start_on_port(port: u16) -> Nats {
        Nats::launch(Some(port), true, &[])
    }

    /// Core NATS only: JetStream disabled.
    pub fn start_without_jetstream() -> Nats {
        Nats::launch(None, false, &[])
    }

    fn launch(port: Option<u16>, jetstream: bool, extra: &[&str]) -> Nats {
        Nats::launch_on(port, jetstream, extra, None)
    }

    /// `lazy`: the store on a lazy disk, with these lines in the config's `jetstream { }`.
    fn launch_on(port: Option<u16>, jetstream: bool, extra: &[&str], lazy: Option<&str>) -> Nats {
        let dir = tempfile::Builder::new().prefix("pgoutbox-nats-").tempdir().expect("temp dir");
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let disk = lazy.map(|conf| {
            let store = dir.path().join("store");
            std::fs::create_dir(&store).expect("the store's mount point");
            let file = dir.path().join("nats.conf");
            std::fs::write(&file, format!("jetstream {{\n{conf}\n}}\n")).expect("nats.conf");
            extra.extend(["-c".to_owned(), file.to_string_lossy().into_owned()]);
            LazyFs::mount(&store, Journal::Ordered)
        });
        let mut nats = Nats {
            dir,
            bin: server_binary(),
            port: 0,
            monitor_port: 0,
            extra,
            jetstream,
            child: None,
            paused: false,
            disk,
        };
        for _ in 0..5 {
            nats.port = port.unwrap_or_else(free_port);
            nats.monitor_port = free_port();
            if nats.try_start() {
                return nats;
            }
        }
        panic!("nats-server did not start; log:\n{}", nats.log());
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn monitor_port(&self) -> u16 {
        self.monitor_port
    }

    /// The server's release as (major, minor), from its monitor.
    pub fn release(&self) -> (u32, u32) {
        let (_, varz) = http_get(self.monitor_port, "/varz").expect("the monitor answers");
        let varz: serde_json::Value = serde_json::from_str(&varz).expect("/varz is JSON");
        let version = varz["version"].as_str().expect("/varz names the version");
        let mut parts = version.split('.').map(|p| p.parse::<u32>().expect("a version number"));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Graceful stop (SIGTERM), waiting for the process to exit.
    pub fn stop(&mut self) {
        self.resume();
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        self.resume();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the server freezes with what is in its sockets, as in a long GC pause or a
    /// descheduled VM, and runs it on [`Nats::resume`] (SIGCONT).
    pub fn pause(&mut self) {
        self.signal("-STOP");
        self.paused = true;
    }

    /// Does nothing unless paused: a stopped server would not act on SIGTERM.
    pub fn resume(&mut self) {
        if std::mem::take(&mut self.paused) {
            self.signal("-CONT");
        }
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let sent = Command::new("kill").arg(signal).arg(child.id().to_string()).status();
            let sent = sent.is_ok_and(|s| s.success());
            assert!(sent || std::thread::panicking(), "kill {signal} nats-server");
        }
    }

    /// A power loss of a server on a lazy disk: SIGKILL, what the disk does not hold lost,
    /// the server started again on the same store. Returns the bytes and names lost.
    pub fn power_loss(&mut self) -> (u64, usize) {
        let lost = self.lose_power();
        self.start_again();
        lost
    }

    /// The same, not started again (a cluster loses power as a whole).
    pub fn lose_power(&mut self) -> (u64, usize) {
        self.kill();
        self.lazy_disk().lose_power()
    }

    /// A power loss at which what was written more than `age` ago had reached the disk (the
    /// kernel writes back what stayed dirty for 30 s, `dirty_expire_centisecs`); not
    /// started again.
    pub fn lose_power_keeping_older_than(&mut self, age: Duration) -> (u64, usize) {
        self.kill();
        self.lazy_disk().lose_power_keeping_older_than(age)
    }

    /// Everything the server wrote so far reaches the lazy disk, as its own sync of every
    /// file or the kernel's writeback would take it.
    pub fn write_back(&self) {
        self.disk.as_ref().expect("a store on a lazy disk").write_back();
    }

    fn lazy_disk(&mut self) -> &mut LazyFs {
        self.disk.as_mut().expect("a store on a lazy disk: Nats::start_on_lazy_disk")
    }

    /// A power loss cut by hand, of a server that last synced each stream's blocks at its
    /// own moment (as `sync_interval` does): one SIGKILL, then each stream's messages
    /// stored within its own `unsynced` cut from its blocks at a record's boundary (blocks
    /// wholly after it removed) and the other files of its `msgs/` directory removed; not
    /// started again. Returns how many records were cut. A lazy disk
    /// ([`Nats::start_on_lazy_disk`]) loses writes as a disk does; this cut is for a loss
    /// it cannot give, one timer per stream.
    pub fn lose_stored_within_each(&mut self, streams: &[(&str, Duration)]) -> u64 {
        self.kill();
        let now = unix_nanos();
        let cut = streams.iter().map(|(stream, unsynced)| {
            cut_records_since(&self.message_blocks(stream), now - unsynced.as_nanos())
        });
        cut.sum()
    }

    /// The same power loss for the whole store, one moment for every stream: every
    /// stream's blocks and every raft log's (a replicated stream's log would otherwise
    /// bring back what its blocks lost).
    pub fn lose_everything_stored_within(&mut self, unsynced: Duration) -> u64 {
        self.kill();
        // Taken once: a moment read per stream moves on while the blocks before are read,
        // and would cut an object's chunks but keep the pointer stored after them.
        let synced = unix_nanos() - unsynced.as_nanos();
        let mut cut = 0;
        let mut dirs = vec![self.dir.path().join("store").join("jetstream")];
        while let Some(dir) = dirs.pop() {
            let entries = std::fs::read_dir(&dir).expect("a directory of the store");
            let paths: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
            if dir.file_name().is_some_and(|name| name == "msgs") {
                cut += cut_records_since(&blocks_of(&dir), synced);
            } else {
                dirs.extend(paths.into_iter().filter(|p| p.is_dir()));
            }
        }
        cut
    }

    /// The stream's message blocks, oldest first; the other files of its `msgs/` directory
    /// (indexes, state: the server rebuilds them from the blocks) removed.
    fn message_blocks(&self, stream: &str) -> Vec<(u64, PathBuf)> {
        let accounts = self.dir.path().join("store").join("jetstream");
        let msgs = std::fs::read_dir(&accounts)
            .expect("the JetStream store")
            .filter_map(|account| {
                Some(account.ok()?.path().join("streams").join(stream).join("msgs"))
            })
            .find(|msgs| msgs.is_dir())
            .unwrap_or_else(|| panic!("no message blocks of stream {stream} under {accounts:?}"));
        blocks_of(&msgs)
    }

    /// Starts again on the same ports with the same store.
    pub fn start_again(&mut self) {
        assert!(self.try_start(), "nats-server did not restart; log:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
    }

    fn try_start(&mut self) -> bool {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("nats.log"))
            .expect("nats log file");
        let mut cmd = Command::new(&self.bin);
        if self.jetstream {
            cmd.arg("-js");
        }
        let child = cmd
            .args(["-a", "127.0.0.1"])
            .args(["-p", &self.port.to_string(), "-m", &self.monitor_port.to_string()])
            .arg("--store_dir")
            .arg(self.dir.path().join("store"))
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_exited))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return false;
            }
            let monitor_ready = match self.jetstream {
                true => http_get(self.monitor_port, "/jsz")
                    .is_some_and(|(code, b)| code == 200 && b.contains("\"config\"")),
                false => http_get(self.monitor_port, "/varz").is_some_and(|(code, _)| code == 200),
            };
            // The monitor answers before the client port listens: in 8 of 20 starts, by up
            // to 10 ms here, and a test client once connected in that gap and was refused.
            if monitor_ready && greets_clients(self.port) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        self.kill();
        false
    }
}

/// Whether a client connecting to `port` is greeted with the server's `INFO`.
fn greets_clients(port: u16) -> bool {
    use std::io::{BufRead, BufReader};
    let Ok(stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    if stream.set_read_timeout(Some(Duration::from_secs(2))).is_err() {
        return false;
    }
    let mut greeting = String::new();
    BufReader::new(stream).read_line(&mut greeting).is_ok() && greeting.starts_with("INFO ")
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
        // Unmounted before the store's directory is removed.
        drop(self.disk.take());
    }
}

/// $PGOUTBOX_NATS_SERVER; $PGOUTBOX_TEST_NATS=<minor> from the cache of
/// `scripts/fetch-nats.sh`; /usr/sbin/nats-server (Debian's 2.9), then PATH.
pub fn server_binary() -> PathBuf {
    if let Ok(path) = std::env::var("PGOUTBOX_NATS_SERVER") {
        return PathBuf::from(path);
    }
    if let Some(minor) = std::env::var("PGOUTBOX_TEST_NATS").ok().filter(|m| !m.is_empty()) {
        let cache = std::env::var("PGOUTBOX_NATS_CACHE")
            .unwrap_or_else(|_| "/var/tmp/pgoutbox-nats".to_owned());
        let bin = PathBuf::from(cache).join(&minor).join("nats-server");
        assert!(
            bin.is_file(),
            "PGOUTBOX_TEST_NATS={minor}: no {} (run scripts/fetch-nats.sh {minor})",
            bin.display()
        );
        return bin;
    }
    let system = PathBuf::from("/usr/sbin/nats-server");
    if system.is_file() {
        return system;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("nats-server not found: install it with `apt-get install -y nats-server` or set PGOUTBOX_NATS_SERVER")
        })
}

/// The message blocks of a `msgs/` directory, oldest first; its other files (indexes,
/// state: the server rebuilds them from the blocks) removed.
fn blocks_of(msgs: &std::path::Path) -> Vec<(u64, PathBuf)> {
    let block_number = |path: &std::path::Path| -> Option<u64> {
        path.file_name()?.to_str()?.strip_suffix(".blk")?.parse().ok()
    };
    let mut blocks = Vec::new();
    for file in std::fs::read_dir(msgs).expect("a msgs directory") {
        let file = file.expect("a file of msgs/").path();
        match block_number(&file) {
            Some(number) => blocks.push((number, file)),
            None => std::fs::remove_file(&file).expect("remove an index of msgs/"),
        }
    }
    blocks.sort();
    blocks
}

/// Cuts from `blocks` every record stored after `synced` (Unix nanoseconds), at a record's
/// boundary (a block wholly after it removed); how many records were cut.
fn cut_records_since(blocks: &[(u64, PathBuf)], synced: u128) -> u64 {
    let mut cut = 0;
    for (_, block) in blocks {
        let bytes = std::fs::read(block).expect("read a message block");
        let records = records(&bytes)
            .unwrap_or_else(|at| panic!("{block:?}: no message record at byte {at}"));
        let after: Vec<u64> =
            records.iter().filter(|r| r.stored_at_nanos > synced).map(|r| r.at).collect();
        match after.first() {
            Some(0) => std::fs::remove_file(block).expect("remove a message block"),
            Some(&first) => cut_block(block, first),
            None => {}
        }
        cut += after.len() as u64;
    }
    cut
}

fn unix_nanos() -> u128 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |d| d.as_nanos())
}

/// Cuts a message block to its first `len` bytes.
fn cut_block(block: &std::path::Path, len: u64) {
    let file = std::fs::OpenOptions::new().write(true).open(block).expect("open the block");
    file.set_len(len).expect("cut the block");
}

/// A record of a message block: where it starts and when the server stored it.
struct Record {
    at: u64,
    stored_at_nanos: u128,
}

/// The records of an unencrypted, uncompressed message block (nats-server's
/// `filestore.go`, the same from 2.9 to 2.15): each is a 22-byte header (length with the
/// has-headers bit 31, sequence, Unix nanoseconds, subject length), the subject, the
/// headers and body, an 8-byte hash; the length counts all of it. Err(offset) where a
/// record makes no sense.
fn records(block: &[u8]) -> Result<Vec<Record>, usize> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < block.len() {
        let header = block.get(at..at + 22).ok_or(at)?;
        let len = u32::from_le_bytes(header[0..4].try_into().map_err(|_| at)?) & !(1 << 31);
        let nanos = i64::from_le_bytes(header[12..20].try_into().map_err(|_| at)?);
        let len = len as usize;
        if len < 30 || at + len > block.len() {
            return Err(at);
        }
        records.push(Record { at: at as u64, stored_at_nanos: nanos.max(0) as u128 });
        at += len;
    }
    Ok(records)
}
