//! Payloads too large for a message (issue 48). With `--object-store`, a row whose message
//! would exceed the server's `max_payload` (1 MiB here) is stored in an Object Store bucket,
//! and its message, in its place in the chain, carries a pointer in headers (bucket, name,
//! size, SHA-256) and no payload. Without it such a row is a dead letter, as before.

use std::time::Duration;

use async_nats::jetstream::{self, object_store};

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{Stored, count, fetch_object, jetstream, read_all, sha256_hex};
use crate::support::{
    Nats, Postgres, eventually, peak_rss_bytes, stop_and_wait_released, wait_until_streaming,
};

pub(super) const BUCKET: &str = "PAYLOADS";
pub(super) const MIB: usize = 1024 * 1024;

/// Row `n`, whose payload is a JSON string of `len` bytes in all, `fill` repeated.
pub(super) fn row(n: usize, len: usize, fill: char) -> String {
    format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', '{n}', 'created', to_jsonb(repeat('{fill}', {})));",
        len - 2
    )
}

/// The payload `row` gives.
pub(super) fn payload(len: usize, fill: char) -> Vec<u8> {
    let mut bytes = vec![fill as u8; len];
    bytes[0] = b'"';
    bytes[len - 1] = b'"';
    bytes
}

/// The object a pointer names, read from its bucket, checked against the pointer's size and
/// digest.
pub(super) async fn fetched(js: &jetstream::Context, pointer: &Stored) -> Vec<u8> {
    fetch_object(js, pointer).await.unwrap_or_else(|why| panic!("{why}: {:?}", pointer.headers))
}

/// How many objects the bucket lists.
async fn objects(js: &jetstream::Context) -> usize {
    use futures_util::StreamExt;
    let store = js.get_object_store(BUCKET).await.expect("the bucket");
    store.list().await.expect("list").count().await
}

/// [`BUCKET`]'s settings, for a bucket made before pgoutbox starts.
pub(super) fn bucket() -> object_store::Config {
    object_store::Config { bucket: BUCKET.into(), ..Default::default() }
}

/// The servers, with the outbox table and the bucket `config` made beforehand.
pub(super) async fn servers_with(
    config: object_store::Config,
) -> (Postgres, Nats, jetstream::Context) {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    js.create_object_store(config).await.expect("the bucket made beforehand");
    (pg, nats, js)
}

pub(super) async fn stored(js: &jetstream::Context, n: u64) -> Vec<Stored> {
    eventually(Duration::from_secs(120), &format!("{n} messages stored"), || async {
        (count(js, "OUTBOX").await >= n).then_some(())
    })
    .await;
    read_all(js, "OUTBOX").await
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_too_large_for_a_message_are_stored_as_objects_in_their_place() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &["--object-store", BUCKET]);
    wait_until_streaming(&pg, &app).await;
    let baseline = peak_rss_bytes(app.pid());
    let rows = [(100, 'a'), (20 * MIB, 'b'), (100, 'c'), (100 * MIB, 'd'), (100, 'e')];
    for (n, (len, fill)) in rows.iter().enumerate() {
        pg.psql(&row(n, *len, *fill));
    }
    let js = jetstream(&nats.url()).await;
    let messages = stored(&js, rows.len() as u64).await;
    assert_eq!(messages.len(), rows.len(), "stored: {:?}", messages.len());
    for (n, ((len, fill), message)) in rows.iter().zip(&messages).enumerate() {
        let aggregate = message.subject.clone();
        let body = match *len > MIB {
            true => fetched(&js, message).await,
            false => message.payload.clone(),
        };
        assert!(body == payload(*len, *fill), "row {n} ({aggregate}): another payload");
        assert_eq!(message.header("Pgoutbox-Object-Bucket").is_some(), *len > MIB, "row {n}");
    }
    assert_eq!(objects(&js).await, 2, "one object a large row");
    // The payload once, plus a chunk and the allocator's slack: not a copy per step.
    let peak = peak_rss_bytes(app.pid());
    let (baseline_mib, peak_mib) = (baseline / MIB as u64, peak / MIB as u64);
    eprintln!("peak RSS: {baseline_mib} MiB before the rows, {peak_mib} MiB after a 100 MiB row");
    assert!(peak_mib < baseline_mib + 140, "peak RSS {peak_mib} MiB ({baseline_mib} before)");
}

