//! What ends streaming from outside the pipeline's own paths: a shutdown request, the lost
//! NATS connection, Postgres found unresponsive or the outbox table changed. One task watches all three and reports the
//! first, so that the pipeline's loop polls one oneshot receiver, a load and a compare,
//! instead of registering and dropping three watch waiters, each behind a lock, for every
//! message and every ack (3 % of the CPU of a drain).

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::service::liveness::Verdict;
use crate::service::shutdown::Shutdown;

pub(super) enum Interruption {
    Shutdown,
    NatsLost,
    PostgresDead(Verdict),
}

pub(super) struct Interruptions {
    first: Option<oneshot::Receiver<Interruption>>,
    watcher: JoinHandle<()>,
}

impl Interruptions {
    pub(super) fn watch(
        mut shutdown: Shutdown,
        mut nats_disconnects: watch::Receiver<u64>,
        mut postgres_dead: watch::Receiver<Option<Verdict>>,
    ) -> Interruptions {
        let (report, first) = oneshot::channel();
        let watcher = tokio::spawn(async move {
            let interruption = loop {
                tokio::select! {
                    () = shutdown.requested() => break Interruption::Shutdown,
                    Ok(()) = nats_disconnects.changed() => break Interruption::NatsLost,
                    Ok(()) = postgres_dead.changed() => {
                        if let Some(why) = postgres_dead.borrow_and_update().clone() {
                            break Interruption::PostgresDead(why);
                        }
                    }
                    else => std::future::pending().await,
                }
            };
            let _ = report.send(interruption);
        });
        Interruptions { first: Some(first), watcher }
    }

    /// The first interruption; pending forever after it was returned once. Cancel-safe.
    pub(super) async fn next(&mut self) -> Interruption {
        if let Some(first) = self.first.as_mut()
            && let Ok(interruption) = first.await
        {
            self.first = None;
            return interruption;
        }
        self.first = None;
        std::future::pending().await
    }
}

impl Drop for Interruptions {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}
