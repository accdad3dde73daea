//! Reading the stream's messages back, headers only where that is enough: the ids of
//! rows the stream holds (for the seed) and of rows whose dead letter lacks the payload
//! (for `--retention`).

use std::collections::HashSet;

use super::{POSITION_HEADER, Publisher, PublisherError, is_no_message, request_error};
use crate::domain::delivery::OrderCheck;
use crate::domain::outbox::{
    DEAD_LETTER_ID_PREFIX, EMITTED_HEADER, MESSAGE_ID_HEADER, PAYLOAD_OMITTED_HEADER,
    SCHEDULER_HEADER, TABLE_HEADER, letter_row,
};
use crate::domain::progress::Position;
use crate::domain::seed::{HeldRows, PayloadDigest, REPLAY_HEADER, row_id_of};
use crate::domain::source::SOURCE_HEADER;
use crate::nats::large_payloads::{self, BUCKET_HEADER, DIGEST_HEADER, NAME_HEADER, SIZE_HEADER};

/// Where [`Publisher::row_ids`] starts reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReadFrom {
    Start,
    /// The first message stored at or after this time (epoch seconds).
    Time(f64),
    /// The message after this sequence.
    After(u64),
}

impl Publisher {
    /// The row ids of the messages from `from` to the stream's end, read as headers only,
    /// and the last sequence read: what a replay stored already (`commands::replay`).
    /// A dead letter's id names its row too.
    /// With `subject`, only the messages on it; with `only`, just the messages carrying
    /// that header with that value.
    pub async fn row_ids(
        &self,
        from: ReadFrom,
        subject: Option<&str>,
        only: Option<(&str, &str)>,
    ) -> Result<(HashSet<String>, u64), PublisherError> {
        let mut ids = HashSet::new();
        let last = self
            .read_messages(from, subject, true, |headers, _, _| {
                let header = |name: &str| headers?.get(name).map(|v| v.as_str());
                if only.is_some_and(|(name, value)| header(name) != Some(value)) {
                    return;
                }
                if let Some(id) = headers.and_then(|h| self.msg_id_of(h)) {
                    ids.insert(row_id_of(&id).to_owned());
                }
            })
            .await?;
        Ok((ids, last))
    }

    /// The positions of the dead letters `source` stored on `subjects` for the transaction
    /// committed at `commit_lsn`, among those stored at or after `since` (epoch seconds),
    /// read as headers only: what a restart in the middle of that transaction skips as
    /// stored, to count it as it is (`--transaction-subject`).
    pub async fn letters_of_transaction(
        &self,
        subjects: &[&str],
        since: f64,
        (source, commit_lsn): (&str, u64),
    ) -> Result<HashSet<Position>, PublisherError> {
        let mut positions = HashSet::new();
        for subject in subjects {
            self.read_messages(ReadFrom::Time(since), Some(subject), true, |headers, _, _| {
                let header = |name: &str| headers?.get(name).map(|v| v.as_str());
                let position = header(POSITION_HEADER).and_then(|p| p.parse::<Position>().ok());
                if let (Some(position), Some(true)) =
                    (position, header(SOURCE_HEADER).map(|s| s == source))
                    && position.commit_lsn == commit_lsn
                {
                    positions.insert(position);
                }
            })
            .await?;
        }
        Ok(positions)
    }

    /// The stream's last sequence now (0 when empty).
    pub async fn last_sequence(&self) -> Result<u64, PublisherError> {
        let mut stream = self.js.get_stream(&self.stream).await.map_err(request_error)?;
        Ok(stream.info().await.map_err(request_error)?.state.last_sequence)
    }

    /// The newest message after sequence `after` that carries header `name` with `value`,
    /// looked for from the stream's end backwards, one message at a time and at most
    /// `tries` of them: its sequence and its `Nats-Msg-Id`. A replay through pgoutbox asks
    /// for its own last row right after pgoutbox confirmed it, so it is found near the end,
    /// where reading the whole replay back cost as much as handing it over.
    pub async fn newest_with_header(
        &self,
        after: u64,
        (name, value): (&str, &str),
        tries: u64,
    ) -> Result<Option<(u64, String)>, PublisherError> {
        let mut stream = self.js.get_stream(&self.stream).await.map_err(request_error)?;
        let end = stream.info().await.map_err(request_error)?.state.last_sequence;
        for sequence in (after.saturating_add(1)..=end).rev().take(tries as usize) {
            let message = match stream.get_raw_message(sequence).await {
                Ok(message) => message,
                Err(err) if is_no_message(&err) => continue,
                Err(err) => return Err(request_error(err)),
            };
            let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
            if header(name).as_deref() == Some(value) {
                return Ok(Some((sequence, header(MESSAGE_ID_HEADER).unwrap_or_default())));
            }
        }
        Ok(None)
    }

