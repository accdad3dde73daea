//! `pgoutbox replay`: publishes chosen rows of the outbox table again, read from the table
//! in one snapshot, in the seed's order (`postgres::table_snapshot`), each as the row's
//! message (subject, headers) plus `Pgoutbox-Replay: <id>`, under a `Nats-Msg-Id` of its
//! own, `replay:<id>/<index>:<row id>` (`domain::seed::replay_id_prefix`): JetStream stores
//! it even while the row's first message is in its duplicate window.
//!
//! A replay is resumable: each message carries the replay's id, and a replay started again
//! with `--replay-id` reads which rows the stream holds under that id (headers only) and
//! skips them, so a replay killed at any moment and resumed stores every row once (a copy
//! whose ack the kill lost is answered as a duplicate of itself).
//!
//! The stream's order belongs to the pgoutbox source that owns it (its chain refuses a
//! message written behind its back, and its tail skip trusts only its own messages). So a
//! replay into a stream this database's pgoutbox owns goes through it (`handover`), whether
//! it runs at that moment or not: the rows are handed over in the WAL through the replay
//! table, which the operator grants, and it publishes them in commit order. Only into a
//! stream no pgoutbox owns does the replay publish them itself; into another database's
//! pgoutbox's, it is refused.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use async_nats::jetstream::context::PublishAckFuture;
use tokio::sync::mpsc::Receiver;

use crate::domain::outbox::{MessageId, OutboxEvent, RowMapping, TABLE_HEADER, TableEntry};
use crate::domain::row::ColumnValue;
use crate::domain::seed::{REPLAY_HEADER, replay_id_prefix, replay_started, row_id_of};
use crate::nats::publisher::{Publisher, ReadFrom};
use crate::postgres::admin;
use crate::postgres::table_snapshot::{RowBatch, Selection, TableSnapshot};
use crate::settings::cli::ReplayArgs;
use crate::settings::config::Config;

mod handover;
mod progress;
mod route;

use progress::Progress;
use route::{Route, check_handover, route};

/// Publishes awaiting their ack at most.
const IN_FLIGHT: usize = 256;
/// What a replay did.
#[derive(Debug, Default)]
struct Tally {
    stored: u64,
    /// Answered as duplicates: stored by this replay before it was resumed, ack unseen.
    duplicates: u64,
    /// Stored by this replay before it was resumed.
    before: u64,
    /// Rows that still cannot become a message (see the warning for each).
    unpublishable: u64,
    /// Through pgoutbox: the place in the selection of the last row handed over (0: none).
    last_handed: u64,
}

pub async fn run(config: &Config, args: &ReplayArgs) -> anyhow::Result<()> {
    if config.messages_only {
        anyhow::bail!("replay publishes rows of the outbox table, and --messages-only reads none");
    }
    let entry = config.replay_entry(args.from_table.as_deref())?;
    let client = admin::connect(&config.database, &config.pg_tls).await?;
    let publisher = open_stream(config).await?;
    let id = replay_id(args)?;
    let route = route(config, &client, &publisher).await?;
    if route == Route::Direct && args.objects.object_store.is_some() {
        anyhow::bail!("{}", direct_with_objects(&config.stream));
    }
    if let Route::Handover { live } = route {
        check_handover(config, &client, &entry).await?;
        if live && args.replay_id.is_some() && !args.dry_run {
            eprintln!(
                "replay {id}: waiting for pgoutbox to publish what this replay handed over \
                 before"
            );
            let record = crate::postgres::acknowledged::table_in(&config.own_schema);
            handover::settle_earlier_runs(&client, (&config.slot, &record)).await?;
        }
    }
    let selection = selection(config, &entry, args, &publisher).await?;
    let (snapshot, total) = snapshot_of(config, &entry, &selection).await?;
    let done = stored_before(args, &publisher, &id).await?;
    announce(&id, (total, done.len()), &snapshot, route);
    if args.dry_run {
        let left = total.saturating_sub(done.len() as u64);
        say!("dry run: replay {id} would publish up to {left} rows");
        snapshot.close().await;
        return Ok(());
    }
    let plan = Plan { entry, selection, id: id.clone(), done, total };
    // What this run hands over is stored after this (what earlier runs stored is before it).
    let first = match route {
        Route::Handover { live: true } => publisher.last_sequence().await?,
        _ => 0,
    };
    let mut tally = match route {
        Route::Direct => publish(args, &publisher, &snapshot, &plan).await?,
        Route::Handover { live } => {
            let progress = (Progress::start(&publisher, &id, total).await, live);
            handover::hand_over(config, args, &client, &snapshot, &plan, progress).await?
        }
    };
    snapshot.close().await;
    if route == (Route::Handover { live: true }) {
        tally.stored = handover::published(&publisher, &id, first, &tally).await?;
    }
    report(&id, route, &tally);
    Ok(())
}