/// Killed while the object's chunks are stored, then again once the object is listed (its
/// pointer sent or not): each restart decodes the row at the same position and stores it
/// again under the same name, which replaces the object.
#[tokio::test(flavor = "multi_thread")]
async fn a_kill_9_between_the_object_and_its_pointer_leaves_one_object_and_one_pointer() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let args = ["--object-store", BUCKET];
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let js = jetstream(&nats.url()).await;
    let chunks = format!("OBJ_{BUCKET}");
    pg.psql(&format!("{} {}", row(0, 100, 'a'), row(1, 100 * MIB, 'b')));
    eventually(Duration::from_secs(60), "chunks being stored", || async {
        (count(&js, &chunks).await >= 50).then_some(())
    })
    .await;
    app.kill9();
    let mut app = Pgoutbox::run(&pg, &nats, &args);
    eventually(Duration::from_secs(60), "the object listed", || async {
        (objects(&js).await >= 1).then_some(())
    })
    .await;
    app.kill9();
    let app = Pgoutbox::run(&pg, &nats, &args);
    // Committed after the large row: stored after its pointer, and after any second copy.
    pg.psql(&row(2, 100, 'c'));
    let messages = stored(&js, 3).await;
    assert_eq!(messages.len(), 3, "pointer stored twice or lost:\n{}", app.log());
    assert!(fetched(&js, &messages[1]).await == payload(100 * MIB, 'b'), "another payload");
    assert_eq!(objects(&js).await, 1, "a second copy of the object:\n{}", app.log());
    // The chunks of the put cut short are purged: the bucket holds the object and its name.
    let store = js.get_object_store(BUCKET).await.expect("the bucket");
    let name = messages[1].header("Pgoutbox-Object-Name").expect("a pointer");
    let object = store.info(name).await.expect("the object's info");
    let held = count(&js, &chunks).await;
    assert_eq!(held, object.chunks as u64 + 1, "chunks no object names are left:\n{}", app.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bucket_that_expires_objects_before_the_stream_is_refused_at_start() {
    let keeping_a_minute = object_store::Config { max_age: Duration::from_secs(60), ..bucket() };
    let (pg, nats, _) = servers_with(keeping_a_minute).await;
    let mut app = Pgoutbox::run(&pg, &nats, &["--object-store", BUCKET]);
    let status = app.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "ran on:\n{}", app.log());
    let error = app.error_line();
    assert!(error.contains("expires objects after 60s"), "{error:?}\n{}", app.log());
}

/// A NATS user that may not create the bucket gets no answer from JetStream, only the
/// server's `-ERR 'Permissions Violation ...'`: the start ends in one line naming the
/// subject and what to do, rather than waiting for an answer that never comes.
#[tokio::test(flavor = "multi_thread")]
async fn a_bucket_the_user_may_not_create_stops_the_start_in_one_line() {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = "authorization { users = [ { user: relay, password: pw, permissions: \
                  { publish: { deny: [\"$JS.API.STREAM.CREATE.OBJ_PAYLOADS\"] } } } ] }\n";
    let path = dir.path().join("nats.conf");
    std::fs::write(&path, config).expect("write nats.conf");
    let nats = Nats::start_with_args(&["-c", path.to_str().expect("UTF-8 path")]);
    let mut cmd = crate::support::pgoutbox::command(&pg, &nats);
    let url = format!("nats://relay:pw@127.0.0.1:{}", nats.port());
    cmd.env("PGOUTBOX_NATS_URL", url).args(["run", "--object-store", BUCKET]);
    let mut app = Pgoutbox::spawn(cmd);
    let status = app.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "ran on:\n{}", app.log());
    let error = app.error_line();
    let said = ["$JS.API.STREAM.CREATE.OBJ_PAYLOADS", "nats object add PAYLOADS"];
    assert!(said.iter().all(|s| error.contains(s)), "{error:?}\n{}", app.log());
}

