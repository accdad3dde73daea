//! The stream's tail: where pgoutbox's newest row in the stream came from, read at every
//! attempt's start (`domain::source` judges it, `domain::publishing` skips by it), and the
//! origin of any one message, for a duplicate's answer.

use async_nats::jetstream;

use super::{POSITION_HEADER, Publisher, PublisherError, is_no_message, request_error};
use crate::domain::horizon::Stored;
use crate::domain::outbox::{EMITTED_HEADER, MESSAGE_ID_HEADER, SCHEDULER_HEADER, TABLE_HEADER};
use crate::domain::progress::Position;
use crate::domain::publishing::{CHAIN_HEADER, EXPECTED_LAST_MSG_ID_HEADER};
use crate::domain::seed::{PayloadDigest, SEED_SINCE_HEADER};
use crate::domain::source::{Behind, SOURCE_HEADER, TailOrigin, TailSearch};
use crate::nats::large_payloads::DIGEST_HEADER;

/// How many messages the server delivered for schedules the tail is looked for behind, by a
/// process that acknowledged nothing yet (`Publisher::tail`); beyond, the tail names the
/// newest of them, and the duplicate window keeps the rows after it from being stored twice
/// only while they are younger than it.
const DELIVERED_LOOK_BACK: u64 = 1_024;

/// How many of those messages are asked for at once.
const LOOK_BACK_IN_FLIGHT: usize = 64;

/// The end of the stream when pgoutbox starts or resumes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamTail {
    pub last_sequence: u64,
    /// Where the last stored message came from, as far as its headers say.
    pub origin: TailOrigin,
    /// The largest message (headers and payload) both the server (`max_payload`) and the
    /// stream (`max_msg_size`) accept: what a dead letter is built to fit.
    pub message_limit: usize,
}

impl Publisher {
    /// Reads the stream's last sequence and the position of its last message. On a cluster,
    /// a server without the stream's leader may still answer from its own copy: that answer
    /// is refused, since publishing cannot succeed without a leader and may be stale.
    ///
    /// `known` is the last message this process acknowledged (`None` in a new process):
    /// behind a delivery, it is where the tail is found, in one request. Looked for behind
    /// more deliveries than the search reads, the newest of them named a schedule's row,
    /// perhaps long committed: every row after it was published again, and stored twice
    /// once older than the duplicate window (3,000 deliveries at once: 219 of the 300 rows
    /// committed beside them, `scheduled_rows`); and reading 1,024 messages back took about
    /// 300 ms (debug build).
    pub async fn tail(&self, known: Option<Stored>) -> Result<StreamTail, PublisherError> {
        let mut stream = self.js.get_stream(&self.stream).await.map_err(request_error)?;
        let info = stream.info().await.map_err(request_error)?;
        if let Some(cluster) = &info.cluster
            && cluster.name.is_some()
            && cluster.leader.as_deref().is_none_or(str::is_empty)
        {
            return Err(PublisherError::NoLeader(self.stream.clone()));
        }
        let last_sequence = info.state.last_sequence;
        let message_limit = match usize::try_from(info.config.max_message_size) {
            Ok(stream_limit) => stream_limit.min(self.client.max_payload()),
            Err(_) => self.client.max_payload(), // -1: the stream sets no limit
        };
        if last_sequence == 0 {
            return Ok(StreamTail { message_limit, ..StreamTail::default() });
        }
        let origin = self.newest_row(&stream, last_sequence, known).await?;
        Ok(StreamTail { last_sequence, origin, message_limit })
    }