/// The publisher, its stream made or checked as `run` would.
async fn open_stream(config: &Config) -> anyhow::Result<Publisher> {
    let nats = crate::nats::connect::connect_nats(&config.nats).await?;
    let publisher = Publisher::new(nats, &config.stream, crate::nats::connect::ACK_TIMEOUT)
        .with_schedules(config.schedules().cloned().collect());
    publisher
        .ensure_stream(&config.stream_subjects(), config.stream_replicas, config.stream_features())
        .await
        .with_context(|| format!("preparing stream {}", config.stream))?;
    Ok(publisher)
}

/// Why `--object-store` is refused into a stream no pgoutbox owns: this command publishes
/// the rows there itself, without the Object Store. Into a stream a pgoutbox owns, the flags
/// are taken (one set of settings serves `run` and `replay`) and that pgoutbox stores large
/// payloads by its own.
fn direct_with_objects(stream: &str) -> String {
    format!(
        "--object-store: no pgoutbox writes stream {stream}, so replay publishes the rows \
         itself and stores no object: drop --object-store and its --object-store-* settings, \
         or replay into the stream of a running pgoutbox, which stores large payloads itself"
    )
}

/// `--replay-id` when given (a resume), checked; else a new one.
fn replay_id(args: &ReplayArgs) -> anyhow::Result<String> {
    let id = args.replay_id.clone().unwrap_or_else(new_replay_id);
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
        anyhow::bail!("--replay-id {id:?}: use letters, digits, '.', '_' and '-' only");
    }
    Ok(id)
}

/// The table frozen for the replay, and how many rows of `selection` it holds: none is
/// [`NothingSelected`], with some ids the table has.
async fn snapshot_of(
    config: &Config,
    entry: &TableEntry,
    selection: &Selection,
) -> anyhow::Result<(TableSnapshot, u64)> {
    let session = TableSnapshot::session(&config.database, &config.pg_tls, None).await?;
    let snapshot =
        TableSnapshot::read_set(session, &[(&entry.table, &entry.roles)], &config.trusted_owners)
            .await?;
    let total = snapshot.count(selection).await?;
    if total == 0 {
        let ids = snapshot.some_ids(3).await?;
        snapshot.close().await;
        return Err(NothingSelected(nothing_selected(&entry.table, selection, &ids)).into());
    }
    Ok((snapshot, total))
}

/// The rows this replay stored before: only a replay resumed by hand (`--replay-id`) can
/// have stored any.
async fn stored_before(
    args: &ReplayArgs,
    publisher: &Publisher,
    id: &str,
) -> anyhow::Result<HashSet<String>> {
    if args.replay_id.is_none() {
        return Ok(HashSet::new());
    }
    // A replay id made here says when it began; one chosen by hand means reading it all.
    let from = replay_started(id).map_or(ReadFrom::Start, |s| ReadFrom::Time(s as f64 - 60.0));
    let (done, _) = publisher
        .row_ids(from, None, Some((REPLAY_HEADER, id)))
        .await
        .context("reading what this replay stored already")?;
    Ok(done)
}

/// Says on stderr what the replay is about to do, and how to resume it.
fn announce(id: &str, (total, before): (u64, usize), snapshot: &TableSnapshot, route: Route) {
    let by = match route {
        Route::Handover { live: true } => "handed to the pgoutbox streaming into this stream",
        Route::Handover { live: false } => {
            "handed to the pgoutbox that owns this stream, to publish when it runs"
        }
        Route::Direct => "published by this command (no pgoutbox owns this stream)",
    };
    eprintln!(
        "replay {id}: {total} rows selected ({}), {before} stored by this replay before; {by}; \
         resume with --replay-id {id}",
        snapshot.order(),
    );
}