    /// The rows the messages from `from` to the stream's end hold, each by its table, its
    /// id and its payload (a dead letter's as its body names them), and the last sequence
    /// read: what the stream holds, for the seed (`service::seed`), where a reused id must
    /// not pass for its older row's event. `tables`: each table's `Pgoutbox-Table` value
    /// and payload column; a message without that header is the first table's.
    ///
    /// With `order`, each message's position is also checked against commit order
    /// (`pgoutbox verify`).
    pub async fn held_rows(
        &self,
        from: ReadFrom,
        tables: &[(String, String)],
        mut order: Option<&mut OrderCheck>,
    ) -> Result<(HeldRows, u64), PublisherError> {
        let mut held = HeldRows::default();
        let mut pointers = Vec::new();
        let last = self
            .read_messages(from, None, false, |headers, body, sequence| {
                let header = |name: &str| headers?.get(name).map(|v| v.as_str());
                let replayed = header(REPLAY_HEADER).is_some();
                if let (Some(order), Some(source), Some(position), None, false) = (
                    order.as_deref_mut(),
                    header(SOURCE_HEADER),
                    header(POSITION_HEADER).and_then(|p| p.parse().ok()),
                    header(SCHEDULER_HEADER),
                    replayed,
                ) {
                    order.see(source, position, sequence);
                }
                let Some(id) = headers.and_then(|h| self.msg_id_of(h)) else { return };
                let id = id.as_str();
                // An emitted event is no table's row, whatever its id says; a message with
                // neither header was written before pgoutbox named tables: the first's.
                let table = match (header(TABLE_HEADER), header(EMITTED_HEADER)) {
                    (Some(name), _) => tables.iter().find(|(table, _)| table == name),
                    (None, Some(_)) => None,
                    (None, None) => tables.first(),
                };
                // A message of a table the seed does not read holds none of its rows.
                let Some((table, payload_column)) = table else { return };
                let payload = || PayloadDigest::of_message(body, header(DIGEST_HEADER));
                if let (Some(bucket), Some(name), false) = (
                    header(BUCKET_HEADER),
                    header(NAME_HEADER),
                    id.starts_with(DEAD_LETTER_ID_PREFIX),
                ) {
                    // Held only if its object still is: looked at once the read is done.
                    let object = (bucket.to_owned(), name.to_owned());
                    let size = header(SIZE_HEADER).and_then(|s| s.parse().ok());
                    let sha256 = header(DIGEST_HEADER).unwrap_or_default().to_owned();
                    let row = (table.clone(), id.to_owned(), replayed, payload());
                    pointers.push((row, object, size, sha256));
                } else if replayed && !id.starts_with(DEAD_LETTER_ID_PREFIX) {
                    held.insert_replay(table, id, payload());
                } else if !id.starts_with(DEAD_LETTER_ID_PREFIX) {
                    held.insert_message(table, id, payload());
                } else if let Some((row, payload)) = letter_row(body, payload_column) {
                    held.insert_letter(table, &row, payload.as_deref());
                } else {
                    // Not a letter this version reads: its id alone, as before.
                    held.insert_letter(table, row_id_of(id), None);
                }
            })
            .await?;
        for ((table, id, replayed, payload), (bucket, name), size, sha256) in pointers {
            let js = &self.js;
            match large_payloads::object_intact(js, &bucket, &name, size, &sha256).await {
                Ok(true) if replayed => held.insert_replay(&table, &id, payload),
                Ok(true) => held.insert_message(&table, &id, payload),
                Ok(false) => tracing::warn!(%bucket, object = %name, row = %id,
                    "a pointer's object is missing or not what the pointer says: its row \
                     counts as not in the stream"),
                Err(err) => {
                    let why = format!("reading object {name} of bucket {bucket}: {err}");
                    return Err(PublisherError::Unanswered(why));
                }
            }
        }
        Ok((held, last))
    }

    /// A message's `Nats-Msg-Id`; for one the server delivered for one of pgoutbox's
    /// schedules, the schedule's (deleted once delivered): the row is in the stream either way.
    /// A transaction's end message names no row: `None`.
    fn msg_id_of(&self, headers: &async_nats::HeaderMap) -> Option<String> {
        if headers.get(crate::domain::transaction::END_HEADER).is_some() {
            return None;
        }
        if let Some(id) = headers.get(MESSAGE_ID_HEADER) {
            return Some(id.as_str().to_owned());
        }
        let scheduler = headers.get(SCHEDULER_HEADER)?.as_str();
        self.schedules.iter().find_map(|s| s.msg_id_of_scheduler(scheduler)).map(str::to_owned)
    }

