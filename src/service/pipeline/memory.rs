//! What outlives one connection attempt, and where the next one starts.

use std::sync::Arc;

use crate::domain::outbox::RefusedRows;
use std::collections::HashSet;

use crate::domain::progress::Position;
use crate::domain::publishing::Carried;
use crate::domain::source::{Source, TailRow};
use crate::domain::stall::Progress;
use crate::domain::throughput::Throughput;
use crate::nats::large_payloads::Pointer;
use crate::service::retention::{KeptRows, PublishedUpTo};
use crate::service::seed::{Seed, SeedKind};

/// State that outlives one connection attempt.
pub struct Memory {
    /// What the stall detector watches.
    pub progress: Arc<Progress>,
    /// Counts lost NATS connections (see `commands::connect_nats_watched`).
    pub nats_disconnects: tokio::sync::watch::Receiver<u64>,
    /// Rows answered as duplicates of older messages, which the next attempt skips, and
    /// the send window it starts with.
    pub carried: Carried,
    /// A stream tail whose row the slot went past without sending: written from another
    /// history of the database, so no attempt skips by it.
    pub tail_not_in_wal: Option<TailRow>,
    /// Rows JetStream refused for themselves, or whose id an older message of the stream
    /// has: the next attempt publishes their dead letter.
    pub refused: RefusedRows,
    /// Of those, the rows whose id was taken: their letter is named by position.
    pub ids_taken: HashSet<Position>,
    pub published: u64,
    pub dead_letters: u64,
    /// An attempt ended on the row at this position, which it could not send (no answer
    /// from the bucket or the stream): the row waits for a later attempt, and the stall
    /// detector counts it as waiting until an ack at or past it, so a row tried again
    /// without end is a stall.
    pub row_waiting: Option<Position>,
    /// The chunks of puts cut short were purged (`--object-store`), once the slot was ours.
    pub chunks_swept: bool,
    /// The last message JetStream acknowledged as stored: a stream found shorter at the
    /// next attempt forgot what it acknowledged (`domain::horizon::Forgotten`).
    pub stored: Option<crate::domain::horizon::Stored>,
    /// The furthest row from the WAL the stream acknowledged, by this process or, as
    /// recorded or found at the stream's tail, the one before: a row up to it whose older
    /// copy is gone was stored and since removed by the stream (a TTL, its limits), not
    /// taken by another row. Forgotten with a loss of the stream.
    pub acknowledged_through: Option<Position>,
    /// What waits behind the durability horizon, carried from one attempt to the next: an
    /// attempt may end sooner than the horizon passes (a delivered scheduled row ends one),
    /// and a horizon started afresh each time would never release anything. Dropped when
    /// the stream is found to have lost acknowledged events.
    pub horizon: Option<crate::domain::horizon::Horizon>,
    /// Pointers acknowledged that no look has vouched for with their object yet: the
    /// bucket's stream syncs on its own timer, so a power loss may keep a pointer and lose
    /// its object's chunks (`pipeline::durability`). Carried and dropped with the horizon.
    pub pointers: Vec<(crate::domain::horizon::Stored, Pointer)>,
    /// Rows whose object a look found lost: stored again from the row when the slot sends
    /// it again, even where the stream's tail skips its message.
    pub objects_lost: HashSet<Position>,
    /// The same, shared with the task that records it in Postgres for the next process
    /// (`service::acknowledgements`): copied at each tick (100 ms), not at each ack.
    pub acknowledged: crate::service::acknowledgements::LastAcknowledged,
    /// The previous process's record of it was read (at the first attempt that got so far).
    pub recorded_read: bool,
    /// Shared with `--verify-every`: the commit time of the newest transaction JetStream
    /// acknowledged whole.
    pub published_up_to: PublishedUpTo,
    /// Shared with `--retention`: the commit time of the newest transaction the slot was
    /// confirmed past, behind the durability horizon: until then the WAL, not only the
    /// table, may be needed to bring the row back.
    pub confirmed_up_to: PublishedUpTo,
    /// Shared with `--retention`: rows whose dead letter lacks the payload stay in the table.
    pub kept_rows: KeptRows,
    /// A seed from the table asked for and not finished (`service::seed`).
    pub seed_wanted: Option<SeedKind>,
    /// The seed under way: attempts publish its rows before streaming.
    pub seed: Option<Seed>,
    /// The pace of a seed's and of a replay's rows, for `/metrics`.
    pub paces: Paces,
    /// The warning about non-transactional emitted messages, at most once a minute.
    pub non_transactional_log: crate::domain::throttle::Throttle,
    /// Events emitted with the old default prefix while emitted events are off: said once a
    /// minute at most (`pipeline::emitted`).
    pub emitted_off_log: crate::domain::throttle::Throttle,
    /// Makes the spans of each attempt, when traces are configured (`service::traces`).
    pub tracer: Option<opentelemetry_sdk::trace::Tracer>,
}

