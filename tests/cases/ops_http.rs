//! /healthz, /readyz and /metrics over real HTTP: ready only while streaming with NATS
//! connected (503 with the reason while NATS is down), and the pipeline's figures.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, http_get, numbered_rows, wait_until_streaming};

/// The rows published of the one table, `public.outbox`: the per-row counters are labelled
/// by table.
const ROWS: &str = "pgoutbox_rows_published_total{table=\"public.outbox\"}";

/// The value of a series (a name, with its labels if it has any) in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn health_readiness_and_metrics_follow_the_pipeline() {
    let pg = Postgres::start();
    let mut nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    // No horizon: the ack-to-confirm stage is timed within the status tick, not 150 s.
    let app = Pgoutbox::run(&pg, &nats, &["--durability-horizon", "0s"]);
    let port = app.http_port();
    wait_until_streaming(&pg, &app).await;

    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
    eventually(Duration::from_secs(10), "/readyz 200", || async {
        (http_get(port, "/readyz")?.0 == 200).then_some(())
    })
    .await;

    pg.psql(&numbered_rows(0, 300, 100));
    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(20), "300 rows stored", || async {
        (count(&js, "OUTBOX").await == 300).then_some(())
    })
    .await;
    let text = eventually(Duration::from_secs(10), "metrics show 300 rows", || async {
        let (_, text) = http_get(port, "/metrics")?;
        (metric(&text, ROWS)? >= 300.0).then_some(text)
    })
    .await;
    let bytes = "pgoutbox_bytes_published_total{table=\"public.outbox\"}";
    assert!(metric(&text, bytes).unwrap_or(0.0) > 2_000.0, "{text}");
    assert!(metric(&text, "pgoutbox_transactions_total").unwrap_or(0.0) >= 3.0, "{text}");
    assert!(metric(&text, "pgoutbox_commit_to_ack_seconds_count").unwrap_or(0.0) >= 3.0, "{text}");
    assert!(text.contains("pgoutbox_commit_to_ack_seconds_bucket{le=\"0.01\"}"), "{text}");
    // The stages of that latency, each per transaction; the last one once a status update
    // has confirmed a transaction (within the 100 ms status tick).
    for stage in ["pgoutbox_commit_to_receive_seconds", "pgoutbox_receive_to_ack_seconds"] {
        let count = metric(&text, &format!("{stage}_count")).unwrap_or(0.0);
        assert!(count >= 3.0, "{stage}: {count}\n{text}");
    }
    eventually(Duration::from_secs(5), "a confirmation timed", || async {
        let (_, text) = http_get(port, "/metrics")?;
        (metric(&text, "pgoutbox_ack_to_confirm_seconds_count")? >= 1.0).then_some(())
    })
    .await;
    for name in
        ["pgoutbox_messages_in_flight", "pgoutbox_confirmed_lsn", "pgoutbox_replication_lag_bytes"]
    {
        assert!(metric(&text, name).is_some(), "{name} missing:\n{text}");
    }
    assert!(metric(&text, "pgoutbox_confirmed_lsn").unwrap_or(0.0) > 0.0);

    nats.stop();
    let body = eventually(Duration::from_secs(30), "/readyz 503 while NATS is down", || async {
        let (code, body) = http_get(port, "/readyz")?;
        (code == 503).then_some(body)
    })
    .await;
    assert!(body.contains("NATS"), "{body}");
    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200), "alive even when not ready");

    nats.start_again();
    eventually(Duration::from_secs(60), "/readyz 200 after NATS is back", || async {
        (http_get(port, "/readyz")?.0 == 200).then_some(())
    })
    .await;
    let text = http_get(port, "/metrics").map(|r| r.1).unwrap_or_default();
    assert!(text.contains("pgoutbox_reconnects_total{target=\"nats\"}"), "{text}");
}

/// /metrics as Prometheus users expect it: a `# HELP` line on every metric, the build info,
/// the standard `process_*` metrics, and every counter present at 0 before anything happened.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_have_help_build_info_process_metrics_and_counters_at_zero() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    let port = app.http_port();
    let text = eventually(Duration::from_secs(10), "/metrics answers", || async {
        http_get(port, "/metrics").filter(|(code, _)| *code == 200).map(|(_, text)| text)
    })
    .await;
    let families: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(|name| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| text.contains(&format!("# TYPE {base} histogram")))
                .unwrap_or(name)
        })
        .collect();
    for family in &families {
        assert!(text.contains(&format!("# HELP {family} ")), "no HELP for {family}:\n{text}");
    }
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        text.lines().any(|l| l.starts_with("pgoutbox_build_info{")
            && l.contains(&format!("version=\"{version}\""))
            && l.ends_with(" 1")),
        "{text}"
    );
    for name in ["process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"] {
        assert!(families.contains(name), "{name} missing:\n{text}");
    }
    // The process metrics agree with the kernel's own accounting (before, the CPU time was
    // truncated to whole seconds: 0 for a process that had used 0.3 s).
    let value = |name: &str| {
        let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
        line.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).unwrap_or(-1.0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", app.pid())).unwrap_or_default();
    let fields: Vec<f64> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let kernel_cpu = (fields[11] + fields[12]) / 100.0;
    let cpu = value("process_cpu_seconds_total");
    assert!(cpu > 0.0 && (cpu - kernel_cpu).abs() < 0.5, "cpu {cpu}, kernel {kernel_cpu}");
    let tasks = std::fs::read_dir(format!("/proc/{}/task", app.pid())).map_or(0, |d| d.count());
    let threads = value("process_threads");
    assert!((threads - tasks as f64).abs() <= 2.0, "threads {threads}, kernel {tasks}");
    // Nothing was published, dead-lettered or retried yet: every counter is there, at 0.
    for line in [
        "pgoutbox_rows_published_total{table=\"public.outbox\"} 0",
        "pgoutbox_dead_letters_total{table=\"public.outbox\"} 0",
        "pgoutbox_duplicates_total{table=\"public.outbox\"} 0",
        "pgoutbox_non_transactional_messages_total 0",
        "pgoutbox_retention_deleted_total 0",
        "pgoutbox_publish_errors_total{kind=\"timeout\"} 0",
        "pgoutbox_publish_errors_total{kind=\"no_leader\"} 0",
        "pgoutbox_reconnects_total{target=\"postgres\"} 0",
        "pgoutbox_reconnects_total{target=\"nats\"} 0",
        "pgoutbox_stalled 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
    }
    // Emitted events are off by default: no label for them.
    assert!(!text.contains("table=\"(emitted)\""), "{text}");
}

/// With the default HTTP address taken, pgoutbox streams without HTTP and says which
/// address, written as an address (`127.0.0.1:9717`), not as a tuple.
#[tokio::test(flavor = "multi_thread")]
async fn a_taken_default_address_is_named_as_an_address() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    // Held here, or by someone else: taken either way.
    let _held = std::net::TcpListener::bind("127.0.0.1:9717");
    let mut cmd = crate::support::pgoutbox::command(&pg, &nats);
    cmd.env_remove("PGOUTBOX_HTTP_ADDR").arg("run");
    let app = Pgoutbox::spawn(cmd);
    let line = eventually(Duration::from_secs(20), "the warning", || async {
        app.log().lines().find(|l| l.contains("no HTTP endpoints")).map(str::to_owned)
    })
    .await;
    assert!(line.contains("the default 127.0.0.1:9717 is taken"), "{line}");
}
