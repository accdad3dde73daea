//! Postgres behind a proxy that black-holes the connections (they stay open, nothing gets
//! through, and the proxy's kernel keeps acknowledging, so TCP keepalive sees nothing). The
//! liveness check must notice within 60 s: /readyz turns 503 saying why. Once the path is
//! back, pgoutbox resumes from the slot on its own, and every row, including those committed
//! while the path was dark, is stored exactly once, in commit order.

use std::time::{Duration, Instant};

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::proxy::FaultProxy;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, http_get, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn a_black_holed_postgres_is_noticed_and_streaming_resumes_without_loss() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let proxy = FaultProxy::start_bytes(pg.port()).await;
    let mut cmd = command(&pg, &nats);
    let via_proxy = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    cmd.env("PGOUTBOX_DATABASE_URL", via_proxy).arg("run");
    let mut app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    let port = app.http_port();
    let js = jetstream(&nats.url()).await;
    pg.psql(&numbered_rows(0, 1_000, 100));
    eventually(Duration::from_secs(20), "the first rows stored", || async {
        (count(&js, "OUTBOX").await >= 1_000).then_some(())
    })
    .await;
    eventually(Duration::from_secs(10), "/readyz 200 while streaming", || async {
        (http_get(port, "/readyz")?.0 == 200).then_some(())
    })
    .await;

    proxy.blackhole();
    let dark_since = Instant::now();
    let why = eventually(Duration::from_secs(60), "/readyz 503 after the black hole", || async {
        let (code, body) = http_get(port, "/readyz")?;
        (code == 503).then_some(body)
    })
    .await;
    let detected_after = dark_since.elapsed();
    eprintln!("black hole detected after {detected_after:?}: {why}");
    assert!(why.contains("Postgres stopped answering"), "{why}\nlog:\n{}", app.log());
    pg.psql(&numbered_rows(1_000, 2_000, 100)); // committed while the path is dark

    proxy.restore();
    pg.psql(&numbered_rows(2_000, 3_000, 100));
    eventually(Duration::from_secs(60), "every row stored", || async {
        (count(&js, "OUTBOX").await >= 3_000).then_some(())
    })
    .await;
    eventually(Duration::from_secs(10), "/readyz 200 again", || async {
        (http_get(port, "/readyz")?.0 == 200).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, 3_000);
    assert_eq!(report.stored, 3_000, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
    assert!(app.is_running(), "pgoutbox exited; log:\n{}", app.log());
}
