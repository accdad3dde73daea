//! What `run` waits for before it streams, instead of exiting: a primary (not a server in
//! recovery), a reachable NATS, and a JetStream that answers. Each wait says why it waits,
//! in the log and on `/readyz`, and ends early on shutdown.

use std::time::Duration;

use tracing::{debug, info, warn};

use crate::domain::retry::{Backoff, RepeatedError, RetryPolicy};
use crate::nats::claim::ClaimError;
use crate::nats::publisher::PublisherError;
use crate::postgres::admin;
use crate::service::error::PipelineError;
use crate::service::shutdown::Shutdown;
use crate::service::telemetry::Readiness;
use crate::settings::config::Config;

/// Waits while the server is in recovery (a standby, or one being promoted): setting up
/// there would fail read-only, or take a slot that was never synchronised to it for a
/// dropped one. Says so once. `false` when shutdown was asked meanwhile.
pub async fn wait_until_primary(
    config: &Config,
    shutdown: &mut Shutdown,
    readiness: &Readiness,
) -> anyhow::Result<bool> {
    let client = admin::connect(&config.database, &config.pg_tls).await?;
    let mut announced = false;
    while admin::in_recovery(&client).await? {
        if !announced {
            let err = PipelineError::InRecovery { slot: config.slot.clone() };
            warn!("{err}");
            readiness.set_retrying_after(err.to_string());
            announced = true;
        }
        tokio::select! {
            () = tokio::time::sleep(RetryPolicy::STANDBY_POLL) => {}
            () = shutdown.requested() => return Ok(false),
        }
    }
    if announced {
        info!("Postgres left recovery; setting up");
    }
    Ok(true)
}

/// What is logged while start-up waits for NATS to take the connection.
pub const UNREACHABLE: &str = "NATS unreachable; retrying";

/// What is logged while start-up waits for JetStream to answer.
pub const UNANSWERED: &str = "JetStream did not answer while setting up; retrying";

/// Whether a start-up step failed for want of an answer from JetStream (NATS restarting, a
/// leader election, quorum lost) rather than for a refusal that waiting will not change.
pub fn jetstream_unanswered(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<PublisherError>().is_some_and(PublisherError::is_transient)
            || cause.downcast_ref::<ClaimError>().is_some_and(ClaimError::is_transient)
    })
}

/// The longest pause between tries while JetStream does not answer at start: each try is
/// a request or two, and a cluster regains quorum within seconds of its servers' return
/// (with 30 s, a loaded CI host once streamed only 30 s after quorum was back).
pub const JETSTREAM_RETRY_CAP: Duration = Duration::from_secs(2);

/// Runs a start-up step until it succeeds, waiting as `backoff` says after each failure
/// that `passing` says time may mend, and logging `waiting` (a warning at once and then
/// every 30 s): pgoutbox started beside its NATS (a deploy, a node reboot) must wait for
/// it, not exit. `None` on shutdown.
pub async fn patiently<T, F: Future<Output = anyhow::Result<T>>>(
    waiting: &str,
    passing: impl Fn(&anyhow::Error) -> bool,
    mut backoff: Backoff,
    shutdown: &mut Shutdown,
    readiness: &Readiness,
    mut step: impl FnMut() -> F,
) -> anyhow::Result<Option<T>> {
    let mut repeats = RepeatedError::default();
    loop {
        let err = match step().await {
            Ok(done) => return Ok(Some(done)),
            Err(err) if passing(&err) => err,
            Err(err) => return Err(err),
        };
        let delay = backoff.next_delay();
        let error = format!("{err:#}");
        match repeats.note(&error) {
            Some(repeated) => warn!(%error, retry_in = ?delay, repeated, "{waiting}"),
            None => debug!(%error, retry_in = ?delay, "{waiting}"),
        }
        readiness.set_retrying_after(error);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.requested() => return Ok(None),
        }
    }
}
