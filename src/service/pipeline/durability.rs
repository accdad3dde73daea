//! What may be confirmed, behind the durability horizon (`domain::horizon`), and the looks
//! at the stream it waits for: a position waits until a request sent a horizon after the
//! acknowledgement it rests on finds that message still in the stream. One look at a time,
//! at most one a second (an attempt's first at once), off the loop: its answer is read at
//! the next tick. What waits is carried from one attempt to the next.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tracing::warn;

use super::{Memory, Pipeline, Resume};
use crate::domain::horizon::{Horizon, LOOK_EVERY, Stored};
use crate::domain::progress::Position;
use crate::nats::large_payloads::{self, Pointer};
use crate::nats::publisher::{Publisher, PublisherError};
use crate::service::error::{NatsFailure, NatsFailureKind, PipelineError};

/// This attempt's looks: the one in flight, and when the last was sent.
#[derive(Default)]
pub(super) struct Looks {
    in_flight: Option<oneshot::Receiver<Answer>>,
    sent_at: Option<Instant>,
}

struct Answer {
    stored: Stored,
    asked_at: Instant,
    holds: Result<bool, PublisherError>,
    /// A pointer at or before `stored` whose object is not whole (looked at only when the
    /// stream holds `stored`).
    lost_object: Option<Stored>,
}

/// The horizon of an attempt that resumes the slot at `resume.lsn`: the one the attempt
/// before carried ([`Memory::horizon`]), or a new one. What positions without an
/// acknowledgement of this process rest on comes from the stream's tail at the start:
/// nothing of ours past the slot's start (an empty stream, our tail at or before it)
/// releases them at once, so an outbox idle since its start pins no WAL; our tail past it
/// is a message to look for like an acknowledged one; another writer's tail (or a seed)
/// leaves them waiting by time alone.
pub(super) fn horizon_for(memory: &mut Memory, span: Duration, resume: &Resume) -> Horizon {
    let start = resume.lsn;
    let mut horizon = match memory.horizon.take() {
        Some(carried) => carried.resumed_at(start),
        None => Horizon::new(span, start),
    };
    let ours = resume.skip_through.as_ref().map(|tail| tail.position);
    match ours {
        _ if resume.prelude.is_some() => {}
        None if resume.stream_sequence == 0 => horizon.nothing_past_the_start(),
        Some(position) if position.commit_lsn <= start => horizon.nothing_past_the_start(),
        Some(position) => {
            // At its own sequence: a delivery stored after it holds another row.
            let tail = Stored { sequence: resume.tail_sequence, position };
            memory.acknowledged(position);
            if memory.stored.is_none_or(|stored| stored.sequence < tail.sequence) {
                memory.stored = Some(tail);
            }
        }
        None => {}
    }
    horizon
}

