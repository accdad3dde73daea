//! An upgrade as a platform team rolls one (issue 58): the previous release (the commit
//! `scripts/fetch-previous.sh` pins, built once and cached) streams under load beside a
//! hot standby; this version replaces the standby, then the active process (SIGTERM: the
//! new standby takes over), then a new standby joins. The stream's duplicate window is
//! 1 s, too short to hide a row sent twice: every row must be stored once, in commit order,
//! by what each process knows, not by the window.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command_of};
use crate::support::stream::{audit, count, create_outbox_stream, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_upgrade_beside_a_hot_standby_stores_every_row_once_in_order() {
    let previous = previous_release();
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    create_outbox_stream(&js, Duration::from_secs(1)).await;
    let run_previous = || {
        let mut cmd = command_of(&previous, &pg, &nats);
        cmd.arg("run");
        Pgoutbox::spawn(cmd)
    };
    let mut old_active = run_previous();
    wait_until_streaming(&pg, &old_active).await;
    let mut old_standby = run_previous();
    waits_as_standby(&old_standby, "the previous release's standby").await;
    let writer = pg.start_writer(0, 0.02);
    stored_at_least(&js, 2_000, "rows streamed by the previous release").await;

    // 1. The standby replaced by this version.
    old_standby.sigterm();
    assert!(old_standby.wait_exit(Duration::from_secs(30)).success(), "{}", old_standby.log());
    let new_active = Pgoutbox::run(&pg, &nats, &[]);
    waits_as_standby(&new_active, "this version's standby").await;
    let before = count(&js, "OUTBOX").await;
    stored_at_least(&js, before + 2_000, "rows streamed beside this version's standby").await;

    // 2. The active process replaced: the previous release drains and exits, this version
    //    takes over; a new standby of this version joins.
    old_active.sigterm();
    assert!(old_active.wait_exit(Duration::from_secs(30)).success(), "{}", old_active.log());
    wait_until_streaming(&pg, &new_active).await;
    let new_standby = Pgoutbox::run(&pg, &nats, &[]);
    waits_as_standby(&new_standby, "the second standby of this version").await;
    let before = count(&js, "OUTBOX").await;
    stored_at_least(&js, before + 2_000, "rows streamed by this version").await;

    let end = writer.finish() as u64;
    stored_at_least(&js, end, "every row written").await;
    let report = audit(&read_all(&js, "OUTBOX").await, end as usize);
    let logs = format!("previous active:\n{}\nnew active:\n{}", old_active.log(), new_active.log());
    assert_eq!(report.stored, end as usize, "{report:?}\n{logs}");
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0), "{logs}");
    // The record the previous release kept in `public` moved into pgoutbox's own schema
    // (issue 69), where this version keeps it.
    assert_eq!(pg.psql("SELECT to_regclass('public.pgoutbox_acknowledged') IS NULL"), "t");
    let kept = "SELECT count(*) FROM pgoutbox.acknowledged WHERE slot = 'pgoutbox'";
    crate::support::eventually(Duration::from_secs(10), "the record kept", || async {
        (pg.psql(kept) == "1").then_some(())
    })
    .await;
}

/// The previous release's binary: `PGOUTBOX_PREVIOUS_BIN` (scripts/test.sh sets it), else
/// what scripts/fetch-previous.sh builds or finds in its cache.
fn previous_release() -> PathBuf {
    if let Some(path) = std::env::var_os("PGOUTBOX_PREVIOUS_BIN") {
        return PathBuf::from(path);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/fetch-previous.sh");
    let out = Command::new(script).output().expect("run scripts/fetch-previous.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scripts/fetch-previous.sh failed:\n{stderr}");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

async fn waits_as_standby(app: &Pgoutbox, what: &str) {
    eventually(Duration::from_secs(30), &format!("{what} says it waits"), || async {
        app.log().contains("waiting as hot standby").then_some(())
    })
    .await;
}

async fn stored_at_least(js: &async_nats::jetstream::Context, rows: u64, what: &str) {
    eventually(Duration::from_secs(60), what, || async {
        (count(js, "OUTBOX").await >= rows).then_some(())
    })
    .await;
}
