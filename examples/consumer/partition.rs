//! `PARTITION=<p>`: one process per partition. Partition `p` is read with the
//! transactions' ends in one ordered consumer; a transaction's part on `p` is the events of
//! its commit LSN before its end, which says how many there are.

use std::collections::BTreeMap;

use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::{self, stream::Stream};
use futures_util::StreamExt;

use crate::message::{Event, event, fetched};
use crate::store::{event_applied, record, resume_point};
use crate::{Error, setting};

/// Reads partition `partition` and the ends on `TRANSACTION_SUBJECT` (`<root>.transactions`
/// by default), applying each part when its end arrives.
pub async fn consume(
    db: &mut tokio_postgres::Client,
    js: &jetstream::Context,
    stream: Stream,
    (root, partition): (&str, &str),
) -> Result<(), Error> {
    // Before 2.10 the server ignores a consumer's several filter subjects: it would read
    // every partition.
    let version = js.client().server_info().version;
    let release: Vec<u32> = version.split('.').take(2).filter_map(|n| n.parse().ok()).collect();
    if release < vec![2, 10] {
        return Err(format!("PARTITION needs nats-server 2.10 or later (it is {version})").into());
    }
    let ends = setting("TRANSACTION_SUBJECT", &format!("{root}.transactions"));
    let lane = partition.parse()?;
    println!("consumer: reading partition {lane} and the transactions' ends on {ends}");
    let filters = vec![format!("{root}.{lane}.*.*"), ends.clone()];
    consume_partition(db, js, (stream, lane, filters), &ends).await
}

/// Partition `lane` alone, read with the transactions' ends (`filters`) in stream order:
/// the events of a transaction on it are those before its end, applied when it arrives.
async fn consume_partition(
    db: &mut tokio_postgres::Client,
    js: &jetstream::Context,
    (stream, lane, filters): (Stream, usize, Vec<String>),
    ends: &str,
) -> Result<(), Error> {
    let config = OrderedConfig {
        filter_subjects: filters,
        deliver_policy: resume_point(db, &stream, lane).await?,
        ..Default::default()
    };
    let mut messages = stream.create_consumer(config).await?.messages().await?;
    // The events of the transaction whose end is next: all of one commit LSN.
    let mut part: Vec<Event> = Vec::new();
    while let Some(message) = messages.next().await {
        let message = message?;
        let info = message.info()?;
        let at = (info.stream_sequence, info.published.unix_timestamp_nanos() as i64);
        if message.subject.as_str() == ends {
            let end: serde_json::Value = match serde_json::from_slice(&message.payload) {
                Ok(end) => end,
                Err(err) => {
                    eprintln!("consumer: an end skipped at {}: {err}", at.0);
                    continue;
                }
            };
            let commit = end["commit_lsn"].as_str().unwrap_or_default().to_owned();
            let counted = end["partitions"][lane.to_string()].as_u64().unwrap_or(0) as usize;
            let events = std::mem::take(&mut part);
            let whole = events.len() == counted && events.iter().all(|e| e.transaction == commit);
            let name = format!("{commit}/{lane}");
            // A part read again after a rewind may begin short: applied before, it is nothing.
            if record(db, &name, &events, [(lane, at)].into()).await? && !whole {
                eprintln!(
                    "consumer: transaction {commit} has {} events on partition {lane}, its end \
                     counts {counted}: applied as it is",
                    events.len()
                );
            }
            continue;
        }
        let event = match event(lane, &message) {
            Ok(event) if event_applied(db, &event.id).await? => event,
            Ok(event) => fetched(js, event).await?,
            Err(why) => {
                eprintln!("consumer: a message skipped: {why}");
                continue;
            }
        };
        let delivered = message.headers.as_ref().is_some_and(|h| h.get("Nats-Scheduler").is_some());
        let seeded = event.transaction.starts_with("seed:");
        let cut = |first: &Event| seeded || first.transaction != event.transaction;
        if !delivered && part.first().is_some_and(cut) {
            // The part before never got its end: its transaction was cut when the slot was
            // lost, and a seed brings the rest, each row a transaction of its own.
            apply_cut(db, std::mem::take(&mut part), lane).await?;
        }
        if delivered || seeded {
            // An event of its own: a schedule's delivery, stored at its time; a seeded row.
            let name = match delivered {
                true => format!("delivery:{}", event.id),
                false => event.transaction.clone(),
            };
            // Read past the part still waiting for its end only once that part is applied.
            let through = match part.is_empty() {
                true => [(lane, at)].into(),
                false => BTreeMap::new(),
            };
            record(db, &name, std::slice::from_ref(&event), through).await?;
        } else {
            part.push(event);
        }
    }
    Ok(())
}

/// Applies the part of a transaction that will never get its end, as it is, and says so.
async fn apply_cut(
    db: &mut tokio_postgres::Client,
    part: Vec<Event>,
    lane: usize,
) -> Result<(), Error> {
    let Some(last) = part.last() else { return Ok(()) };
    let (commit, through) = (last.transaction.clone(), (last.sequence, last.stored_at));
    eprintln!(
        "consumer: transaction {commit} has {} events on partition {lane} and no end (its slot \
         was lost?): applied as it is",
        part.len()
    );
    record(db, &format!("{commit}/{lane}"), &part, [(lane, through)].into()).await?;
    Ok(())
}
