//! `--schedule-column`: a row with a time is held by the stream (nats-server 2.12+, message
//! schedules) and delivered to its subject at that time, once; the server writes the
//! delivered message into pgoutbox's stream behind its back, and pgoutbox's chain goes on
//! past it, also across a kill -9 whose restart finds a delivered message at the stream's
//! end. A value that is not a time is a dead letter saying why. On a server before 2.12, or
//! a stream that does not allow schedules, pgoutbox refuses to start with one line.

use std::time::Duration;

use async_nats::jetstream;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::proxy::FaultProxy;
use crate::support::stream::{Stored, create_scheduled_outbox_stream, jetstream, read_all};
use crate::support::{Lcg, Nats, Postgres, eventually, wait_until_streaming};

const SCHEDULE: &str = "--schedule-column=deliver_at";

/// Row `n`, delivered at `at` (SQL; NULL: now).
fn insert(n: usize, at: &str) -> String {
    format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, deliver_at) \
         VALUES ('order', '{n}', 'created', '{{\"n\": {n}}}', {at});\n"
    )
}

/// The events a consumer of `outbox.>` sees: each row's aggregate id, in stream order.
fn events(stored: &[Stored]) -> Vec<String> {
    stored
        .iter()
        .filter(|m| m.subject.starts_with("outbox.order."))
        .map(|m| m.header("Outbox-Aggregate-Id").unwrap_or("?").to_owned())
        .collect()
}

fn delivered(stored: &[Stored], row: usize) -> Option<&Stored> {
    let row = row.to_string();
    stored.iter().find(|m| {
        m.subject == "outbox.order.created" && m.header("Outbox-Aggregate-Id") == Some(&row)
    })
}

async fn wait_for_events(js: &jetstream::Context, want: &[&str], app: &Pgoutbox) -> Vec<Stored> {
    let what = format!("events {want:?} on outbox.>\n{}", app.log());
    eventually(Duration::from_secs(30), &what, || async {
        let stored = read_all(js, "OUTBOX").await;
        (events(&stored) == want).then_some(stored)
    })
    .await
}

/// When row `n` is to be delivered, in nanoseconds since the epoch (Postgres's clock, the
/// same machine's as the server's).
fn due_nanos(pg: &Postgres, n: usize) -> i128 {
    let seconds = pg.psql(&format!(
        "SELECT extract(epoch FROM deliver_at)::numeric FROM outbox WHERE aggregate_id = '{n}'"
    ));
    let seconds: f64 = seconds.trim().parse().expect("an epoch");
    (seconds * 1e9) as i128
}

/// Postgres with an outbox that has `deliver_at`, and nats-server with the scheduled stream
/// made; `None` on a server before 2.12.
async fn servers_with_schedules() -> Option<(Postgres, Nats, jetstream::Context)> {
    let pg = Postgres::start();
    let nats = Nats::start();
    if nats.release() < (2, 12) {
        return None;
    }
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN deliver_at timestamptz;");
    let js = jetstream(&nats.url()).await;
    create_scheduled_outbox_stream(&js).await;
    Some((pg, nats, js))
}