    /// Reads the messages from `from` to the stream's end (on `subject` only, when given),
    /// each handed to `each` with its headers and body (empty with `headers_only`); returns
    /// the last sequence read, at least the stream's end when the read began.
    async fn read_messages(
        &self,
        from: ReadFrom,
        subject: Option<&str>,
        headers_only: bool,
        mut each: impl FnMut(Option<&async_nats::HeaderMap>, &[u8], u64),
    ) -> Result<u64, PublisherError> {
        use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
        use futures_util::StreamExt;
        let stream = self.js.get_stream(&self.stream).await.map_err(request_error)?;
        // Read through at least the end as it is now, also when nothing is to be read.
        let end = stream.cached_info().state.last_sequence;
        let deliver_policy = match from {
            ReadFrom::Start => DeliverPolicy::All,
            ReadFrom::Time(seconds) => DeliverPolicy::ByStartTime {
                start_time: time::OffsetDateTime::from_unix_timestamp_nanos(
                    (seconds.max(0.0) * 1e9) as i128,
                )
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
            },
            ReadFrom::After(sequence) => {
                DeliverPolicy::ByStartSequence { start_sequence: sequence + 1 }
            }
        };
        let filter_subject = subject.unwrap_or_default().to_owned();
        let config =
            OrderedConfig { headers_only, deliver_policy, filter_subject, ..Default::default() };
        let mut consumer = stream.create_consumer(config).await.map_err(request_error)?;
        let name = consumer.cached_info().name.clone();
        let read = async {
            let mut left = consumer.info().await.map_err(request_error)?.num_pending;
            let mut messages = consumer.messages().await.map_err(request_error)?;
            let mut last = 0;
            while left > 0 {
                let message = match messages.next().await {
                    Some(message) => message.map_err(request_error)?,
                    None => break,
                };
                if let Ok(info) = message.info() {
                    (left, last) = (info.pending, info.stream_sequence);
                } else {
                    left = 0;
                }
                each(message.headers.as_ref(), &message.payload, last);
            }
            Ok(last.max(end))
        };
        let read = read.await;
        forget_consumer(&stream, &name).await;
        read
    }

    /// The rows of the dead letters on `subject` that left the payload out, as each
    /// letter's body names them (table, id; either may be shortened), for `--retention` to
    /// keep those rows (`domain::outbox::letter_row_in` reads them).
    pub async fn rows_of_letters_without_payload(
        &self,
        subject: &str,
    ) -> Result<Vec<(String, String)>, PublisherError> {
        use async_nats::jetstream::consumer::pull::OrderedConfig;
        use futures_util::StreamExt;
        let total = self.count_on_subject(subject).await?;
        if total == 0 {
            return Ok(Vec::new());
        }
        let stream = self.js.get_stream(&self.stream).await.map_err(request_error)?;
        let config = OrderedConfig { filter_subject: subject.to_owned(), ..Default::default() };
        let consumer = stream.create_consumer(config).await.map_err(request_error)?;
        let name = consumer.cached_info().name.clone();
        let mut messages = consumer.messages().await.map_err(request_error)?;
        let mut rows = Vec::new();
        for _ in 0..total {
            let message = match messages.next().await {
                Some(message) => message.map_err(request_error)?,
                None => break,
            };
            let omitted = message.headers.as_ref().and_then(|h| h.get(PAYLOAD_OMITTED_HEADER));
            if omitted.is_some_and(|v| v.as_str() == "true") {
                let body: serde_json::Value =
                    serde_json::from_slice(&message.payload).unwrap_or_default();
                let text = |key: &str| body.get(key).and_then(|v| v.as_str()).map(str::to_owned);
                if let (Some(table), Some(id)) = (text("table"), text("id")) {
                    rows.push((table, id));
                }
            }
        }
        forget_consumer(&stream, &name).await;
        Ok(rows)
    }
}

/// Deletes a read's consumer once the read is done, rather than leave it to its 30 s of
/// inactivity: nats-server 2.15 allows a stream 1,000 consumers unless it says otherwise,
/// and those are the applications'. Best effort: a consumer not deleted still expires.
async fn forget_consumer(stream: &async_nats::jetstream::stream::Stream, name: &str) {
    if let Err(err) = stream.delete_consumer(name).await {
        tracing::debug!(consumer = name, %err, "could not delete a read's consumer; it expires");
    }
}
