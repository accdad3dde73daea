//! `{$partition}` with `--partitions N` gives each aggregate id the partition nats-server's
//! own subject mapping `{{partition(N, token)}}` gives the same token: 10,000 ids (ASCII,
//! digits, UUIDs, non-ASCII UTF-8) go through a real server's mapping and through
//! `pgoutbox::domain::outbox::partition`, and every row pgoutbox streams carries it.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;
use pgoutbox::domain::outbox::partition;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::stream::{jetstream, read_all};
use crate::support::{Lcg, Nats, Postgres, eventually, wait_until_streaming};

/// A server whose global account maps `part<N>.<token>` to
/// `parted.<N>.<partition(N, token)>.<token>`, for N of 7 and 4.
fn mapping_server(dir: &tempfile::TempDir) -> Nats {
    let conf = dir.path().join("nats.conf");
    std::fs::write(
        &conf,
        "mappings = {\n\
           \"part7.*\": \"parted.7.{{partition(7,1)}}.{{wildcard(1)}}\"\n\
           \"part4.*\": \"parted.4.{{partition(4,1)}}.{{wildcard(1)}}\"\n\
         }\n",
    )
    .expect("write nats.conf");
    Nats::start_with_args(&["-c", conf.to_str().expect("a UTF-8 temp path")])
}

/// The partition nats-server's mapping gives each of `tokens` among `n` (7 or 4), in order.
async fn server_partitions(nats: &Nats, n: u32, tokens: &[String]) -> Vec<u32> {
    let client = async_nats::connect(nats.url()).await.expect("test client connects");
    let mut mapped = client.subscribe(format!("parted.{n}.>")).await.expect("subscribe");
    client.flush().await.expect("flush the subscription");
    for (i, token) in tokens.iter().enumerate() {
        // The body is the token's place: the subject is the server's alone to make.
        let subject = format!("part{n}.{token}");
        client.publish(subject, i.to_string().into()).await.expect("publish");
    }
    client.flush().await.expect("flush the publishes");
    let mut partitions = vec![None; tokens.len()];
    let mut received = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while received < tokens.len() {
        let message = tokio::time::timeout_at(deadline, mapped.next())
            .await
            .unwrap_or_else(|_| panic!("{received} of {} mapped messages came back", tokens.len()))
            .expect("the subscription stays open");
        let i: usize = std::str::from_utf8(&message.payload).unwrap().parse().unwrap();
        let rest = message.subject.strip_prefix(&format!("parted.{n}.")).unwrap();
        let (partition, token) = rest.split_once('.').unwrap();
        assert_eq!(token, tokens[i], "the mapping's wildcard(1) is the token sent");
        assert!(partitions[i].replace(partition.parse::<u32>().unwrap()).is_none());
        received += 1;
    }
    partitions.into_iter().map(|p| p.expect("every token mapped once")).collect()
}