fn start(pg: &Postgres, nats: &Nats) -> Pgoutbox {
    Pgoutbox::run(pg, nats, &[SCHEDULE])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scheduled_row_is_delivered_at_its_time_once_and_the_chain_goes_on_past_it() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN deliver_at timestamptz;");
    let mut app = start(&pg, &nats);
    if app.refused_before(&nats, (2, 12), "--schedule-column needs nats-server 2.12 or later") {
        return;
    }
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    let mut stream = js.get_stream("OUTBOX").await.expect("pgoutbox created the stream");
    let config = stream.info().await.expect("stream info").config.clone();
    assert!(config.allow_message_schedules, "created allowing schedules");
    assert!(config.subjects.contains(&"schedules.OUTBOX.>".to_owned()), "{:?}", config.subjects);

    // Row 1 waits 3 s; row 2, committed after it, is delivered at once.
    pg.psql(&format!(
        "BEGIN;\n{}{}COMMIT;\n{}",
        insert(0, "NULL"),
        insert(1, "now() + interval '3 seconds'"),
        insert(2, "NULL")
    ));
    let stored = wait_for_events(&js, &["0", "2"], &app).await;
    let held: Vec<&Stored> =
        stored.iter().filter(|m| m.subject.starts_with("schedules.OUTBOX.")).collect();
    assert_eq!(held.len(), 1, "row 1 is held, out of the events' subjects: {stored:?}");
    assert_eq!(held[0].header("Nats-Schedule-Target"), Some("outbox.order.created"));

    // Delivered at its time, not before; then the chain goes on behind the delivery.
    let stored = wait_for_events(&js, &["0", "2", "1"], &app).await;
    let due = due_nanos(&pg, 1);
    let at = delivered(&stored, 1).expect("row 1 delivered");
    assert!(at.stored_at_nanos >= due, "delivered {} ns early", due - at.stored_at_nanos);
    assert!(at.stored_at_nanos < due + 5_000_000_000, "delivered over 5 s late");
    assert_eq!(at.json()["n"], 1, "the row's payload");
    // nats-server delivers it without Nats-Msg-Id: the row's id goes with it all the same.
    let id = held[0].header("Nats-Msg-Id").expect("the schedule's id").to_owned();
    assert_eq!(at.header("Pgoutbox-Event-Id"), Some(id.as_str()), "{:?}", at.headers);
    pg.psql(&insert(3, "NULL"));
    wait_for_events(&js, &["0", "2", "1", "3"], &app).await;
    assert!(
        app.log().contains("streaming on behind it") && !app.log().contains("reconnecting"),
        "a delivery is no error:\n{}",
        app.log()
    );

    // A delivery at the stream's end when pgoutbox is killed: the restart skips by it.
    pg.psql(&insert(4, "now() + interval '2 seconds'"));
    wait_for_events(&js, &["0", "2", "1", "3", "4"], &app).await;
    app.kill9();
    pg.psql(&format!("{}{}", insert(5, "NULL"), insert(6, "now() - interval '1 minute'")));
    let app = start(&pg, &nats);
    let stored = wait_for_events(&js, &["0", "2", "1", "3", "4", "5", "6"], &app).await;

    // Nothing more comes: each row once, no schedule left behind.
    pg.psql(&insert(7, "NULL"));
    let stored_then = wait_for_events(&js, &["0", "2", "1", "3", "4", "5", "6", "7"], &app).await;
    assert!(stored_then.len() > stored.len());
    let left: Vec<&Stored> =
        stored_then.iter().filter(|m| m.subject.starts_with("schedules.")).collect();
    assert!(left.is_empty(), "every schedule was delivered and removed: {left:?}");
    assert!(stored_then.iter().all(|m| m.subject.starts_with("outbox.order.")), "{stored_then:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_value_that_is_not_a_time_is_a_dead_letter_and_a_stream_without_schedules_is_refused() {
    let pg = Postgres::start();
    let nats = Nats::start();
    if nats.release() < (2, 12) {
        return; // the refusal of older servers is the other test's
    }
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ADD COLUMN deliver_at text;");
    let js = jetstream(&nats.url()).await;
    js.create_stream(jetstream::stream::Config {
        name: "OUTBOX".into(),
        subjects: vec!["outbox.>".into(), "schedules.OUTBOX.>".into()],
        ..Default::default()
    })
    .await
    .expect("a stream without allow_msg_schedules");
    let mut app = start(&pg, &nats);
    assert!(!app.wait_exit(Duration::from_secs(30)).success(), "{}", app.log());
    assert!(
        app.log().contains("which stream OUTBOX does not allow") && app.log().contains("--stream"),
        "{}",
        app.log()
    );
    let mut stream = js.get_stream("OUTBOX").await.expect("the stream");
    assert!(!stream.info().await.expect("info").config.allow_message_schedules, "never changed");

    js.delete_stream("OUTBOX").await.expect("the refused stream deleted");
    let app = Pgoutbox::run(&pg, &nats, &[SCHEDULE, "--stream=HELD"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!("{}{}", insert(0, "'next tuesday'"), insert(1, "NULL")));
    let what = format!("row 1 and the dead letter of row 0\n{}", app.log());
    // The default subject prefix follows the stream's name.
    let stored = eventually(Duration::from_secs(30), &what, || async {
        let stored = read_all(&js, "HELD").await;
        (stored.len() == 2).then_some(stored)
    })
    .await;
    assert_eq!(stored[0].subject, "outbox.dead_letter");
    let reason = stored[0].json()["reason"].as_str().unwrap_or_default().to_owned();
    assert!(
        reason.contains("column deliver_at") && reason.contains("is not a time to deliver at"),
        "{reason}"
    );
    assert_eq!(stored[1].header("Outbox-Aggregate-Id"), Some("1"));
}

/// 400 rows in 1- to 3-row transactions, every third held for 0 to 2.5 s, while pgoutbox is
/// killed -9 ten times, at moments the deliveries do not know of, and restarted after its
/// 1 s duplicate window has passed, so that the window does not hide a row stored twice:
/// each event is delivered once, the rows delivered at once in commit order, no schedule
/// left behind. (How the tail is read past deliveries: `domain::source::TailSearch`'s
/// tests; a kill with a delivery last and rows unconfirmed is too rare here to rely on.)
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_among_deliveries_loses_and_doubles_nothing() {
    // On a server before 2.12 the refusal is the first test's.
    let Some((pg, nats, js)) = servers_with_schedules().await else { return };
    let first = start(&pg, &nats);
    wait_until_streaming(&pg, &first).await;
    drop(first);

    let mut random = Lcg::from_time();
    let mut sql = String::new();
    let mut n = 0;
    while n < 400 {
        sql.push_str("BEGIN;\n");
        for _ in 0..random.between(1, 3).min(400 - n as u64) {
            let at = match n % 3 {
                2 => format!("now() + interval '{} ms'", random.between(0, 2_500)),
                _ => "NULL".to_owned(),
            };
            sql.push_str(&insert(n, &at));
            n += 1;
        }
        sql.push_str("COMMIT;\nSELECT pg_sleep(0.02);\n");
    }
    let writer = pg.psql_in_background(sql);
    for _ in 0..10 {
        let mut app = start(&pg, &nats);
        tokio::time::sleep(Duration::from_millis(random.between(300, 1_500))).await;
        app.kill9();
        // The fault: down past the duplicate window.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
    }
    writer.join().expect("writer").expect("inserts");
    let app = start(&pg, &nats);
    let what = format!("400 events, no schedule left\n{}", app.log());
    let stored = eventually(Duration::from_secs(60), &what, || async {
        let stored = read_all(&js, "OUTBOX").await;
        let waiting = stored.iter().any(|m| m.subject.starts_with("schedules."));
        (!waiting && events(&stored).len() >= 400).then_some(stored)
    })
    .await;
    let events = events(&stored);
    let mut unique = events.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 400, "every row once");
    assert_eq!(events.len(), 400, "none twice: {events:?}");
    let at_once: Vec<usize> = events
        .iter()
        .map(|e| e.parse::<usize>().expect("an aggregate id"))
        .filter(|n| n % 3 != 2)
        .collect();
    assert!(at_once.windows(2).all(|w| w[0] < w[1]), "commit order: {at_once:?}");
    let letters = stored.iter().filter(|m| m.subject == "outbox.dead_letter").count();
    assert_eq!(letters, 0, "no dead letter: {stored:?}");
}

/// Issue 45, item 7: 600 scheduled rows delivered at once sit at the stream's end; a
/// restart looks back past them for pgoutbox's newest row. Asked one message at a time, 600
/// answers from a server 3 ms away outlast the attempt's 1 s for reading the tail, and
/// every attempt failed with "no stream leader?": the next row was never stored.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_behind_a_burst_of_deliveries_from_a_far_server_goes_on() {
    // On a server before 2.12 the refusal is the first test's.
    let Some((pg, nats, js)) = servers_with_schedules().await else { return };
    let proxy = FaultProxy::start(nats.port()).await;
    let via_proxy = || {
        let mut cmd = command(&pg, &nats);
        cmd.env("PGOUTBOX_NATS_URL", proxy.url()).args(["run", SCHEDULE]);
        Pgoutbox::spawn(cmd)
    };
    let app = via_proxy();
    wait_until_streaming(&pg, &app).await;
    let burst: String = (0..600).map(|n| insert(n, "now() + interval '2 seconds'")).collect();
    pg.psql(&format!("BEGIN;\n{burst}COMMIT;"));
    let what = format!("600 deliveries, no schedule left\n{}", app.log());
    eventually(Duration::from_secs(60), &what, || async {
        let stored = read_all(&js, "OUTBOX").await;
        let waiting = stored.iter().any(|m| m.subject.starts_with("schedules."));
        (!waiting && events(&stored).len() >= 600).then_some(())
    })
    .await;
    drop(app);

    proxy.set_latency(Duration::from_millis(3));
    let app = via_proxy();
    pg.psql(&insert(600, "NULL"));
    let what = format!("the row after the burst stored\n{}", app.log());
    eventually(Duration::from_secs(30), &what, || async {
        let stored = read_all(&js, "OUTBOX").await;
        (events(&stored).len() >= 601).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(events(&stored).len(), 601, "each row once");
    assert!(!app.log().contains("no stream leader?"), "{}", app.log());
}

/// A scheduled row published again by `pgoutbox replay` is the same event: its delivery's
/// `Pgoutbox-Event-Id` is the row's id, not the replay's message id. The consumer soak
/// (issue 57, seed 2) applied such a row twice: the header said
/// `replay:<replay id>/<n>:<id>`, which a consumer takes as the event's key.
#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_scheduled_row_is_delivered_under_its_own_event_id() {
    let Some((pg, nats, js)) = servers_with_schedules().await else { return };
    let app = start(&pg, &nats);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&insert(1, "now() + interval '1 second'"));
    wait_for_events(&js, &["1"], &app).await;
    let id = pg.psql("SELECT id FROM outbox WHERE aggregate_id = '1'");
    let replayed =
        command(&pg, &nats).args([SCHEDULE, "replay", "--ids", &id]).output().expect("replay runs");
    let said = String::from_utf8_lossy(&replayed.stderr);
    assert!(replayed.status.success(), "{said}");
    let stored = wait_for_events(&js, &["1", "1"], &app).await;
    let ids: Vec<Option<&str>> = stored
        .iter()
        .filter(|m| m.subject == "outbox.order.created")
        .map(|m| m.header("Pgoutbox-Event-Id"))
        .collect();
    assert_eq!(ids, [Some(id.as_str()), Some(id.as_str())], "both deliveries, one event");
    drop(app);
}