/// A bucket full to its `max_bytes` refuses the chunks: the row becomes a dead letter in its
/// place, and the rows behind it are published.
#[tokio::test(flavor = "multi_thread")]
async fn a_payload_the_bucket_refuses_becomes_a_dead_letter_and_blocks_nothing() {
    let (pg, nats, js) =
        servers_with(object_store::Config { max_bytes: 2 * MIB as i64, ..bucket() }).await;
    let app = Pgoutbox::run(&pg, &nats, &["--object-store", BUCKET]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!("{} {} {}", row(0, 100, 'a'), row(1, 4 * MIB, 'b'), row(2, 100, 'c')));
    // Fits in the bucket once the refused put's chunks are purged.
    pg.psql(&row(3, 3 * MIB / 2, 'd'));
    let messages = stored(&js, 4).await;
    let subjects: Vec<&str> = messages.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(subjects[1], "outbox.dead_letter", "{subjects:?}\n{}", app.log());
    assert!(messages[2].payload == payload(100, 'c'), "the row behind it");
    let reason = messages[1].header("Pgoutbox-Dead-Letter-Reason").unwrap_or_default().to_owned();
    assert!(reason.contains("refused the payload"), "reason: {reason:?}");
    assert_eq!(messages[3].subject, "outbox.order.created", "the next large row:\n{}", app.log());
    assert!(fetched(&js, &messages[3]).await == payload(3 * MIB / 2, 'd'), "another payload");
}

/// A recovery and `verify` read what the stream holds to tell which rows are there: a
/// pointer carries no payload, and its object's SHA-256 says which payload it holds. A large
/// row whose pointer is in the stream is found, neither published again nor named missing.
#[tokio::test(flavor = "multi_thread")]
async fn a_recovery_and_verify_find_a_large_row_by_its_object() {
    let pg = Postgres::builder().conf("track_commit_timestamp = on").start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let args = ["--object-store", BUCKET];
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!("{} {} {}", row(0, 100, 'a'), row(1, 2 * MIB, 'b'), row(2, 100, 'c')));
    let js = jetstream(&nats.url()).await;
    stored(&js, 3).await;
    stop_and_wait_released(&pg, app).await;
    let verified = crate::support::pgoutbox::command(&pg, &nats).arg("verify").output();
    let verified = verified.expect("pgoutbox verify runs");
    let said = String::from_utf8_lossy(&verified.stdout).into_owned();
    assert!(said.contains("3 rows, 0 missing"), "verify: {said}");

    pg.psql("SELECT pg_drop_replication_slot('pgoutbox')");
    pg.psql(&row(3, 100, 'd'));
    let app = Pgoutbox::run(&pg, &nats, &["--object-store", BUCKET, "--recover"]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&row(4, 100, 'e'));
    let messages = stored(&js, 5).await;
    let subjects: Vec<&str> = messages.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(messages.len(), 5, "{subjects:?}\n{}", app.log());
    let fills: Vec<u8> =
        messages.iter().map(|m| if m.payload.is_empty() { b'b' } else { m.payload[1] }).collect();
    assert_eq!(fills, b"abcde", "{subjects:?}\n{}", app.log());
    assert_eq!(objects(&js).await, 1, "the large row stored again:\n{}", app.log());
}

/// nats-server with an admin and `relay`, which has exactly the permissions `relay_allows`
/// lists (publish) plus `_INBOX.>` (subscribe), the outbox table, and the bucket made by
/// the admin: the servers and the admin's JetStream context.
async fn servers_with_relay(relay_allows: &str) -> (Postgres, Nats, jetstream::Context) {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = format!(
        "authorization {{ users = [ {{ user: admin, password: pw }}, {{ user: relay, password: \
         pw, permissions: {{ publish: {{ allow: [{relay_allows}] }}, subscribe: {{ allow: \
         [\"_INBOX.>\"] }} }} }} ] }}\n"
    );
    let path = dir.path().join("nats.conf");
    std::fs::write(&path, config).expect("write nats.conf");
    let nats = Nats::start_with_args(&["-c", path.to_str().expect("UTF-8 path")]);
    let admin = async_nats::ConnectOptions::with_user_and_password("admin".into(), "pw".into());
    let client = admin.connect(nats.url()).await.expect("the admin connects");
    let js = jetstream::new(client);
    js.create_object_store(bucket()).await.expect("the bucket made by the admin");
    (pg, nats, js)
}

/// pgoutbox as `relay` (or the admin), with `--object-store`.
fn run_as(user: &str, pg: &Postgres, nats: &Nats) -> Pgoutbox {
    let mut cmd = crate::support::pgoutbox::command(pg, nats);
    let url = format!("nats://{user}:pw@127.0.0.1:{}", nats.port());
    cmd.env("PGOUTBOX_NATS_URL", url).args(["run", "--object-store", BUCKET]);
    Pgoutbox::spawn(cmd)
}

/// The permissions docs/operations.md listed for pgoutbox's NATS user.
const DOCUMENTED: &str = "\"outbox.>\", \"$JS.API.>\", \"$KV.pgoutbox_writers.>\"";

