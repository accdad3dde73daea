//! deploy/ against the real binary: every metric the Grafana dashboard and the alert rules
//! query is one pgoutbox exports; the Kubernetes probes pass on a hot standby as on the
//! replica that streams (so a rollout of two replicas completes), while /readyz and
//! `pgoutbox_streaming` tell them apart, as the alert rules expect.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::{Nats, Postgres, eventually, http_get, wait_until_streaming};

const DEPLOYMENT: &str = include_str!("../../deploy/kubernetes/deployment.yaml");
const DASHBOARD: &str = include_str!("../../deploy/grafana/pgoutbox.json");
const RULES: &str = include_str!("../../deploy/prometheus/pgoutbox.rules.yml");

/// Metrics Prometheus makes itself, not pgoutbox.
const PROMETHEUS_OWN: &[&str] = &["up"];

/// Every PromQL expression of the dashboard: its panels' queries and the metric selector
/// of each `label_values(selector, label)` variable.
fn dashboard_exprs() -> Vec<String> {
    fn walk(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v.as_str()) {
                        ("expr", Some(expr)) => out.push(expr.to_owned()),
                        ("query", Some(q)) => {
                            if let Some(args) = q.trim().strip_prefix("label_values(") {
                                let selector = args.rsplit_once(',').map_or(args, |(s, _)| s);
                                out.push(selector.to_owned());
                            }
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard JSON");
    let mut out = Vec::new();
    walk(&dashboard, &mut out);
    out
}

/// Every `expr:` of the rules file, a one-line value or a folded (`>-`) block.
fn rule_exprs() -> Vec<String> {
    let lines: Vec<&str> = RULES.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(value) = line.trim_start().strip_prefix("expr:").map(str::trim) else {
            continue;
        };
        if value == ">-" || value == ">" || value == "|" {
            let block: Vec<&str> = lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || indent(l) > indent(line))
                .map(|l| l.trim())
                .collect();
            out.push(block.join(" "));
        } else {
            out.push(value.to_owned());
        }
    }
    out
}

/// The metric names a PromQL expression selects: identifiers left once strings, label
/// matchers, ranges, grouping label lists, function calls, keywords and dashboard
/// variables are taken out.
fn metric_names(expr: &str) -> Vec<String> {
    const KEYWORDS: &[&str] =
        &["and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on", "ignoring"];
    let mut text = String::new();
    let mut chars = expr.chars().peekable();
    let mut depth_braces = 0;
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                let quote = c;
                while let Some(d) = chars.next() {
                    if d == '\\' {
                        chars.next();
                    } else if d == quote {
                        break;
                    }
                }
                text.push(' ');
            }
            '{' => depth_braces += 1,
            '}' => depth_braces -= 1,
            '[' => {
                for d in chars.by_ref() {
                    if d == ']' {
                        break;
                    }
                }
                text.push(' ');
            }
            '$' => {
                while chars.peek().is_some_and(|d| d.is_alphanumeric() || "_{}".contains(*d)) {
                    chars.next();
                }
                text.push(' ');
            }
            _ if depth_braces > 0 => {}
            _ => text.push(c),
        }
    }
    // Label lists after by/without/on/ignoring/group_left/group_right.
    let grouping = without_label_lists(&text);
    let mut names = Vec::new();
    let bytes: Vec<char> = grouping.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || "_:".contains(bytes[i])) {
                i += 1;
            }
            let word: String = bytes[start..i].iter().collect();
            let called = bytes[i..].iter().find(|c| !c.is_whitespace()) == Some(&'(');
            let is_number =
                start > 0 && (bytes[start - 1].is_ascii_digit() || bytes[start - 1] == '.');
            if !called && !is_number && !KEYWORDS.contains(&word.as_str()) {
                names.push(word);
            }
        } else if c.is_ascii_digit() {
            // A number (1e9, 0.99): skip it whole, exponent included.
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == '.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    names
}

/// `text` with the parenthesised label list after each grouping keyword blanked out.
fn without_label_lists(text: &str) -> String {
    const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while !rest.is_empty() {
        for keyword in GROUPING {
            if let Some(after) = rest.strip_prefix(keyword) {
                let boundary_before =
                    !out.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
                let open = after.trim_start();
                if boundary_before && open.starts_with('(') {
                    let close = open.find(')').expect("a closed label list");
                    out.push(' ');
                    rest = &open[close + 1..];
                    continue 'scan;
                }
            }
        }
        let c = rest.chars().next().expect("not empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The names of the series in Prometheus text (sample lines, not comments).
fn exported(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_owned))
        .collect()
}

/// The value of an unlabelled metric in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

#[test]
fn metric_names_are_read_out_of_promql() {
    let names = |e| metric_names(e);
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (le) (rate(a_bucket{job="$job", x=~"b|c"}[$__rate_interval]))) > 1e9"#
        ),
        ["a_bucket"]
    );
    assert_eq!(
        names("sum without (instance, pod) (s{job=\"p\"}) == 0 or absent(s{job=\"p\"})"),
        ["s", "s"]
    );
    assert_eq!(names("l > 1e9 and on (instance) group_left (kind) up == 1"), ["l", "up"]);
    assert_eq!(names("increase(d[15m]) > 0"), ["d"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_the_dashboard_and_the_rules_query_is_exported() {
    let dashboard = dashboard_exprs();
    let rules = rule_exprs();
    assert!(dashboard.len() >= 10, "{dashboard:#?}");
    assert_eq!(rules.len(), RULES.matches("- alert:").count(), "{rules:#?}");
    let queried: std::collections::BTreeSet<String> = dashboard
        .iter()
        .chain(&rules)
        .flat_map(|e| metric_names(e))
        .filter(|n| !PROMETHEUS_OWN.contains(&n.as_str()))
        .collect();
    // What the dashboard exists to show (issue 14): lag in bytes and seconds, rows/s,
    // commit-to-stored quantiles, dead letters, stalled, reconnects.
    for name in [
        "pgoutbox_replication_lag_bytes",
        "pgoutbox_last_confirmation_age_seconds",
        "pgoutbox_rows_published_total",
        "pgoutbox_commit_to_ack_seconds_bucket",
        "pgoutbox_dead_letters_total",
        "pgoutbox_stalled",
        "pgoutbox_reconnects_total",
    ] {
        assert!(queried.contains(name), "nothing queries {name}: {queried:?}");
    }

    // A real pgoutbox that has published a row (so per-row series exist); nothing else
    // happened: counters of events that never occurred must be exported at 0 all the same,
    // or alerts on increase() and the dashboard's panels have no series to show.
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    // `--verify-every`: its gauges, which an alert reads, exist once it has checked.
    let app = Pgoutbox::run(&pg, &nats, &["--verify-every", "1s"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&crate::support::numbered_rows(0, 1, 1));
    let text = eventually(Duration::from_secs(30), "/metrics shows the row", || async {
        let (_, text) = http_get(app.http_port(), "/metrics")?;
        let checked = text.contains("pgoutbox_verify_missing_rows{");
        (metric(&text, "pgoutbox_rows_published_total{table=\"public.outbox\"}")? >= 1.0 && checked)
            .then_some(text)
    })
    .await;
    let exported = exported(&text);
    let missing: Vec<&String> = queried.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "queried by deploy/grafana/pgoutbox.json or deploy/prometheus/pgoutbox.rules.yml \
         but not exported: {missing:?}\nexported: {exported:?}"
    );
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
    assert!(body.contains("hot standby"), "{body}");
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