/// A restart whose stream ends with a delivery of a row older than the newest row pgoutbox
/// wrote: the tail is that row, stored before the delivery, and the horizon must look for
/// it at its own sequence. Before: it looked for the row at the stream's last sequence,
/// found the delivery there, took the stream for one that lost events and ended every
/// attempt at its first look, forever: the slot never moved again (found by the consumer
/// soak, 30 minutes, seed 11, once its writer stopped).
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_behind_the_delivery_of_an_older_row_confirms_on() {
    let Some((pg, nats, js)) = servers_with_schedules().await else { return };
    // A horizon longer than the wait for the delivery: row 2 is not confirmed at the kill,
    // so the restart's horizon rests on the tail.
    let args = [SCHEDULE, "--durability-horizon", "8s"];
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    // Row 1 is due in 2 s; row 2, committed after it, goes out at once.
    pg.psql(&insert(1, "now() + interval '2 seconds'"));
    pg.psql(&insert(2, "NULL"));
    let committed = pg.psql("SELECT pg_current_wal_lsn()");
    let stored = wait_for_events(&js, &["2", "1"], &app).await;
    assert!(stored.last().is_some_and(|m| m.header("Nats-Scheduler").is_some()), "{stored:?}");
    app.kill9();

    // Nothing new is written: what the slot confirms rests on the tail alone.
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let what = format!("the slot confirmed past row 2 ({committed})\n{}", app.log());
    eventually(Duration::from_secs(30), &what, || async {
        let query = format!(
            "SELECT confirmed_flush_lsn >= '{committed}' FROM pg_replication_slots \
             WHERE slot_name = 'pgoutbox'"
        );
        (pg.psql(&query) == "t").then_some(())
    })
    .await;
    assert!(!app.log().contains("no longer holds the message"), "{}", app.log());
}