/// The replay's last line, on stdout.
fn report(id: &str, route: Route, tally: &Tally) {
    if route == (Route::Handover { live: false }) {
        say!(
            "replay {id}: {} handed over, to be published when pgoutbox runs; {} stored \
             before the resume, {} cannot be published (see the warnings)",
            tally.stored,
            tally.before,
            tally.unpublishable
        );
        return;
    }
    say!(
        "replay {id}: {} stored, {} already in the stream, {} stored before the resume, {} \
         cannot be published (see the warnings)",
        tally.stored,
        tally.duplicates,
        tally.before,
        tally.unpublishable
    );
}

/// The rows asked for; `--dead-letters` reads their ids from the entry's dead-letter
/// subject, the letters of its table: with several tables, those whose `Pgoutbox-Table`
/// names it, their ids without the table's qualifier (`<schema>.<table>:`).
async fn selection(
    config: &Config,
    entry: &TableEntry,
    args: &ReplayArgs,
    publisher: &Publisher,
) -> anyhow::Result<Selection> {
    let ranged = args.created_from.is_some() || args.created_to.is_some();
    match (!args.ids.is_empty(), ranged, args.dead_letters) {
        (true, false, false) => Ok(Selection::Ids(args.ids.clone())),
        (false, true, false) => {
            Ok(Selection::Created { from: args.created_from.clone(), to: args.created_to.clone() })
        }
        (false, false, true) => {
            let subject = &entry.dead_letter_subject;
            let table = entry.table.to_string();
            // With one table, letters of an older version, without the header, are its own.
            let several = config.pipeline.tables.len() > 1;
            let only = several.then_some((TABLE_HEADER, table.as_str()));
            let (ids, _) = publisher
                .row_ids(ReadFrom::Start, Some(subject), only)
                .await
                .with_context(|| format!("reading the dead letters on {subject}"))?;
            let qualifier = match entry.message_id {
                MessageId::Qualified => format!("{table}:"),
                MessageId::Row => String::new(),
            };
            let ids = ids.iter().map(|id| id.strip_prefix(&qualifier).unwrap_or(id).to_owned());
            Ok(Selection::Ids(ids.collect()))
        }
        _ => anyhow::bail!(
            "say which rows to replay: --ids, --created-from/--created-to, or --dead-letters"
        ),
    }
}

/// `r<epoch seconds>-<16 hex digits>`: when it began (`replay_started` reads it) and 64
/// bits no other replay shares, even one started in the same second on another host. The
/// bits hash the time in nanoseconds, the process id and a counter with std's `RandomState`,
/// whose keys come from the operating system's randomness.
fn new_replay_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(now.as_nanos());
    hasher.write_u32(std::process::id());
    hasher.write_u64(MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    format!("r{}-{:016x}", now.as_secs(), hasher.finish())
}

/// A replay whose selection matched no row of the table: `main` exits with
/// [`NothingSelected::EXIT_CODE`], so a script tells it from a failure (exit 1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NothingSelected(String);

impl NothingSelected {
    pub const EXIT_CODE: u8 = 3;
}

/// One line: what was asked, and how the table's ids look (`ids`, a few of them).
fn nothing_selected(
    table: &impl std::fmt::Display,
    selection: &Selection,
    ids: &[String],
) -> String {
    let asked = match selection {
        Selection::Ids(asked) if asked.is_empty() => {
            return format!("replay: no dead letter in the stream names a row of {table}");
        }
        Selection::Ids(asked) => {
            let mut shown: Vec<&str> = asked.iter().take(5).map(String::as_str).collect();
            if asked.len() > shown.len() {
                shown.push("…");
            }
            format!("has id {}", shown.join(" or "))
        }
        Selection::Created { from, to } => format!(
            "was created in [{}, {})",
            from.as_deref().unwrap_or("-infinity"),
            to.as_deref().unwrap_or("infinity")
        ),
        Selection::Since(_) => "is selected".to_owned(),
    };
    let looks = match ids {
        [] => format!("{table} is empty"),
        ids => format!("its ids look like {}", ids.join(", ")),
    };
    format!("replay: no row of {table} {asked}; {looks}")
}

/// What one run of a replay publishes.
struct Plan {
    /// The table replayed, with its settings.
    entry: TableEntry,
    selection: Selection,
    id: String,
    /// Rows this replay stored before it was resumed.
    done: HashSet<String>,
    total: u64,
}

