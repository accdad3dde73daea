//! The soak's tenants (schema-per-tenant, `--table 'tenant_*.outbox'`): how pgoutbox and
//! the stream are set up for them, the writer that creates, writes and drops them
//! ([`writer`]), and the checker that holds their messages against what it committed
//! ([`check`]). On by default; `PGOUTBOX_SOAK_OFF=tenants` leaves the outbox alone, as
//! before, and `schedules` turns their scheduled rows off.

pub mod check;
pub mod writer;

use std::time::{Duration, Instant};

use futures_util::StreamExt;

pub use check::check_tenants;
pub use writer::{TenantLedger, TenantRow, TenantWriter};

use super::Settings;

/// The tenants' tables, as `--table` names them.
pub const PATTERN: &str = "tenant_*.outbox";
/// The tenants' subjects: `tenants.<schema>.<event_type>`.
pub const TEMPLATE: &str = "tenants.{$schema}.{event_type}";

/// The `--config` file pgoutbox runs with when the tenants write: the outbox as before
/// (its ids now qualified by its table, `public.outbox:<id>`), and the pattern, with
/// `--schedule-column` when the server has message schedules.
pub fn config_file(schedules: bool) -> String {
    let schedule = if schedules { "schedule-column = \"deliver_at\"\n" } else { "" };
    format!(
        "[[table]]\ntable = \"public.outbox\"\n\n[[table]]\ntable = \"{PATTERN}\"\n\
         subject-template = \"{TEMPLATE}\"\n{schedule}"
    )
}

/// The stream, made before pgoutbox, with the soak's duplicate window: the outbox's
/// subjects, the tenants', and where scheduled rows wait.
pub async fn create_stream(
    js: &async_nats::jetstream::Context,
    duplicate_window: Duration,
    schedules: bool,
) {
    let mut subjects: Vec<String> =
        ["outbox.*.*", "outbox.dead_letter", "tenants.*.*"].map(str::to_owned).to_vec();
    if schedules {
        subjects.push("schedules.OUTBOX.>".to_owned());
    }
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "OUTBOX".into(),
        subjects,
        duplicate_window,
        allow_message_schedules: schedules,
        ..Default::default()
    })
    .await
    .expect("create stream OUTBOX for the outbox and the tenants");
}

/// What the soak does with tenants, to print at the start: on a nats-server without
/// message schedules (before 2.12) the scheduled rows are skipped, and it says so.
pub fn said(settings: &Settings, schedules: bool, (major, minor): (u32, u32)) -> String {
    let server = format!("nats-server {major}.{minor}");
    let scheduled = match (schedules, settings.schedules) {
        (true, _) => format!("on ({server})"),
        (false, false) => "off (PGOUTBOX_SOAK_OFF)".to_owned(),
        (false, true) => format!("skipped: {server} has no message schedules (2.12+)"),
    };
    match settings.tenants {
        true => format!("tenants: on, pattern {PATTERN}; scheduled rows: {scheduled}"),
        false => "tenants: off (PGOUTBOX_SOAK_OFF): the outbox alone".to_owned(),
    }
}

/// Waits (60 s past the last scheduled row's time at most) until every scheduled row's
/// time passed and the stream holds none on a schedule's subject; how many it still holds.
pub async fn wait_delivered(js: &async_nats::jetstream::Context, ledger: &TenantLedger) -> usize {
    let last = ledger.committed.iter().filter_map(|r| r.due_nanos).max().unwrap_or(0);
    let now = || {
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        at.map_or(0, |d| d.as_nanos() as i128)
    };
    let ahead = Duration::from_nanos((last - now()).clamp(0, 600_000_000_000) as u64);
    let deadline = Instant::now() + Duration::from_secs(60) + ahead;
    let mut held = held_schedules(js).await;
    while (now() < last || held > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        held = held_schedules(js).await;
    }
    held
}

/// How many messages the stream holds on a schedule's subject (`usize::MAX`: unknown).
async fn held_schedules(js: &async_nats::jetstream::Context) -> usize {
    let Ok(stream) = js.get_stream("OUTBOX").await else { return usize::MAX };
    let Ok(mut subjects) = stream.info_with_subjects("schedules.>").await else {
        return usize::MAX;
    };
    let mut held = 0;
    while let Some(next) = subjects.next().await {
        match next {
            Ok((_, count)) => held += count,
            Err(_) => return usize::MAX,
        }
    }
    held
}

/// Tables adopted, and rows they handed over, by the pgoutbox logs kept in `logs`; and
/// tables joined before a new stream's slot (their rows history).
pub fn adoptions(logs: &std::path::Path) -> (usize, u64, usize) {
    let (mut tables, mut rows, mut joined) = (0, 0, 0);
    let files = std::fs::read_dir(logs).into_iter().flatten().flatten();
    for file in files {
        let log = std::fs::read_to_string(file.path()).unwrap_or_default();
        for line in log.lines().filter(|l| l.contains("tenant_")) {
            if line.contains("joined the publication, its rows handed over") {
                tables += 1;
                let count = line.split_whitespace().find_map(|w| w.strip_prefix("rows="));
                rows += count.and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
            } else if line.contains("table added to the publication") {
                joined += 1;
            }
        }
    }
    (tables, rows, joined)
}
