//! An operator releases a stream's claim the natural way: `nats kv del` or `nats kv purge`
//! on the key, or deleting the bucket. The claim is then free: pgoutbox claims it again
//! (re-creating a deleted bucket) and streams on, losing and repeating nothing. Before,
//! a deletion marker read as "another source ()" and pgoutbox exited on every start.

use std::time::Duration;

use async_nats::HeaderMap;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{
    Nats, Postgres, eventually, numbered_rows, stop_and_wait_released, wait_until_streaming,
};

const CLAIM: &str = "$KV.pgoutbox_writers.OUTBOX";

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_purged_or_dropped_claim_is_free_again() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let js = jetstream(&nats.url()).await;
    // What `nats kv del`, `nats kv purge` and `nats stream rm KV_pgoutbox_writers` do.
    let releases: [(&str, &[(&str, &str)]); 3] = [
        ("kv del", &[("KV-Operation", "DEL")]),
        ("kv purge", &[("KV-Operation", "PURGE"), ("Nats-Rollup", "sub")]),
        ("bucket deleted", &[]),
    ];
    let mut rows = 0;
    for (how, headers) in releases {
        let app = Pgoutbox::run(&pg, &nats, &[]);
        wait_until_streaming(&pg, &app).await;
        pg.psql(&numbered_rows(rows, rows + 10, 5));
        rows += 10;
        eventually(Duration::from_secs(20), "the rows stored", || async {
            (count(&js, "OUTBOX").await == rows as u64).then_some(())
        })
        .await;
        stop_and_wait_released(&pg, app).await;
        if headers.is_empty() {
            js.delete_stream("KV_pgoutbox_writers").await.expect("delete the bucket");
        } else {
            let mut marker = HeaderMap::new();
            for (name, value) in headers {
                marker.insert(*name, *value);
            }
            let ack = js.publish_with_headers(CLAIM, marker, "".into()).await.expect(how);
            ack.await.expect(how);
        }
    }
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(rows, rows + 10, 5));
    rows += 10;
    eventually(Duration::from_secs(20), "the rows after the last release stored", || async {
        (count(&js, "OUTBOX").await == rows as u64).then_some(())
    })
    .await;
    let report = audit(&read_all(&js, "OUTBOX").await, rows);
    assert_eq!(
        (report.stored, report.duplicates, report.order_violations, report.lost),
        (rows, 0, 0, 0),
        "{report:?}\n{}",
        app.log()
    );
    let claim = js.get_stream("KV_pgoutbox_writers").await.expect("the bucket is back");
    let held = claim.get_last_raw_message_by_subject(CLAIM).await.expect("the claim is back");
    assert!(!held.payload.is_empty(), "the claim names its source again");
}
