//! What `/readyz` answers: streaming from Postgres and connected to NATS, not stalled;
//! else why not, in words an operator acts on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::gauge;

use super::names;
use crate::domain::stall::{Progress, StallDetector};

/// What `/readyz` answers from.
#[derive(Default)]
pub struct Readiness {
    streaming: AtomicBool,
    nats: Mutex<Option<async_nats::Client>>,
    stalled: Mutex<Option<String>>,
    /// Why the last connection attempt ended, while pgoutbox waits to reconnect.
    retrying_after: Mutex<Option<String>>,
    /// Set while another pgoutbox holds the slot and this one waits to take over.
    standby_for: Mutex<Option<String>>,
}

impl Readiness {
    pub fn set_streaming(&self, streaming: bool) {
        if streaming {
            if let Ok(mut reason) = self.retrying_after.lock() {
                *reason = None;
            }
            if let Ok(mut slot) = self.standby_for.lock() {
                *slot = None;
            }
        }
        self.streaming.store(streaming, Ordering::Relaxed);
        gauge!(names::STREAMING).set(f64::from(u8::from(streaming)));
    }

    pub fn set_nats(&self, client: async_nats::Client) {
        if let Ok(mut nats) = self.nats.lock() {
            *nats = Some(client);
        }
    }

    /// Records why streaming stopped, for `/readyz` to say until it resumes.
    /// This process waits as hot standby for `slot`.
    pub fn set_standby(&self, slot: &str) {
        if let Ok(mut standby) = self.standby_for.lock() {
            *standby = Some(slot.to_owned());
        }
    }

    pub fn set_retrying_after(&self, error: String) {
        if let Ok(mut standby) = self.standby_for.lock() {
            *standby = None;
        }
        if let Ok(mut reason) = self.retrying_after.lock() {
            *reason = Some(error);
        }
    }

    /// Records the stall detector's verdict: `Some(reason)` while stalled.
    pub fn set_stalled(&self, reason: Option<String>) {
        gauge!(names::STALLED).set(f64::from(u8::from(reason.is_some())));
        if let Ok(mut stalled) = self.stalled.lock() {
            *stalled = reason;
        }
    }

    /// Why pgoutbox is not ready, if it is not (the body of `/readyz`'s 503).
    pub fn not_ready_because(&self) -> Option<String> {
        if let Some(reason) = self.stalled.lock().ok().and_then(|s| s.clone()) {
            return Some(reason);
        }
        let nats_connected = self
            .nats
            .lock()
            .ok()
            .and_then(|n| n.as_ref().map(|c| c.connection_state()))
            .is_some_and(|s| s == async_nats::connection::State::Connected);
        let streaming = self.streaming.load(Ordering::Relaxed);
        let standby = self.standby_for.lock().ok().and_then(|s| s.clone());
        let retrying = self.retrying_after.lock().ok().and_then(|r| r.clone());
        let not_streaming = match (standby, retrying) {
            (Some(slot), _) => format!(
                "hot standby: slot {slot} is streamed by another pgoutbox; this one takes over \
                 when it goes away"
            ),
            (None, Some(error)) => format!("not streaming, reconnecting after: {error}"),
            (None, None) => "not streaming from Postgres".to_owned(),
        };
        match (streaming, nats_connected) {
            (true, true) => None,
            (false, true) => Some(not_streaming),
            (true, false) => Some("not connected to NATS".into()),
            (false, false) => Some(format!("{not_streaming}; not connected to NATS")),
        }
    }
}

/// How often [`watch_stalls`] looks at [`Progress`].
const STALL_WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// Judges `progress` every 250 ms for as long as the process runs; reports to `/readyz`,
/// `pgoutbox_stalled` and `pgoutbox_last_confirmation_age_seconds`.
pub async fn watch_stalls(progress: Arc<Progress>, readiness: Arc<Readiness>, timeout: Duration) {
    let mut detector = StallDetector::new(timeout, Instant::now());
    let age = metrics::gauge!(names::LAST_CONFIRMATION_AGE);
    let mut tick = tokio::time::interval(STALL_WATCH_INTERVAL);
    loop {
        tick.tick().await;
        let now = Instant::now();
        readiness.set_stalled(detector.observe(progress.read(), now));
        age.set(detector.age(now).as_secs_f64());
    }
}