impl Pipeline<'_> {
    /// The message of the row at `position` was acknowledged: stored at `sequence`, or
    /// `None` for an older copy (whose pointer, if any, `Memory::pointers` still holds). A
    /// pointer stored waits there for a look to vouch for its object.
    pub(super) fn pointer_acknowledged(&mut self, position: Position, sequence: Option<u64>) {
        while let Some((sent, pointer)) = self.pointers_sent.pop_front() {
            if sent > position {
                self.pointers_sent.push_front((sent, pointer));
                return;
            }
            // Without a horizon nothing waits for a look, and nothing is kept for one.
            let looked_at = !self.config.durability_horizon.is_zero();
            if let (true, Some(sequence), true) = (sent == position, sequence, looked_at) {
                self.memory.pointers.push((Stored { sequence, position }, pointer));
            }
        }
    }

    /// Leaves what waits behind the horizon to the next attempt.
    pub(super) fn carry_horizon(&mut self) {
        let fresh = Horizon::new(self.config.durability_horizon, self.reported);
        self.memory.horizon = Some(std::mem::replace(&mut self.horizon, fresh));
    }

    /// What may be confirmed now: [`LsnTracker::confirmed`] once the horizon passed it.
    ///
    /// [`LsnTracker::confirmed`]: crate::domain::progress::LsnTracker::confirmed
    pub(super) fn confirmable(&mut self) -> u64 {
        self.horizon.offer(self.protocol.confirmed(), self.last_ack_at, self.memory.stored);
        self.horizon.release(Instant::now())
    }

    /// Once a tick: reads the answer of the look in flight, and starts the next one when a
    /// position waits for it. A stream found without a message it acknowledged lost it
    /// (a power loss): the attempt ends, and the next one compares the stream with what
    /// was acknowledged and reads the slot again.
    pub(super) fn look_at_the_stream(&mut self) -> Result<(), PipelineError> {
        if let Some(answer) = &mut self.looks.in_flight {
            match answer.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => return Ok(()),
                Err(oneshot::error::TryRecvError::Closed) => {}
                Ok(Answer { stored, asked_at, holds: Ok(true), lost_object: None }) => {
                    let sequence = stored.sequence;
                    self.memory.pointers.retain(|(pointer, _)| pointer.sequence > sequence);
                    self.horizon.vouched(stored, asked_at)
                }
                Ok(Answer { holds: Ok(true), lost_object: Some(lost), .. }) => {
                    self.memory.objects_lost.insert(lost.position);
                    let detail = format!(
                        "the object of the pointer at sequence {} (position {}) lost its chunks \
                         while the stream kept the pointer: stored again from the row",
                        lost.sequence, lost.position
                    );
                    return Err(NatsFailure::new(NatsFailureKind::Request, detail).into());
                }
                Ok(Answer { stored, holds: Ok(false), .. }) => {
                    let detail = format!(
                        "the stream no longer holds the message it acknowledged at sequence {} \
                         (position {}): its server lost acknowledged events",
                        stored.sequence, stored.position
                    );
                    return Err(NatsFailure::new(NatsFailureKind::Request, detail).into());
                }
                // Asked again at the next look.
                Ok(Answer { holds: Err(err), .. }) => {
                    tracing::debug!(error = %err, "looking at the stream for the horizon")
                }
            }
            self.looks.in_flight = None;
        }
        let now = Instant::now();
        if self.looks.sent_at.is_some_and(|at| now < at + LOOK_EVERY) {
            return Ok(());
        }
        let Some(stored) = self.horizon.due(now) else { return Ok(()) };
        self.looks.sent_at = Some(now);
        let (report, answer) = oneshot::channel();
        let publisher = self.publisher.clone();
        let pointers: Vec<(Stored, Pointer)> = self
            .memory
            .pointers
            .iter()
            .filter(|(pointer, _)| pointer.sequence <= stored.sequence)
            .cloned()
            .collect();
        tokio::spawn(async move {
            let asked_at = Instant::now();
            let holds = publisher.still_holds(stored).await;
            let (mut holds, mut lost_object) = (holds, None);
            if matches!(holds, Ok(true)) {
                match first_lost_object(&publisher, &pointers).await {
                    Ok(lost) => lost_object = lost,
                    Err(err) => holds = Err(err),
                }
            }
            let _ = report.send(Answer { stored, asked_at, holds, lost_object });
        });
        self.looks.in_flight = Some(answer);
        Ok(())
    }
}

/// At an attempt's start, often after the server restarted: the objects of the pointers
/// still waiting for a look, newest first, until one is whole (a power loss cuts the
/// bucket's newest records, so the objects before a whole one are whole). Each one lost is
/// stored again when the slot sends its row (the Skip path), without waiting for the look:
/// an operator may drop the slot before that look, and the table may have lost the row by
/// then. An object that could not be looked at is left to the look.
pub async fn objects_lost_before_start(
    publisher: &Publisher,
    pointers: &[(Stored, Pointer)],
    objects_lost: &mut HashSet<Position>,
) {
    for (stored, pointer) in pointers.iter().rev() {
        match whole(publisher, pointer).await {
            Ok(true) => return,
            Ok(false) => {
                warn!(position = %stored.position, bucket = %pointer.bucket,
                    object = %pointer.name, "a pointer's object was lost with the server's \
                    last writes: stored again from the row before the slot moves past it");
                objects_lost.insert(stored.position);
            }
            Err(err) => {
                tracing::debug!(error = %err, "looking at an object at start");
                return;
            }
        }
    }
}

/// The first of `pointers` whose object is not whole; an object that could not be looked
/// at is an unanswered look, asked again.
async fn first_lost_object(
    publisher: &Publisher,
    pointers: &[(Stored, Pointer)],
) -> Result<Option<Stored>, PublisherError> {
    for (stored, pointer) in pointers {
        if !whole(publisher, pointer).await? {
            return Ok(Some(*stored));
        }
    }
    Ok(None)
}

/// Whether the object `pointer` names is there whole, as the pointer says; an object that
/// could not be looked at is an unanswered request.
async fn whole(publisher: &Publisher, pointer: &Pointer) -> Result<bool, PublisherError> {
    let Pointer { bucket, name, size, sha256 } = pointer;
    let js = publisher.context();
    large_payloads::object_intact(js, bucket, name, Some(*size), sha256)
        .await
        .map_err(|err| PublisherError::Unanswered(format!("object {name}: {err}")))
}
