//! The stream's servers' sync interval, read from their `/varz` (`--nats-monitor-url`,
//! issue 70): a server that syncs to disk less often than the durability horizon and a sync
//! pass lets a power loss take back events the slot no longer holds. `setup` warns with
//! what to set, `status` shows each server's interval beside the horizon. nats-server 2.9
//! has no such setting and does not report it (the default suite); 2.10+ (the NATS
//! matrix) runs with `sync_interval: "5m"`.

use std::process::Output;

use crate::support::pgoutbox::command;
use crate::support::{Nats, Postgres};

fn pgoutbox(pg: &Postgres, nats: &Nats, args: &[&str]) -> Output {
    command(pg, nats).args(args).output().expect("pgoutbox runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn servers_sync(pg: &Postgres, nats: &Nats, monitor: &str) -> serde_json::Value {
    let out = pgoutbox(pg, nats, &["status", "--json", "--nats-monitor-url", monitor]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    report["stream"]["servers_sync"][0].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_syncs_less_often_than_the_horizon_is_a_warning_saying_what_to_set() {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let probe = Nats::start();
    let release = probe.release();
    drop(probe);
    let conf = tempfile::NamedTempFile::new().expect("a config file");
    let five_minutes = "jetstream { sync_interval: \"5m\" }\n";
    std::fs::write(conf.path(), if release >= (2, 10) { five_minutes } else { "" }).expect("write");
    let nats = Nats::start_with_args(&["-c", &conf.path().display().to_string()]);
    let monitor = format!("http://127.0.0.1:{}", nats.monitor_port());

    let setup = pgoutbox(&pg, &nats, &["setup", "--nats-monitor-url", &monitor]);
    assert!(setup.status.success(), "{}", stderr(&setup));
    let server = servers_sync(&pg, &nats, &monitor);
    if release < (2, 10) {
        assert_eq!(server["sync_interval"], "not reported", "{server}");
        assert!(server["covered_by_horizon"].is_null(), "{server}");
        assert!(!stderr(&setup).contains("WARN"), "{}", stderr(&setup));
        return;
    }
    let warned = stderr(&setup);
    let line = warned.lines().find(|l| l.contains("syncs to disk every")).unwrap_or_default();
    for says in ["WARN", "every 300 s", "--durability-horizon 150 s", "--durability-horizon 330s"] {
        assert!(line.contains(says), "no {says:?} in {warned}");
    }
    assert_eq!(server["sync_interval"], "300 s", "{server}");
    assert_eq!(server["covered_by_horizon"], false, "{server}");

    // The horizon it names covers the server: no warning.
    let args = ["setup", "--nats-monitor-url", &monitor, "--durability-horizon", "330s"];
    let covered = pgoutbox(&pg, &nats, &args);
    assert!(covered.status.success() && !stderr(&covered).contains("WARN"), "{}", stderr(&covered));

    // A monitoring URL that does not answer: one warning saying what the horizon assumes.
    let gone = "http://127.0.0.1:9";
    let unread = pgoutbox(&pg, &nats, &["setup", "--nats-monitor-url", gone]);
    assert!(unread.status.success(), "{}", stderr(&unread));
    let said = stderr(&unread);
    assert!(
        said.contains("could not read how the server syncs") && said.contains("assumes"),
        "{said}"
    );
}
