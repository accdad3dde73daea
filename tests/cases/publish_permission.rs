//! A NATS user that may not publish to the outbox's subjects: the server answers each
//! publish with `-ERR 'Permissions Violation ...'` and never acknowledges it. pgoutbox says
//! so at once on `/readyz` and in the log, without a line per row, stores and confirms
//! nothing, and delivers every row once after the operator grants the permission.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, read_all};
use crate::support::{Nats, Postgres, eventually, http_get, numbered_rows, wait_until_streaming};

const VIOLATION: &str = "Permissions Violation";

fn write_config(dir: &Path, deny: &str) {
    let config = format!(
        "authorization {{ users = [ {{ user: relay, password: pw, \
         permissions: {{ publish: {{ deny: [{deny}] }} }} }} ] }}\n"
    );
    std::fs::write(dir.join("nats.conf"), config).expect("write nats.conf");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_publish_permission_missing_is_named_at_once_and_nothing_is_lost() {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let dir = tempfile::tempdir().expect("temp dir");
    write_config(dir.path(), r#""outbox.*.*""#);
    let path = dir.path().join("nats.conf");
    let mut nats = Nats::start_with_args(&["-c", path.to_str().expect("UTF-8 path")]);
    let url = format!("nats://relay:pw@127.0.0.1:{}", nats.port());
    let app = Pgoutbox::run_via(&pg, &nats, &url);
    wait_until_streaming(&pg, &app).await;
    let total = 100;
    pg.psql(&numbered_rows(0, total, total));

    // Well within the 10 s ack timeout: the refusal itself ends the attempt.
    let why = eventually(Duration::from_secs(5), "/readyz names the violation", || async {
        http_get(app.http_port(), "/readyz")
            .filter(|(code, why)| *code == 503 && why.contains(VIOLATION))
    })
    .await;
    eprintln!("/readyz: {}", why.1.trim());
    // Attempts go on every half second; the warning names the refusal once, not per row
    // nor per attempt (the test runs pgoutbox at debug level, where every attempt shows).
    let warnings = || {
        let log = app.log();
        log.lines().filter(|l| l.contains(" WARN ") && l.contains(VIOLATION)).count()
    };
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert!(warnings() <= 1, "warned again and again:\n{}", app.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(warnings(), 1, "no warning:\n{}", app.log());
    let reader = async_nats::ConnectOptions::with_user_and_password("relay".into(), "pw".into())
        .connect(nats.url())
        .await
        .expect("the test's reader connects");
    let js = async_nats::jetstream::new(reader);
    assert_eq!(count(&js, "OUTBOX").await, 0, "stored despite the denial");

    // Granted the way an operator would: the config fixed, the server restarted on its store.
    // (A SIGHUP reload of `authorization` left nats-server 2.9's JetStream answering nothing.)
    write_config(dir.path(), r#""nothing.here""#);
    nats.stop();
    nats.start_again();
    eventually(Duration::from_secs(60), "every row stored once granted", || async {
        (count(&js, "OUTBOX").await >= total as u64).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, total);
    assert_eq!(report.stored, total, "{report:?}\nlog:\n{}", app.log());
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));
}
