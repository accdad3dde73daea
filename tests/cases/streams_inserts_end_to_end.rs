//! 10,000 rows in 100 transactions arrive as exactly 10,000 messages, in commit order, with
//! the right subjects, bodies and headers; rolled-back rows and other tables never appear.

use std::time::Duration;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{audit, count, jetstream, read_all};
use crate::support::{Nats, Postgres, eventually, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn streams_committed_inserts_in_commit_order_with_headers() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("CREATE TABLE other (id int)");
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    pg.psql(
        "BEGIN; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'rolled-back', 'created', '{\"n\": -1}'); ROLLBACK;",
    );
    let mut script = String::new();
    for tx in 0..100 {
        script.push_str("BEGIN;\n");
        script.push_str(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
             SELECT 'order', 'agg-' || n, CASE WHEN n % 2 = 0 THEN 'created' ELSE 'paid' END, \
                    jsonb_build_object('n', n), jsonb_build_object('Trace-Id', 't' || n) \
             FROM generate_series({}, {}) AS n;\n",
            tx * 100,
            tx * 100 + 99
        ));
        script.push_str("INSERT INTO other VALUES (1);\nCOMMIT;\n");
    }
    pg.psql(&script);

    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(60), "10,000 messages stored", || async {
        (count(&js, "OUTBOX").await >= 10_000).then_some(())
    })
    .await;
    let messages = read_all(&js, "OUTBOX").await;
    let report = audit(&messages, 10_000);
    assert_eq!(report.stored, 10_000, "{report:?}");
    assert_eq!((report.duplicates, report.order_violations, report.lost), (0, 0, 0));

    let ids: Vec<String> = pg
        .psql("SELECT id FROM outbox ORDER BY (payload->>'n')::int")
        .lines()
        .map(str::to_owned)
        .collect();
    for (n, m) in messages.iter().enumerate() {
        let kind = if n % 2 == 0 { "created" } else { "paid" };
        assert_eq!(m.subject, format!("outbox.order.{kind}"));
        assert_eq!(m.json(), serde_json::json!({ "n": n }));
        assert_eq!(m.header("Nats-Msg-Id"), Some(ids[n].as_str()));
        assert_eq!(m.header("Outbox-Aggregate-Type"), Some("order"));
        assert_eq!(m.header("Outbox-Aggregate-Id"), Some(format!("agg-{n}").as_str()));
        assert_eq!(m.header("Outbox-Event-Type"), Some(kind));
        assert!(m.header("Outbox-Created-At").is_some());
        assert_eq!(m.header("Trace-Id"), Some(format!("t{n}").as_str()));
    }
    drop(app);
}

#[tokio::test(flavor = "multi_thread")]
async fn interleaved_transactions_arrive_in_commit_order_and_contiguous() {
    let pg = Postgres::start();
    let nats = Nats::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    let app = Pgoutbox::run(&pg, &nats, &[]);
    wait_until_streaming(&pg, &app).await;

    let (first, first_conn) =
        tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(first_conn);
    let (second, second_conn) =
        tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(second_conn);
    let insert = |tx: &'static str, i: i32| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('t', '{tx}', 'e', '{{\"tx\": \"{tx}\", \"i\": {i}}}')"
        )
    };
    first.batch_execute("BEGIN").await.unwrap();
    second.batch_execute("BEGIN").await.unwrap();
    for i in 0..50 {
        first.batch_execute(&insert("a", i)).await.unwrap();
        second.batch_execute(&insert("b", i)).await.unwrap();
    }
    // b commits first, so all of b must come before all of a.
    second.batch_execute("COMMIT").await.unwrap();
    first.batch_execute("COMMIT").await.unwrap();

    let js = jetstream(&nats.url()).await;
    eventually(Duration::from_secs(30), "100 messages stored", || async {
        (count(&js, "OUTBOX").await >= 100).then_some(())
    })
    .await;
    let got: Vec<(String, i64)> = read_all(&js, "OUTBOX")
        .await
        .iter()
        .map(|m| {
            let v = m.json();
            (v["tx"].as_str().unwrap().to_owned(), v["i"].as_i64().unwrap())
        })
        .collect();
    let expected: Vec<(String, i64)> =
        ["b", "a"].iter().flat_map(|tx| (0..50).map(move |i| (tx.to_string(), i))).collect();
    assert_eq!(got, expected);
    drop(app);
}
