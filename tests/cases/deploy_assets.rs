//! deploy/ against the real binary: the Kubernetes probes pass on a hot standby as on the
//! replica that streams (so a rollout of two replicas completes), while /readyz and
//! `pgoutbox_streaming` tell them apart, as the alert rules expect.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::{Nats, Postgres, eventually, http_get, wait_until_streaming};

const DEPLOYMENT: &str = include_str!("../../deploy/kubernetes/deployment.yaml");

/// The value of an unlabelled metric in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

fn streaming(port: u16) -> Option<f64> {
    metric(&http_get(port, "/metrics")?.1, "pgoutbox_streaming")
}

/// The paths of the Deployment's HTTP probes (every uncommented `path: /…`).
fn probe_paths() -> Vec<&'static str> {
    DEPLOYMENT
        .lines()
        .filter_map(|l| l.trim().strip_prefix("path: "))
        .filter(|p| p.starts_with('/'))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hot_standby_passes_the_kubernetes_probes_and_alerts_count_one_streaming() {
    let paths = probe_paths();
    assert_eq!(paths.len(), 2, "liveness and readiness probes: {paths:?}");

    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let mut active = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &active).await;
    let standby = Pgoutbox::run(&pg, &nats, &[]);
    eventually(Duration::from_secs(20), "the standby says it waits", || async {
        standby.log().contains("waiting as hot standby").then_some(())
    })
    .await;

    for path in &paths {
        for (who, app) in [("active", &active), ("standby", &standby)] {
            let code = http_get(app.http_port(), path).map(|r| r.0);
            assert_eq!(code, Some(200), "{who} {path}: a probe must pass; log:\n{}", app.log());
        }
    }
    eventually(Duration::from_secs(10), "the active replica is ready", || async {
        (http_get(active.http_port(), "/readyz")?.0 == 200).then_some(())
    })
    .await;
    let (code, body) = http_get(standby.http_port(), "/readyz").expect("the standby's /readyz");
    assert_eq!(code, 503, "the standby is not ready: {body}");
    assert!(body.contains("not streaming"), "{body}");
    eprintln!("the standby's /readyz: 503 {}", body.trim());
    // The sum PgoutboxNoneStreaming takes: exactly one replica streams.
    let both = eventually(Duration::from_secs(10), "both export pgoutbox_streaming", || async {
        Some((streaming(active.http_port())?, streaming(standby.http_port())?))
    })
    .await;
    assert_eq!(both, (1.0, 0.0), "active, standby");

    // A rollout stops the replica that streams: the standby takes over, still passing
    // its probes throughout, and the sum stays at one.
    active.kill9();
    eventually(Duration::from_secs(20), "the standby streams", || async {
        (streaming(standby.http_port())? == 1.0).then_some(())
    })
    .await;
    for path in &paths {
        assert_eq!(http_get(standby.http_port(), path).map(|r| r.0), Some(200), "{path}");
    }
    eventually(Duration::from_secs(10), "the former standby is ready", || async {
        (http_get(standby.http_port(), "/readyz")?.0 == 200).then_some(())
    })
    .await;
}