impl Plan {
    /// The row's message, when the row is to go out: not stored by this replay before, and
    /// publishable as it is now (else named on stderr). Each row left out is counted in
    /// `tally`.
    fn admit(
        &self,
        mapping: &RowMapping,
        tuple: &[ColumnValue],
        tally: &mut Tally,
    ) -> Option<OutboxEvent> {
        let row_id = mapping.row_id(tuple).unwrap_or_default();
        let row_id = row_id_of(&row_id);
        if self.done.contains(row_id) {
            tally.before += 1;
            return None;
        }
        match mapping.map(tuple) {
            Ok(event) => Some(event),
            Err(rejection) => {
                tracing::warn!(id = %row_id, reason = %rejection.0,
                    "the row still cannot be published; fix it and replay it again");
                eprintln!("row {row_id:?} still cannot be published: {}", rejection.0);
                tally.unpublishable += 1;
                None
            }
        }
    }
}

/// The table reader's next rows; none at the end.
async fn next_rows(rows: &mut Receiver<RowBatch>) -> anyhow::Result<Vec<Vec<ColumnValue>>> {
    let batch = rows.recv().await.context("the table reader stopped early")?;
    batch.context("reading the rows to replay")
}

async fn publish(
    args: &ReplayArgs,
    publisher: &Publisher,
    snapshot: &TableSnapshot,
    plan: &Plan,
) -> anyhow::Result<Tally> {
    let Plan { selection, id, total, .. } = plan;
    let mapping = RowMapping::of_entry(snapshot.relation(), &plan.entry)?;
    let (mut rows, _reader) = snapshot.read(selection);
    let mut pace = args.rate.map(|rate| {
        let mut pace = tokio::time::interval(Duration::from_secs(1) / rate.get());
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        pace
    });
    let mut in_flight: VecDeque<PublishAckFuture> = VecDeque::new();
    let mut tally = Tally::default();
    let mut progress = Progress::start(publisher, id, *total).await;
    let mut seen = 0u64;
    loop {
        let batch = next_rows(&mut rows).await?;
        if batch.is_empty() {
            break;
        }
        for tuple in batch {
            seen += 1;
            let mapping = mapping.clone().with_id_prefix(replay_id_prefix(id, seen));
            let Some(event) = plan.admit(&mapping, &tuple, &mut tally) else { continue };
            if let Some(pace) = pace.as_mut() {
                pace.tick().await;
            }
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(REPLAY_HEADER, id.as_str());
            for (name, value) in event.headers.iter() {
                headers.insert(name, value);
            }
            let ack = publisher
                .context()
                .publish_with_headers(event.subject, headers, event.payload)
                .await
                .context("publishing a replayed row")?;
            in_flight.push_back(ack);
            while in_flight.len() >= IN_FLIGHT {
                settle(&mut in_flight, &mut tally).await?;
            }
            progress.tick(seen, |pace| format!("{seen} of {total} rows ({pace:.0} rows/s)")).await;
        }
    }
    while !in_flight.is_empty() {
        settle(&mut in_flight, &mut tally).await?;
    }
    progress.finish(seen).await;
    Ok(tally)
}

/// Awaits the oldest ack.
async fn settle(
    in_flight: &mut VecDeque<PublishAckFuture>,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let Some(ack) = in_flight.pop_front() else { return Ok(()) };
    let ack = ack.await.context("JetStream did not acknowledge a replayed row; run the same replay again with --replay-id to go on")?;
    if ack.duplicate {
        tally.duplicates += 1;
    } else {
        tally.stored += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::settings::cli::{Cli, Command};

    /// `replay` runs with `run`'s settings: the Object Store's are taken (issue 71: it
    /// refused `--object-store` though the docs say to run it with the same settings), and
    /// refused only where they cannot apply, in one line naming what to drop.
    #[test]
    fn replay_takes_run_s_object_store_settings() {
        let argv = ["pgoutbox", "replay", "--ids", "42", "--object-store", "payloads"];
        let more = ["--object-store-over", "256KiB", "--object-store-max-age", "7d"];
        let cli = Cli::try_parse_from(argv.iter().chain(&more)).expect("replay takes them");
        let Command::Replay(args) = cli.command else { panic!("not replay: {:?}", cli.command) };
        let large = args.objects.large_payloads().expect("the Object Store's settings");
        assert_eq!((large.bucket.as_str(), large.over), ("payloads", Some(256 << 10)));
        let why = super::direct_with_objects("OUTBOX_REPLAY");
        assert!(!why.contains('\n') && why.contains("drop --object-store"), "{why}");
    }
}