/// `count` valid subject tokens, a quarter each: printable ASCII (no `.`, `*`, `>` nor
/// space), digits, UUIDs and non-ASCII UTF-8 (Latin, Cyrillic, CJK, emoji).
fn aggregate_ids(rng: &mut Lcg, count: usize) -> Vec<String> {
    let ascii: Vec<char> = ('!'..='~').filter(|c| !".*>".contains(*c)).collect();
    let wide: Vec<char> = "ÄÖüßéñøç-ключзначение日本語中文한국어🙂🚀_0123".chars().collect();
    let pick = |rng: &mut Lcg, from: &[char], len: u64| -> String {
        (0..rng.between(1, len)).map(|_| from[rng.between(0, from.len() as u64) as usize]).collect()
    };
    let mut ids = vec!["ÄÖü-ключ-日本".to_owned(), "order-42".to_owned(), "0".to_owned()];
    while ids.len() < count {
        let id = match ids.len() % 4 {
            0 => pick(rng, &ascii, 40),
            1 => rng.between(0, u64::MAX / 2).to_string(),
            2 => {
                let hex = |rng: &mut Lcg, digits: usize| -> String {
                    (0..digits).map(|_| format!("{:x}", rng.between(0, 16))).collect()
                };
                let (a, b, c, d, e) =
                    (hex(rng, 8), hex(rng, 4), hex(rng, 4), hex(rng, 4), hex(rng, 12));
                format!("{a}-{b}-{c}-{d}-{e}")
            }
            _ => {
                let mut id = pick(rng, &wide, 24);
                if id.is_ascii() {
                    id.push('é');
                }
                id
            }
        };
        ids.push(id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_aggregate_ids_get_the_partition_nats_server_maps_them_to() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nats = mapping_server(&dir);
    let ids = aggregate_ids(&mut Lcg::from_time(), 10_000);
    assert!(ids.iter().filter(|id| !id.is_ascii()).count() >= 2_500);
    for n in [7, 4] {
        let server = server_partitions(&nats, n, &ids).await;
        let mismatches: Vec<_> = ids
            .iter()
            .zip(&server)
            .filter(|(id, server)| partition(id.as_bytes(), n) != **server)
            .collect();
        eprintln!("{} ids, {n} partitions: {} mismatches", ids.len(), mismatches.len());
        let first: Vec<_> = mismatches.iter().take(10).collect();
        assert!(mismatches.is_empty(), "of {n}, (id, server's partition): {first:?}");
        let used: std::collections::HashSet<_> = server.iter().collect();
        assert_eq!(used.len(), n as usize, "all {n} partitions are used");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn each_row_is_streamed_on_its_aggregates_partition_and_a_null_id_is_a_dead_letter() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let nats = mapping_server(&dir);
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql("ALTER TABLE outbox ALTER COLUMN aggregate_id DROP NOT NULL");
    let args = ["--subject-template", "orders.{$partition}.{event_type}", "--partitions", "4"];
    let app = Pgoutbox::run(&pg, &nats, &args);
    wait_until_streaming(&pg, &app).await;

    let ids = aggregate_ids(&mut Lcg::from_time(), 300);
    let (db, connection) =
        tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let insert = "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                  VALUES ('order', $1, 'placed', jsonb_build_object('n', $2::int))";
    for (c, chunk) in ids.chunks(50).enumerate() {
        db.batch_execute("BEGIN").await.expect("begin");
        for (i, id) in chunk.iter().enumerate() {
            let n = (c * 50 + i) as i32;
            db.execute(insert, &[&Some(id.as_str()), &n]).await.expect("insert");
        }
        db.batch_execute("COMMIT").await.expect("commit");
    }
    db.execute(insert, &[&None::<&str>, &-1i32]).await.expect("insert a NULL aggregate id");

    let js = jetstream(&nats.url()).await;
    let total = ids.len() + 1;
    eventually(Duration::from_secs(60), "every row stored", || async {
        (crate::support::stream::count(&js, "OUTBOX").await >= total as u64).then_some(())
    })
    .await;
    let stored = read_all(&js, "OUTBOX").await;
    assert_eq!(stored.len(), total);
    let server: HashMap<&str, u32> =
        ids.iter().map(String::as_str).zip(server_partitions(&nats, 4, &ids).await).collect();
    for message in &stored[..ids.len()] {
        let id = message.header("Outbox-Aggregate-Id").expect("the aggregate id header");
        let expected = partition(id.as_bytes(), 4);
        assert_eq!(message.subject, format!("orders.{expected}.placed"), "{id:?}");
        assert_eq!(server[id], expected, "the server's partition of {id:?}");
    }
    let letter = &stored[ids.len()];
    assert_eq!(letter.subject, "outbox.dead_letter");
    let reason = letter.header("Pgoutbox-Dead-Letter-Reason").unwrap_or_default();
    assert!(reason.contains("aggregate_id is NULL") && reason.contains("{$partition}"), "{reason}");
    drop(app);
}
