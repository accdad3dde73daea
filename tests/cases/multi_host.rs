//! A multi-host `--database-url` is followed by the replication connection as libpq follows
//! it. With `target_session_attrs=read-write`, a first host that only reads (an old primary
//! back as a standby, here a server with `default_transaction_read_only = on`) is passed
//! over; before, the replication connection took the first host that answered, while the
//! SQL connection took the writable one.

use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn target_session_attrs_read_write_passes_over_a_read_only_first_host() {
    let read_only = Postgres::builder().conf("default_transaction_read_only = on").start();
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        read_only.port(),
        pg.port()
    );
    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_DATABASE_URL", url).arg("run");
    let mut app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 20, 5));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "20 rows stored", || async {
        (count(&js, "OUTBOX").await >= 20).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 20);
    assert_eq!((report.stored, report.duplicates, report.lost), (20, 0, 0), "{report:?}");
    assert!(app.is_running(), "pgoutbox exited; log:\n{}", app.log());
}