/// A `--recover` whose missing rows include rows already due: each batch the server
/// delivers overtakes the seed's next row and ends the attempt. Before: each attempt read
/// the table again from its first row, and the seed's progress (`pgoutbox_seed_rows_done`)
/// fell back to 0 at every delivery: with ~250,000 rows the stream held, ~14 s per attempt
/// went to reading them again, and the recovery crawled (the consumer soak, 30 minutes,
/// seed 11). Now an attempt reads on past the rows the stream is known to hold.
#[tokio::test(flavor = "multi_thread")]
async fn a_recovery_among_rows_already_due_reads_past_what_the_stream_holds() {
    let Some((pg, nats, js)) = servers_with_schedules().await else { return };
    const HELD: usize = 30_000;
    const MISSING: usize = 20_000;
    let mut app = start(&pg, &nats);
    wait_until_streaming(&pg, &app).await;
    let rows = |from: usize, to: usize, at: &str| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, deliver_at) \
             SELECT 'order', n::text, 'created', '{{}}', {at} \
             FROM generate_series({from}, {to}) n"
        )
    };
    pg.psql(&rows(1, HELD, "NULL"));
    let what = format!("{HELD} rows stored\n{}", app.log());
    eventually(Duration::from_secs(120), &what, || async {
        (crate::support::stream::count(&js, "OUTBOX").await >= HELD as u64).then_some(())
    })
    .await;
    app.kill9();
    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    // While no slot exists: one row in 50 already due.
    let due = "CASE WHEN n % 50 = 0 THEN now() - interval '1 second' END";
    pg.psql(&rows(HELD + 1, HELD + MISSING, due));

    let started = std::time::Instant::now();
    let app = Pgoutbox::run(&pg, &nats, &[SCHEDULE, "--recover"]);
    // The seed's progress, sampled: its least once past the rows the stream held.
    let mut least_past_held: Option<f64> = None;
    let what = format!("the seed finished\n{}", app.log());
    eventually(Duration::from_secs(300), &what, || {
        // One scrape: a finished seed sets both to 0.
        let scrape = crate::support::http_get(app.http_port(), "/metrics").map(|(_, text)| text);
        let value = |series: &str| -> Option<f64> {
            let text = scrape.as_deref()?;
            let line = text.lines().find(|l| l.starts_with(series))?;
            line.rsplit(' ').next()?.parse().ok()
        };
        let seeding = value("pgoutbox_seed_rows ").is_some_and(|total| total > 0.0);
        if let Some(done) = value("pgoutbox_seed_rows_done ").filter(|_| seeding) {
            let past = least_past_held.is_some() || done > HELD as f64;
            if past {
                least_past_held = Some(least_past_held.map_or(done, |least| least.min(done)));
            }
        }
        let finished = app.log().contains("seed finished");
        async move { finished.then_some(()) }
    })
    .await;
    let attempts = app.log().matches("streaming on behind it").count();
    eprintln!(
        "recovery of {MISSING} rows behind {HELD} held: {:?}, {attempts} attempts ended by \
         deliveries, least progress past the held rows: {least_past_held:?}",
        started.elapsed()
    );
    assert!(attempts > 0, "no delivery overtook the seed: the test shows nothing\n{}", app.log());
    let least = least_past_held.expect("progress sampled past the held rows");
    assert!(least >= HELD as f64, "the seed's progress fell back to {least}\n{}", app.log());
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(events(&stored).len(), HELD + MISSING, "each row once");
}