/// The S5: a user with the permissions the docs listed, none on the bucket's
/// subjects, and a bucket an admin made; a 2 MiB row and 5 small ones. Before, none was
/// stored after 60 s, the large row was tried again every 10 s without end, `/readyz` said
/// 200. Now the start ends in one line naming the subject and the permission to grant,
/// nothing is confirmed, and a run with the permission (here the admin's) stores all 6 in
/// order.
#[tokio::test(flavor = "multi_thread")]
async fn a_user_that_may_not_store_objects_stops_the_start_in_one_line_and_loses_nothing() {
    let (pg, nats, js) = servers_with_relay(DOCUMENTED).await;
    // Set up by the admin: the slot keeps what is written while pgoutbox cannot run.
    let app = run_as("admin", &pg, &nats);
    wait_until_streaming(&pg, &app).await;
    stop_and_wait_released(&pg, app).await;
    pg.psql(&row(0, 2 * MIB, 'a'));
    for n in 1..6 {
        pg.psql(&row(n, 100, 'b'));
    }
    let mut app = run_as("relay", &pg, &nats);
    let status = app.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "ran on:\n{}", app.log());
    let error = app.error_line();
    let said = ["$O.PAYLOADS.C.", "Permissions Violation", "grant it publish on $O.PAYLOADS.>"];
    assert!(said.iter().all(|s| error.contains(s)), "{error:?}\n{}", app.log());

    let app = run_as("admin", &pg, &nats);
    let messages = stored(&js, 6).await;
    assert_eq!(messages.len(), 6, "{}", app.log());
    assert_eq!(fetched(&js, &messages[0]).await, payload(2 * MIB, 'a'));
    let ids: Vec<_> = messages.iter().map(|m| m.header("Outbox-Aggregate-Id")).collect();
    assert_eq!(ids, ["0", "1", "2", "3", "4", "5"].map(Some), "{}", app.log());
    stop_and_wait_released(&pg, app).await;
}

/// A user that may store chunks but not name the object (`$O.<bucket>.M.>`) passes the
/// start's check; the put is refused with only the server's `-ERR`: the row becomes a dead
/// letter naming the subject, and the rows behind it are stored. Before, it was tried again
/// without end.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_object_name_makes_the_row_a_dead_letter_and_blocks_nothing() {
    let allows = format!("{DOCUMENTED}, \"$O.PAYLOADS.C.>\"");
    let (pg, nats, js) = servers_with_relay(&allows).await;
    let app = run_as("relay", &pg, &nats);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&row(0, 2 * MIB, 'a'));
    for n in 1..6 {
        pg.psql(&row(n, 100, 'b'));
    }
    let messages = stored(&js, 6).await;
    assert_eq!(messages[0].subject, "outbox.dead_letter", "{}", app.log());
    let reason = messages[0].json()["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("$O.PAYLOADS.M.") && reason.contains("grant"), "{reason}");
    let ids: Vec<_> = messages[1..].iter().map(|m| m.header("Outbox-Aggregate-Id")).collect();
    assert_eq!(ids, ["1", "2", "3", "4", "5"].map(Some), "{}", app.log());
    stop_and_wait_released(&pg, app).await;
}

/// An id of 3,000 bytes makes `<position>/<id>` too long for the subject that names the
/// object (`$O.<bucket>.M.<name in base64>` over nats-server's 4 KiB control line): the
/// object is named by the id's SHA-256, and the row and the one behind it are stored.
/// Before, the put was tried again without end.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_row_with_a_long_id_is_stored_under_its_ids_digest() {
    let (pg, nats, js) = servers_with(bucket()).await;
    pg.psql("ALTER TABLE outbox ALTER COLUMN id TYPE text, ALTER COLUMN id SET DEFAULT gen_random_uuid()::text;");
    let app = Pgoutbox::run(&pg, &nats, &["--object-store", BUCKET]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&format!(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES (repeat('i', 3000), 'order', '0', 'created', to_jsonb(repeat('a', {})));",
        2 * MIB - 2
    ));
    pg.psql(&row(1, 100, 'b'));
    let messages = stored(&js, 2).await;
    assert_eq!(messages[0].header("Nats-Msg-Id"), Some("i".repeat(3000).as_str()));
    let name = messages[0].header("Pgoutbox-Object-Name").unwrap_or_default().to_owned();
    assert!(name.contains("/sha256:") && name.len() < 100, "{name}\n{}", app.log());
    assert_eq!(fetched(&js, &messages[0]).await, payload(2 * MIB, 'a'));
    assert_eq!(messages[1].header("Outbox-Aggregate-Id"), Some("1"));
    stop_and_wait_released(&pg, app).await;
}