    /// Where pgoutbox's newest row in the stream came from: the last message, if it is a
    /// row; else the message this process acknowledged last (`known`) if the stream still
    /// holds it, or a newer delivery at the end; else looking back from `last` past the
    /// messages the server delivered for schedules ([`TailSearch`]). Any other error (no
    /// leader, a permission, a timeout) says nothing about the tail: taken as "nothing to
    /// skip", every unconfirmed row past the duplicate window would be stored twice.
    async fn newest_row(
        &self,
        stream: &jetstream::stream::Stream,
        last: u64,
        known: Option<Stored>,
    ) -> Result<TailOrigin, PublisherError> {
        use futures_util::{StreamExt, TryStreamExt};
        let oldest = last.saturating_sub(DELIVERED_LOOK_BACK).max(1);
        let behind = |sequence| async move {
            match stream.get_raw_message(sequence).await {
                Ok(message) => Ok(match message.headers.get(SCHEDULER_HEADER) {
                    Some(scheduler) => {
                        Behind::Delivered(self.delivered_origin(&message, scheduler.as_str()))
                    }
                    None => Behind::Written(origin(&message)),
                }),
                Err(err) if is_no_message(&err) => Ok(Behind::Missing),
                Err(err) => Err(request_error(err)),
            }
        };
        let mut search = TailSearch::default();
        let at_last = behind(last).await?;
        if let Behind::Written(_) = at_last {
            search.look_back(at_last);
            return Ok(search.tail());
        }
        // Rows of this process stored after the one it acknowledged last can only be
        // messages in flight when its attempt ended, chained behind it: within the
        // duplicate window.
        if let Some(known) = known.filter(|known| known.sequence < last)
            && let Some(acknowledged) = still_ours(stream, known).await?
        {
            search.look_back(at_last);
            search.look_back(Behind::Written(acknowledged));
            return Ok(search.tail());
        }
        // Behind a delivery only, the ones before it, asked `LOOK_BACK_IN_FLIGHT` at a time
        // (issue 45: one at a time, a burst of deliveries from a far server outlasted the
        // attempt's time for reading the tail).
        if !search.look_back(at_last) {
            return Ok(search.tail());
        }
        let mut earlier = futures_util::stream::iter((oldest..last).rev())
            .map(behind)
            .buffered(LOOK_BACK_IN_FLIGHT);
        while let Some(message) = earlier.try_next().await? {
            if !search.look_back(message) {
                break;
            }
        }
        Ok(search.tail())
    }

    /// A delivered message as the row its schedule was published from: its position and
    /// source are the schedule's (copied by the server), its id is read from the
    /// schedule's subject; one delivered from a subject that is not pgoutbox's names no row.
    fn delivered_origin(
        &self,
        message: &async_nats::jetstream::message::StreamMessage,
        scheduler: &str,
    ) -> TailOrigin {
        let msg_id = self
            .schedules
            .iter()
            .find_map(|schedule| schedule.msg_id_of_scheduler(scheduler))
            .map(str::to_owned);
        match msg_id {
            Some(msg_id) => TailOrigin { msg_id: Some(msg_id), chained: true, ..origin(message) },
            None => TailOrigin::default(),
        }
    }

    /// Where the message at `sequence` came from, as its headers say; `None` when it is no
    /// longer in the stream (deleted, purged) while its id is still in the duplicate window.
    pub async fn origin_of(&self, sequence: u64) -> Result<Option<TailOrigin>, PublisherError> {
        let stream = self.js.get_stream(&self.stream).await.map_err(request_error)?;
        match stream.get_raw_message(sequence).await {
            Ok(message) => Ok(Some(origin(&message))),
            Err(err) if is_no_message(&err) => Ok(None),
            Err(err) => Err(request_error(err)),
        }
    }

    /// Whether the stream still holds the message it acknowledged as `stored`: the message
    /// at its sequence, from its position; or, when that one is gone by design (its
    /// schedule delivered, an age limit), a stream that does not end before it.
    pub async fn still_holds(&self, stored: Stored) -> Result<bool, PublisherError> {
        match self.origin_of(stored.sequence).await? {
            Some(origin) => Ok(origin.position == Some(stored.position)),
            None => Ok(self.last_sequence().await? >= stored.sequence),
        }
    }
}

/// The origin of the message acknowledged as `known`, if the stream still holds it there.
async fn still_ours(
    stream: &jetstream::stream::Stream,
    known: Stored,
) -> Result<Option<TailOrigin>, PublisherError> {
    match stream.get_raw_message(known.sequence).await {
        Ok(message) => {
            let delivered = message.headers.get(SCHEDULER_HEADER).is_some();
            let origin = origin(&message);
            Ok((!delivered && origin.position == Some(known.position)).then_some(origin))
        }
        Err(err) if is_no_message(&err) => Ok(None),
        Err(err) => Err(request_error(err)),
    }
}

/// What a stored message's headers say about where it came from.
fn origin(message: &async_nats::jetstream::message::StreamMessage) -> TailOrigin {
    let header = |name| message.headers.get(name).map(|v| v.as_str().to_owned());
    TailOrigin {
        chained: [EXPECTED_LAST_MSG_ID_HEADER, CHAIN_HEADER]
            .iter()
            .any(|name| message.headers.get(*name).is_some()),
        source: header(SOURCE_HEADER),
        position: header(POSITION_HEADER).and_then(|p| p.parse::<Position>().ok()),
        msg_id: header(MESSAGE_ID_HEADER),
        table: header(TABLE_HEADER),
        emitted: message.headers.get(EMITTED_HEADER).is_some(),
        seed_since: header(SEED_SINCE_HEADER),
        payload: PayloadDigest::of_message(&message.payload, header(DIGEST_HEADER).as_deref()),
        stored_at_millis: (message.time.unix_timestamp_nanos() / 1_000_000) as i64,
        sequence: message.sequence,
    }
}
