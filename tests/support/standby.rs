//! A physical standby of a throwaway cluster, made with only the server binaries (the
//! cached builds of the version matrix have no pg_basebackup): the low-level backup API
//! (`pg_backup_start`, copy the data directory, `pg_backup_stop`, write its
//! `backup_label`), then `standby.signal` and `primary_conninfo`.

use super::Postgres;
use super::pg_bin;
use super::postgres::{append, cluster_dir, give_to_postgres};

impl Postgres {
    /// Starts a streaming standby of this cluster with `conf` appended to its
    /// postgresql.conf (e.g. `primary_slot_name`, `hot_standby_feedback = on`), and waits
    /// until it replays what the primary had written when it was made.
    pub fn start_standby(&self, conf: &[&str]) -> Postgres {
        let dir = cluster_dir();
        let data = dir.path().join("data");
        let (start, stop) = if pg_bin::major() >= 15 {
            ("pg_backup_start('pgoutbox-test', true)", "pg_backup_stop(false)")
        } else {
            ("pg_start_backup('pgoutbox-test', true, false)", "pg_stop_backup(false, false)")
        };
        // One session: the backup must stop in the session that started it. The copy runs
        // from psql (`\!`) in between; the slots of the primary are not copied (a standby
        // gets them only by synchronisation).
        let script = format!(
            "SELECT {start};\n\\! cp -a {src} {dst} && rm -rf {dst}/pg_replslot/* {dst}/postmaster.pid {dst}/postmaster.opts\n\\o {dst}/backup_label\nSELECT labelfile FROM {stop};\n\\o\nSELECT pg_current_wal_lsn();\n",
            src = self.data_dir().display(),
            dst = data.display(),
        );
        let out = self.psql(&script);
        let end_of_backup = out.lines().last().expect("the primary's WAL position").to_owned();
        give_to_postgres(&data.join("backup_label"));
        std::fs::write(data.join("standby.signal"), "").expect("write standby.signal");
        give_to_postgres(&data.join("standby.signal"));
        let mut lines = vec![
            format!("unix_socket_directories = '{}'", dir.path().display()),
            format!(
                "primary_conninfo = 'host=127.0.0.1 port={} user=postgres dbname=postgres \
                 application_name=standby'",
                self.port()
            ),
            "hot_standby = on".to_owned(),
        ];
        lines.extend(conf.iter().map(|l| (*l).to_owned()));
        append(&data.join("postgresql.conf"), &lines.join("\n"));
        let standby = Postgres::start_on(dir);
        standby.wait_replayed(&end_of_backup);
        standby
    }

    /// `pg_ctl promote`: a standby leaves recovery and accepts writes (returns at once;
    /// poll `pg_is_in_recovery()` for the end).
    pub fn promote(&self) {
        let out = self.pg_ctl(&["promote", "-W"]);
        assert!(out.status.success(), "pg_ctl promote: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Waits until this standby replayed WAL up to `lsn` (30 s).
    pub fn wait_replayed(&self, lsn: &str) {
        let query = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.try_psql(&query).as_deref() != Ok("t") {
            assert!(
                std::time::Instant::now() < deadline,
                "the standby did not replay up to {lsn}; its log:\n{}",
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Waits until the server left recovery (after [`Postgres::promote`]), 30 s.
    pub fn wait_promoted(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.try_psql("SELECT pg_is_in_recovery()").as_deref() != Ok("f") {
            assert!(std::time::Instant::now() < deadline, "not promoted; log:\n{}", self.log());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}
