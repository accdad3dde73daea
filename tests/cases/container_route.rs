//! docker-compose.yml's healthchecks, run as written against real servers (no Docker
//! engine here): pgoutbox's bash /dev/tcp probe passes only while pgoutbox streams with
//! NATS connected, NATS's probe passes against a nats-server with JetStream.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::{Nats, Postgres, eventually, free_port, http_get, wait_until_streaming};

const COMPOSE: &str = include_str!("../../docker-compose.yml");

/// The lines of one service's block in the compose file.
fn service(name: &str) -> Vec<&'static str> {
    let header = format!("  {name}:");
    COMPOSE
        .lines()
        .skip_while(|l| *l != header)
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("   "))
        .collect()
}

/// A service's healthcheck `test`, as the argv Docker runs (`CMD` dropped), with compose's
/// `$$` unescaped. Reads the two forms the file uses: a flow sequence on one line, or a
/// block sequence whose last item is a folded (`>-`) scalar.
fn healthcheck(name: &str) -> Vec<String> {
    let lines = service(name);
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("test:"))
        .unwrap_or_else(|| panic!("no healthcheck test for {name} in docker-compose.yml"));
    let first = lines[at].trim_start().trim_start_matches("test:").trim();
    let argv: Vec<String> = if first.starts_with('[') {
        serde_json::from_str(first).expect("the healthcheck's flow sequence as JSON")
    } else {
        let indent = |l: &str| l.len() - l.trim_start().len();
        let items_indent = indent(lines[at + 1]);
        let mut argv = Vec::new();
        let mut rest = lines[at + 1..].iter().copied();
        while let Some(line) = rest.next() {
            if indent(line) != items_indent || !line.trim_start().starts_with("- ") {
                break;
            }
            let item = line.trim_start()[2..].trim();
            if item == ">-" {
                let folded: Vec<&str> =
                    rest.by_ref().take_while(|l| indent(l) > items_indent).map(str::trim).collect();
                argv.push(folded.join(" "));
                break;
            }
            argv.push(item.to_owned());
        }
        argv
    };
    assert_eq!(argv.first().map(String::as_str), Some("CMD"), "{name}: {argv:?}");
    argv[1..].iter().map(|a| a.replace("$$", "$")).collect()
}

/// Runs `argv` with a deadline; true when it exits 0.
fn passes(argv: &[String]) -> bool {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("running {argv:?}: {e}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("wait for the healthcheck") {
            return status.success();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("healthcheck {argv:?} still running after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_compose_file_serves_http_on_all_interfaces_where_the_healthcheck_looks() {
    let pgoutbox = service("pgoutbox");
    assert!(
        pgoutbox.iter().any(|l| l.trim() == "PGOUTBOX_HTTP_ADDR: 0.0.0.0:9717"),
        "pgoutbox must listen beyond loopback in its container: {pgoutbox:#?}"
    );
    let probe = healthcheck("pgoutbox");
    assert_eq!(probe[..2], ["bash", "-c"], "{probe:?}");
    assert!(probe[2].contains("/dev/tcp/127.0.0.1/9717"), "{probe:?}");
    for name in ["postgres", "nats"] {
        let image = service(name).into_iter().find_map(|l| l.trim().strip_prefix("image: "));
        let image = image.unwrap_or_else(|| panic!("{name} has no image"));
        let tag = image.split_once(':').map(|(_, t)| t).unwrap_or("latest");
        assert!(
            tag.split(['.', '-']).filter(|p| p.parse::<u32>().is_ok()).count() >= 2,
            "{name}'s image {image} is not pinned to a minor version"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_compose_healthchecks_pass_only_when_the_servers_are_healthy() {
    // NATS: the probe's URL against a real nats-server -js; busybox wget as in the
    // -alpine image when this machine has busybox, else the system's wget.
    let mut nats = Nats::start();
    let probe = healthcheck("nats");
    let url =
        probe.last().expect("the URL").replace(":8222/", &format!(":{}/", nats.monitor_port()));
    let path = &url[url.find("/healthz").expect("a /healthz URL")..];
    let (code, body) = http_get(nats.monitor_port(), path).expect("nats-server's monitoring port");
    assert_eq!((code, body.trim()), (200, r#"{"status":"ok"}"#), "{path}");
    let wget = ["busybox", "wget"]
        .into_iter()
        .find(|b| Command::new(b).arg("--help").output().is_ok())
        .map(|b| {
            if b == "busybox" {
                vec!["busybox".to_owned(), "wget".to_owned()]
            } else {
                vec![b.to_owned()]
            }
        });
    if let Some(wget) = wget {
        assert_eq!(probe[0], "wget", "{probe:?}");
        let mut argv = wget;
        argv.extend(probe[1..probe.len() - 1].iter().cloned());
        argv.push(url.clone());
        assert!(passes(&argv), "{argv:?} failed against a healthy nats-server");
        let dead =
            url.replace(&format!(":{}/", nats.monitor_port()), &format!(":{}/", free_port()));
        argv.pop();
        argv.push(dead);
        assert!(!passes(&argv), "{argv:?} passed with nothing listening");
    }

    // pgoutbox: the bash probe, its port changed to this pgoutbox's.
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let port = free_port();
    let mut probe = healthcheck("pgoutbox");
    probe[2] = probe[2].replace("/dev/tcp/127.0.0.1/9717", &format!("/dev/tcp/127.0.0.1/{port}"));
    assert!(!passes(&probe), "the probe passed before pgoutbox runs: {probe:?}");

    let mut cmd = command(&pg, &nats);
    cmd.env("PGOUTBOX_HTTP_ADDR", format!("0.0.0.0:{port}")).arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    eventually(Duration::from_secs(20), "the probe passes while streaming", || async {
        passes(&probe).then_some(())
    })
    .await;

    nats.stop();
    eventually(Duration::from_secs(30), "the probe fails while NATS is down", || async {
        (!passes(&probe)).then_some(())
    })
    .await;
    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200), "{}", app.log());
}