/// Rows committed while nats-server writes a burst of deliveries into the stream are stored
/// once and wait for no backoff. Each delivery between two publishes ends an attempt; the
/// next looked for pgoutbox's newest row behind at most 1,024 deliveries, then took the
/// newest delivery's row, committed before every row here, and published them all again
/// (stored twice past the 1 s duplicate window: 219 of 300 before); and an attempt that
/// restarted during the burst was overtaken again before its first ack and waited the
/// backoff of a refusal (200 ms, then 400; a row waited 3.4 s). The benchmark
/// (`--schedules`, 400 scheduled rows a second) measured the rows beside them at 493 ms
/// p99, 7.6 ms without.
#[tokio::test(flavor = "multi_thread")]
async fn rows_committed_during_a_burst_of_deliveries_are_stored_once_and_wait_for_no_backoff() {
    let Some((pg, nats, js)) = servers_with_schedules().await else { return };
    let app = start(&pg, &nats);
    wait_until_streaming(&pg, &app).await;
    const BURST: usize = 3_000;
    const ROWS: usize = 300;
    let burst: String = (0..BURST).map(|n| insert(n, "now() + interval '3 seconds'")).collect();
    pg.psql(&format!("BEGIN;\n{burst}COMMIT;"));
    let what = format!("{BURST} schedules stored\n{}", app.log());
    eventually(Duration::from_secs(30), &what, || async {
        (crate::support::stream::count(&js, "OUTBOX").await >= BURST as u64).then_some(())
    })
    .await;
    // One row every 10 ms for 3 s, from before the burst is due until after it.
    let (client, connection) =
        tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let mut next = tokio::time::Instant::now();
    for n in BURST..BURST + ROWS {
        tokio::time::sleep_until(next).await;
        let row = format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES \
             ('order', '{n}', 'created', jsonb_build_object('n', {n}, 't', \
             extract(epoch from clock_timestamp())))"
        );
        client.batch_execute(&row).await.expect("insert");
        next += Duration::from_millis(10);
    }
    let what = format!("{} events\n{}", BURST + ROWS, app.log());
    let stored = eventually(Duration::from_secs(60), &what, || async {
        let stored = read_all(&js, "OUTBOX").await;
        (events(&stored).len() >= BURST + ROWS).then_some(stored)
    })
    .await;
    let delivered: Vec<&Stored> =
        stored.iter().filter(|m| m.header("Nats-Scheduler").is_some()).collect();
    let burst_ms = match (delivered.first(), delivered.last()) {
        (Some(first), Some(last)) => (last.stored_at_nanos - first.stored_at_nanos) / 1_000_000,
        _ => 0,
    };
    let mut waits: Vec<f64> = stored
        .iter()
        .filter(|m| m.header("Nats-Scheduler").is_none() && m.subject.starts_with("outbox."))
        .filter_map(|m| {
            let committed = m.json()["t"].as_f64()?;
            Some(m.stored_at_nanos as f64 / 1e6 - committed * 1e3)
        })
        .collect();
    waits.sort_by(f64::total_cmp);
    let longest = waits.last().copied().unwrap_or_default();
    let overtaken = app.log().matches("streaming on behind it").count();
    eprintln!(
        "{} rows beside {} deliveries written over {burst_ms} ms: commit to stored p50 {:.1} \
         ms, longest {longest:.1} ms; {overtaken} attempts overtaken",
        waits.len(),
        delivered.len(),
        waits[waits.len() / 2],
    );
    assert_eq!(waits.len(), ROWS, "each row once");
    assert!(
        longest < 150.0,
        "a row waited {longest:.1} ms for its attempt to restart behind the deliveries\n{}",
        app.log()
    );
}
