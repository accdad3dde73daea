//! A server in recovery is never taken for one whose slot was dropped. Started against a
//! standby whose primary died, pgoutbox says once that Postgres is in recovery and waits
//! (`/readyz` says why), instead of exiting with "it was dropped after pgoutbox set it
//! up", a false alarm an operator in the middle of a failover must not see. Once the
//! standby is promoted, pgoutbox judges the slot: on this standby it was never
//! synchronised (no `--failover`), so now, and only now, it is missing for real.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, http_get, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_being_promoted_is_waited_for_never_reported_as_a_dropped_slot() {
    let mut primary = Postgres::start();
    let nats = Nats::start();
    primary.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&primary, &nats, &[]);
    wait_until_streaming(&primary, &app).await;
    primary.psql(&numbered_rows(0, 100, 10));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "100 rows stored", || async {
        (count(&js, "OUTBOX").await == 100).then_some(())
    })
    .await;
    crate::support::stop_and_wait_released(&primary, app).await;

    let standby = primary.start_standby(&[]);
    primary.stop("immediate");

    let mut app = Pgoutbox::run(&standby, &nats, &[]);
    let port = app.http_port();
    eventually(Duration::from_secs(20), "/readyz saying Postgres is in recovery", || async {
        let (code, body) = http_get(port, "/readyz")?;
        (code == 503 && body.contains("in recovery")).then_some(())
    })
    .await;
    // Still there a poll later: it waits rather than judging the slot.
    eventually(Duration::from_secs(10), "a second look at the waiting process", || async {
        let (_, body) = http_get(port, "/readyz")?;
        body.contains("in recovery").then_some(())
    })
    .await;
    assert!(app.is_running(), "pgoutbox exited on a server in recovery:\n{}", app.log());
    let log = app.log();
    assert_eq!(log.matches("Postgres is in recovery").count(), 1, "said once:\n{log}");
    assert!(!log.contains("does not exist"), "a false alarm:\n{log}");

    standby.promote();
    standby.wait_promoted();
    let status = app.wait_exit(Duration::from_secs(30));
    let log = app.log();
    assert!(!status.success(), "{log}");
    let left = log.find("left recovery").unwrap_or_else(|| panic!("promotion unseen:\n{log}"));
    assert!(log[left..].contains("does not exist"), "after promotion the slot is judged:\n{log}");
}