#[derive(Default)]
pub struct Paces {
    pub seed: Throughput,
    pub replay: Throughput,
    /// The index of the replayed row last acknowledged (`pipeline::replayed`).
    pub replay_done: u64,
}

impl Memory {
    pub fn new(
        progress: Arc<Progress>,
        nats_disconnects: tokio::sync::watch::Receiver<u64>,
    ) -> Self {
        Memory {
            progress,
            nats_disconnects,
            carried: Carried::default(),
            tail_not_in_wal: None,
            refused: RefusedRows::default(),
            ids_taken: HashSet::new(),
            published: 0,
            dead_letters: 0,
            row_waiting: None,
            chunks_swept: false,
            horizon: None,
            pointers: Vec::new(),
            objects_lost: HashSet::new(),
            stored: None,
            acknowledged_through: None,
            acknowledged: Default::default(),
            recorded_read: false,
            published_up_to: PublishedUpTo::default(),
            confirmed_up_to: PublishedUpTo::default(),
            kept_rows: KeptRows::default(),
            seed_wanted: None,
            seed: None,
            paces: Paces::default(),
            non_transactional_log: crate::domain::throttle::Throttle::new(
                std::time::Duration::from_secs(60),
            ),
            emitted_off_log: crate::domain::throttle::Throttle::new(
                std::time::Duration::from_secs(60),
            ),
            tracer: None,
        }
    }

    /// The stream holds (or held) the row at `position`; a seed's rows, numbered apart from
    /// the WAL's, say nothing of it.
    pub fn acknowledged(&mut self, position: Position) {
        acknowledged_through(&mut self.acknowledged_through, position);
    }

    /// Whether the row at `position` was acknowledged before: see
    /// [`Memory::acknowledged_through`].
    pub fn acknowledged_before(&self, position: Position) -> bool {
        position.commit_lsn != 0 && self.acknowledged_through.is_some_and(|p| position <= p)
    }

    /// A new seed begins: what was remembered of an earlier snapshot's rows, by their
    /// place in it, names other rows now.
    pub fn forget_seed_rows(&mut self) {
        self.carried.duplicates.forget_seed();
        self.refused.forget_seed();
        self.ids_taken.retain(|position| position.commit_lsn != 0);
    }
}

/// Moves `through` ([`Memory::acknowledged_through`]) to `position`, a row from the WAL;
/// callable while another field of `Memory` is borrowed.
pub fn acknowledged_through(through: &mut Option<Position>, position: Position) {
    if position.commit_lsn != 0 {
        *through = (*through).max(Some(position));
    }
}

/// Where an attempt starts, and what the stream already holds.
pub struct Resume {
    /// The slot's `confirmed_flush_lsn`.
    pub lsn: u64,
    /// The stream's last sequence: the first publish expects it.
    pub stream_sequence: u64,
    /// Rows at or before this row's position are in the stream already, once the slot
    /// sends this row again (`crate::domain::source`).
    pub skip_through: Option<TailRow>,
    /// The sequence that row's message is stored at: deliveries of scheduled rows may
    /// follow it, so it is not always `stream_sequence`.
    pub tail_sequence: u64,
    /// Named in every message's `Pgoutbox-Source` header.
    pub source: Source,
    /// The largest message the server and the stream accept (`StreamTail::message_limit`).
    pub message_limit: usize,
    /// The outbox tables as they are now, in the entries' order: rows are matched by their
    /// table's OID, not by the name of the moment.
    pub tables: Vec<crate::postgres::outbox_table::StreamedTable>,
    /// A seed's rows, published before the slot's (`service::seed`).
    pub prelude: Option<crate::service::seed::Prelude>,
}