/// A large row whose id an older message has (a row deleted and its id used again) is a
/// collision: its dead letter goes in its place, and the object its put stored is deleted
/// rather than left without a pointer; nor is it stored again once the durability horizon
/// looks at the objects of the pointers acknowledged (before, the letter's acknowledgement
/// was taken for the pointer's, the look found the deleted object missing and stored it
/// again, without a pointer: the soak with large events found 10 at one attempt's start).
#[tokio::test(flavor = "multi_thread")]
async fn a_large_row_whose_id_was_taken_leaves_no_object_behind() {
    let (pg, nats, js) = servers_with(bucket()).await;
    let args = ["--object-store", BUCKET, "--durability-horizon", "2s"];
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let insert = |len: usize| {
        format!(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES \
             ('00000000-0000-0000-0000-000000000001', 'order', '0', 'created', \
             to_jsonb(repeat('a', {})));",
            len - 2
        )
    };
    pg.psql(&insert(100));
    stored(&js, 1).await;
    pg.psql(&format!("DELETE FROM outbox; {}", insert(2 * MIB)));
    // Alone in flight: its letter goes in its place within the same attempt.
    stored(&js, 2).await;
    pg.psql(&row(2, 100, 'c'));
    let messages = stored(&js, 3).await;
    assert_eq!(messages[1].subject, "outbox.dead_letter", "{}", app.log());
    let reason = messages[1].json()["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("id is taken"), "{reason}");
    assert_eq!(messages[2].header("Outbox-Aggregate-Id"), Some("2"));
    super::nats_forgets::slot_confirmed_everything(&pg).await;
    assert_eq!(objects(&js).await, 0, "the collided row's object left behind\n{}", app.log());
    assert!(!app.log().contains("stored again"), "{}", app.log());
    stop_and_wait_released(&pg, app).await;
}

/// Pointers read by a second client library: nats-py (tests/fixtures/object_pointers.py)
/// fetches every object a pointer names and checks it against the pointer's size and
/// SHA-256, so the pointer's format is not only what async-nats, which wrote it, reads.
#[tokio::test(flavor = "multi_thread")]
async fn pointers_and_their_objects_are_read_by_the_python_client() {
    let (pg, nats, js) = servers_with(bucket()).await;
    let app = Pgoutbox::run(&pg, &nats, &["--object-store", BUCKET]);
    wait_until_streaming(&pg, &app).await;
    let rows = [(100, 'a'), (2 * MIB, 'b'), (100, 'c'), (5 * MIB + 7, 'd')];
    for (n, (len, fill)) in rows.iter().enumerate() {
        pg.psql(&row(n, *len, *fill));
    }
    stored(&js, rows.len() as u64).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/object_pointers.py");
    let packages = std::env::var("PGOUTBOX_PYTHON_PACKAGES")
        .unwrap_or_else(|_| "/var/tmp/pgoutbox-python".to_owned());
    let out = std::process::Command::new("python3")
        .args([script, &nats.url(), "OUTBOX"])
        .env("PYTHONPATH", packages)
        .output()
        .expect("python3 runs (scripts/install-deps.sh)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "nats-py read ({}):\n{stderr}", out.status);
    let read: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object a line"))
        .collect();
    assert_eq!(read.len(), rows.len(), "{read:?}");
    for ((len, fill), message) in rows.iter().zip(&read) {
        assert_eq!(message["pointer"], *len > MIB, "{message}");
        if *len > MIB {
            assert_eq!(message["size"], *len, "{message}");
            assert_eq!(message["sha256"], sha256_hex(&payload(*len, *fill)), "{message}");
        }
    }
    stop_and_wait_released(&pg, app).await;
}

/// The bucket on `/metrics` and in `status`, and the rule for when objects go: with the
/// bucket's `max_age`, never before the stream's messages. A stream an admin made to keep
/// 1,000 messages drops pointers by count while a bucket without a bound keeps their objects
/// for good: one warning at start says so and what to set.
#[tokio::test(flavor = "multi_thread")]
async fn the_bucket_shows_on_metrics_and_in_status_and_objects_outliving_pointers_are_warned() {
    let (pg, nats, js) = servers_with(bucket()).await;
    js.create_stream(jetstream::stream::Config {
        name: "OUTBOX".into(),
        subjects: vec!["outbox.>".into()],
        max_messages: 1_000,
        ..Default::default()
    })
    .await
    .expect("a stream keeping 1,000 messages");
    let app = Pgoutbox::run(&pg, &nats, &["--object-store", BUCKET]);
    wait_until_streaming(&pg, &app).await;
    let warning = app.log().lines().find(|l| l.contains("keeps the objects")).map(str::to_owned);
    let warning = warning.unwrap_or_else(|| panic!("no warning:\n{}", app.log()));
    assert!(warning.contains("WARN") && warning.contains("max_age"), "{warning}");

    pg.psql(&row(0, 2 * MIB, 'a'));
    stored(&js, 1).await;
    let port = app.http_port();
    let stored_total = crate::support::metric(port, "pgoutbox_objects_stored_total ");
    assert_eq!(stored_total, Some(1.0), "{}", app.log());
    let bytes = crate::support::metric(port, "pgoutbox_object_store_bytes ").unwrap_or(0.0);
    assert!(bytes >= (2 * MIB) as f64, "the bucket holds {bytes} bytes");
    let out = crate::support::pgoutbox::command(&pg, &nats)
        .env("PGOUTBOX_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .args(["status", "--json"])
        .output()
        .expect("pgoutbox status runs");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let shown = report["pgoutbox"]["object_store_bytes"].as_u64().unwrap_or(0);
    assert!(shown >= (2 * MIB) as u64, "{report:#}");
    stop_and_wait_released(&pg, app).await;
}

/// A row whose object gets no answer at every attempt (here the bucket's stream was made
/// `no_ack` after the start: its chunks are stored and never acknowledged, as with a
/// permission the start could not check) is tried again without end: that is a stall,
/// `pgoutbox_stalled` 1 and `/readyz` 503 after `--stall-timeout`. Before, nothing was in
/// flight while a put waited, so the stall clock restarted at each attempt (the S5:
/// `pgoutbox_stalled` 0 and `/readyz` 200 for as long as it lasted).
#[tokio::test(flavor = "multi_thread")]
async fn a_row_tried_again_without_end_is_a_stall() {
    let (pg, nats, js) = servers_with(bucket()).await;
    let args = ["--object-store", BUCKET, "--stall-timeout", "5s"];
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let mut chunks = js.get_stream(format!("OBJ_{BUCKET}")).await.expect("the bucket's stream");
    let config = chunks.info().await.expect("its config").config.clone();
    js.update_stream(jetstream::stream::Config { no_ack: true, ..config })
        .await
        .expect("the bucket acknowledges nothing");
    pg.psql(&row(0, 2 * MIB, 'a'));
    let port = app.http_port();
    eventually(Duration::from_secs(60), "pgoutbox_stalled 1", || async {
        (crate::support::metric(port, "pgoutbox_stalled ") == Some(1.0)).then_some(())
    })
    .await;
    let ready = crate::support::http_get(port, "/readyz").map(|r| r.0);
    assert_eq!(ready, Some(503), "{}", app.log());
}

/// `--object-store-max-size`: a payload over it is not stored as an object (nor held for a
/// put): the row is a dead letter saying so, and the rows behind it, a large one under the
/// cap included, are stored in order. The cap keeps one row from costing more memory than
/// pgoutbox has (issue 58: a 200 MiB row under a 256 MiB limit, with no way to refuse it).
#[tokio::test(flavor = "multi_thread")]
async fn a_payload_over_the_size_cap_is_a_dead_letter_and_blocks_nothing() {
    let (pg, nats, js) = servers_with(bucket()).await;
    let args = ["--object-store", BUCKET, "--object-store-max-size", "2MiB"];
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;
    let rows = [(100, 'a'), (3 * MIB, 'b'), (MIB + MIB / 2, 'c'), (100, 'd')];
    for (n, (len, fill)) in rows.iter().enumerate() {
        pg.psql(&row(n, *len, *fill));
    }
    let messages = stored(&js, rows.len() as u64).await;
    assert_eq!(messages[1].subject, "outbox.dead_letter", "{}", app.log());
    let reason = messages[1].json()["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("over --object-store-max-size"), "{reason}");
    assert_eq!(fetched(&js, &messages[2]).await, payload(MIB + MIB / 2, 'c'));
    assert_eq!(messages[3].header("Outbox-Aggregate-Id"), Some("3"));
    assert_eq!(objects(&js).await, 1, "only the row under the cap is an object");
    stop_and_wait_released(&pg, app).await;
}
