//! The tenants' checker: the stream's tenant messages held against what the tenants' writer
//! committed. Every committed tenant row exactly once (as its message or as its dead
//! letter), whether it was streamed from the WAL or adopted (an adoption's rows are
//! published as the table's own, unmarked, under their own ids); within each tenant, the
//! rows delivered at once in commit order, adopted ones included; each scheduled row
//! delivered once, on its tenant's subject, not before its time, and no schedule left
//! waiting. Rows of a tenant dropped since are demanded as any: it was dropped only once
//! its rows were in the stream.

use std::collections::HashMap;

use super::{TenantLedger, TenantRow};
use crate::support::soak::check::Verdict;
use crate::support::stream::Stored;

/// What the stream holds of the tenants, besides the violations.
#[derive(Debug, Default)]
pub struct TenantFigures {
    pub stored: usize,
    pub dead_letters: usize,
    /// Scheduled rows delivered (at or after their time).
    pub delivered: usize,
    /// Messages still held on a schedule's subject.
    pub held: usize,
    pub maybe_stored: usize,
    /// Tenants with a row in the stream.
    pub tenants: usize,
    /// Rows a seed put before an earlier row of their own transaction: allowed, since crash
    /// recovery of Postgres resets the command id that orders them and a uuid-keyed table
    /// records no other (docs/guarantees.md#a-lost-slot-or-a-new-stream-is-seeded-from-the-table-each-row-once, "Order").
    pub seeded_within_a_transaction: usize,
}

impl TenantFigures {
    pub fn summary(&self, ledger: &TenantLedger, adopted: (usize, u64, usize)) -> String {
        let dropped = ledger.dropped.len();
        let retiring = match ledger.retiring_at_end {
            Some(t) => format!(" (tenant_{t} retired, not yet dropped at the end)"),
            None => String::new(),
        };
        format!(
            "tenants: {created} created ({with_rows} with {rows_at_create} rows in the \
             creating transaction), {dropped} dropped{retiring}; adoptions in the logs: \
             {tables} tables, {handed} rows handed over; {joined} tables joined before a new \
             stream's slot\ntenant rows: {committed} committed ({maybe} maybe; lost COMMITs looked up: \
             {yes} committed, {no} not) in {transactions} transactions ({rolled_back} rolled \
             back, {failed} failed); stream: {stored} messages of {tenants} tenants, \
             {letters} dead letters; scheduled: {scheduled} rows, {delivered} delivered, \
             {held} still held; {reseeded} seeded rows out of their transaction's order \
             (allowed)\n",
            created = ledger.created,
            with_rows = ledger.created_with_rows.0,
            rows_at_create = ledger.created_with_rows.1,
            tables = adopted.0,
            handed = adopted.1,
            joined = adopted.2,
            committed = ledger.committed.len(),
            maybe = ledger.maybe.len(),
            yes = ledger.looked_up.0,
            no = ledger.looked_up.1,
            transactions = ledger.transactions,
            rolled_back = ledger.rolled_back,
            failed = ledger.failed,
            stored = self.stored,
            tenants = self.tenants,
            letters = self.dead_letters,
            scheduled = ledger.scheduled(),
            delivered = self.delivered,
            held = self.held,
            reseeded = self.seeded_within_a_transaction,
        )
    }
}

/// What a tenant message is.
enum Seen {
    /// A row's message (or its dead letter), of tenant `tenant`, its `s`.
    Row {
        tenant: u32,
        s: u64,
        letter: bool,
    },
    /// Still waiting on a schedule's subject.
    Held {
        id: String,
    },
    Unreadable(String),
}

/// `tenant_<k>` (or `tenant_<k>.outbox`) as `k`.
fn tenant_number(name: &str) -> Option<u32> {
    name.strip_prefix("tenant_")?.split('.').next()?.parse().ok()
}

/// The tenant message `message` is, or `None` for one of the outbox's.
fn seen(message: &Stored) -> Option<Seen> {
    if message.subject.starts_with("schedules.") {
        let id = message.header("Nats-Msg-Id").unwrap_or(&message.subject).to_owned();
        return Some(Seen::Held { id });
    }
    let letter = message.subject.ends_with("dead_letter");
    let on_tenants = message.subject.starts_with("tenants.");
    let body = || serde_json::from_slice::<serde_json::Value>(&message.payload).ok();
    let table = match message.header("Pgoutbox-Table") {
        Some(table) => table.to_owned(),
        None if on_tenants => message.subject.split('.').nth(1).unwrap_or_default().to_owned(),
        None if letter => body()?["table"].as_str()?.to_owned(),
        None => return None,
    };
    if !table.starts_with("tenant_") && !on_tenants {
        return None;
    }
    let body = body();
    let unreadable = || Some(Seen::Unreadable(format!("{} on {}", table, message.subject)));
    let Some(tenant) = tenant_number(&table) else { return unreadable() };
    let s = match (&body, letter) {
        (Some(body), true) => body["row"]["aggregate_id"].as_str().and_then(|s| s.parse().ok()),
        (Some(body), false) => body["s"].as_u64(),
        (None, _) => None,
    };
    match s {
        Some(s) => Some(Seen::Row { tenant, s, letter }),
        None => unreadable(),
    }
}

/// Where a message is: its place in the stream as read (`#`: schedules delivered and
/// removed are not counted, so it runs behind the stream's sequence), the position it was
/// published from, and whether a recovery's seed published it.
fn place(message: &Stored, seq: usize) -> String {
    let position = message.header("Pgoutbox-Position").unwrap_or("none");
    let seeded = if is_seeded(message) { ", seeded" } else { "" };
    format!("at #{seq} (position {position}{seeded})")
}

/// Whether a recovery's (or backfill's) seed published `message`.
fn is_seeded(message: &Stored) -> bool {
    message.header("Pgoutbox-Seed").is_some()
}

/// Whether `message` is a tenant's (the outbox's checker passes it by).
pub fn is_tenants(message: &Stored) -> bool {
    seen(message).is_some()
}

/// Holds the stream's tenant messages against `ledger`; violations go into `verdict`.
pub fn check_tenants(
    messages: &[Stored],
    ledger: &TenantLedger,
    verdict: &mut Verdict,
) -> TenantFigures {
    let committed: HashMap<(u32, u64), &TenantRow> =
        ledger.committed.iter().map(|r| ((r.tenant, r.s), r)).collect();
    let maybe: HashMap<(u32, u64), &TenantRow> =
        ledger.maybe.iter().map(|r| ((r.tenant, r.s), r)).collect();
    let dropped: HashMap<u32, f32> = ledger.dropped.iter().copied().collect();
    let known = |key: &(u32, u64)| committed.get(key).or(maybe.get(key)).copied();
    let mut figures = TenantFigures::default();
    let mut stored: HashMap<(u32, u64), usize> = HashMap::new();
    // Each tenant's highest row delivered at once so far, and where.
    let mut highest: HashMap<u32, (u64, usize)> = HashMap::new();
    for (seq, message) in messages.iter().enumerate() {
        let seq = seq + 1;
        let (tenant, s, letter) = match seen(message) {
            None => continue,
            Some(Seen::Held { id }) => {
                figures.held += 1;
                verdict.add("tenant schedule left", format!("#{seq}: {id} still held"));
                continue;
            }
            Some(Seen::Unreadable(what)) => {
                figures.stored += 1;
                verdict.add("tenant unreadable", format!("#{seq}: {what}"));
                continue;
            }
            Some(Seen::Row { tenant, s, letter }) => (tenant, s, letter),
        };
        figures.stored += 1;
        figures.dead_letters += usize::from(letter);
        let key = (tenant, s);
        let times = stored.entry(key).or_default();
        *times += 1;
        if *times > 1 {
            let how = if letter { "as a dead letter" } else { "as a message" };
            verdict.add(
                "tenant duplicate",
                format!("tenant_{tenant} row {s} stored again {} ({how})", place(message, seq)),
            );
            continue;
        }
        let Some(row) = known(&key) else {
            verdict.add("tenant never committed", format!("tenant_{tenant} row {s} at #{seq}"));
            continue;
        };
        if let Some(due) = row.due_nanos {
            if !letter && message.stored_at_nanos < due {
                let early = (due - message.stored_at_nanos) as f64 / 1e6;
                verdict.add(
                    "tenant scheduled early",
                    format!("tenant_{tenant} row {s} delivered {early:.0} ms before its time"),
                );
            }
            figures.delivered += usize::from(!letter);
            continue;
        }
        match highest.get(&tenant) {
            Some(&(top, at)) if s < top => {
                let before = &messages[at - 1];
                let one_transaction = known(&(tenant, top)).is_some_and(|top| top.at == row.at);
                if one_transaction && is_seeded(message) && is_seeded(before) {
                    figures.seeded_within_a_transaction += 1;
                    continue;
                }
                verdict.add(
                    "tenant out of order",
                    format!(
                        "tenant_{tenant} row {s} (committed at {:.1}s) {}, after row {top} {}",
                        row.at,
                        place(message, seq),
                        place(before, at)
                    ),
                );
            }
            _ => {
                highest.insert(tenant, (s, seq));
            }
        }
    }
    figures.tenants = highest.len();
    figures.maybe_stored =
        ledger.maybe.iter().filter(|r| stored.contains_key(&(r.tenant, r.s))).count();
    lost(ledger, &stored, &dropped, verdict);
    figures
}

/// The committed tenant rows the stream lacks, a run of a tenant's rows as one example.
fn lost(
    ledger: &TenantLedger,
    stored: &HashMap<(u32, u64), usize>,
    dropped: &HashMap<u32, f32>,
    verdict: &mut Verdict,
) {
    let mut by_tenant: HashMap<u32, Vec<(&TenantRow, bool)>> = HashMap::new();
    for row in &ledger.committed {
        let missing = !stored.contains_key(&(row.tenant, row.s));
        by_tenant.entry(row.tenant).or_default().push((row, missing));
    }
    let mut tenants: Vec<_> = by_tenant.into_iter().collect();
    tenants.sort_by_key(|(tenant, _)| *tenant);
    for (tenant, rows) in tenants {
        for run in rows.chunk_by(|a, b| a.1 == b.1).filter(|run| run[0].1) {
            let (first, last) = (run[0].0, run[run.len() - 1].0);
            let scheduled = run.iter().filter(|(r, _)| r.due_nanos.is_some()).count();
            let dropped = match dropped.get(&tenant) {
                Some(at) => format!(", tenant dropped at {at:.1}s"),
                None => String::new(),
            };
            verdict.add_many(
                "tenant lost",
                run.len(),
                format!(
                    "tenant_{tenant} rows {}..={} ({} rows, {scheduled} scheduled; committed \
                     at {:.1}s-{:.1}s{dropped})",
                    first.s,
                    last.s,
                    run.len(),
                    first.at,
                    last.at
                ),
            );
        }
    }
}

/// The checker itself: a clean stream passes, and each kind of fault it is to find is found.
#[test]
fn a_lost_doubled_reordered_or_early_tenant_row_is_found() {
    let row = |tenant, s, due_nanos| TenantRow { tenant, s, at: 1.0, due_nanos };
    let ledger = TenantLedger {
        committed: vec![row(1, 0, None), row(1, 1, Some(5_000)), row(1, 2, None), row(2, 0, None)],
        ..TenantLedger::default()
    };
    let message = |tenant: u32, s: u64, at: i128| Stored {
        subject: format!("tenants.tenant_{tenant}.created"),
        headers: vec![("Pgoutbox-Table".into(), format!("tenant_{tenant}.outbox"))],
        payload: format!("{{\"s\": {s}}}").into_bytes(),
        stored_at_nanos: at,
    };
    let outbox = Stored {
        subject: "outbox.order.created".into(),
        headers: vec![("Pgoutbox-Table".into(), "public.outbox".into())],
        payload: b"{\"n\": 0}".to_vec(),
        stored_at_nanos: 0,
    };
    let found = |messages: &[Stored]| {
        let mut verdict = Verdict::default();
        check_tenants(messages, &ledger, &mut verdict);
        verdict.violations.iter().map(|(kind, (n, _))| (*kind, *n)).collect::<Vec<_>>()
    };
    let clean = [message(1, 0, 1), outbox.clone(), message(2, 0, 2), message(1, 2, 3)];
    let delivered = message(1, 1, 6_000);
    assert_eq!(found(&[&clean[..], std::slice::from_ref(&delivered)].concat()), []);
    assert!(!is_tenants(&outbox));
    assert_eq!(found(&clean), [("tenant lost", 1)], "the scheduled row never delivered");
    let doubled = [&clean[..], &[delivered.clone(), message(2, 0, 7)]].concat();
    assert_eq!(found(&doubled), [("tenant duplicate", 1)]);
    let reordered = [message(1, 2, 1), message(2, 0, 2), message(1, 0, 3), delivered.clone()];
    assert_eq!(found(&reordered), [("tenant out of order", 1)]);
    // A seed's rows of one transaction (one commit time) in another order: the documented
    // limit after a crash of Postgres; of two transactions, still a violation.
    let seeded = |tenant, s, at| {
        let mut seeded = message(tenant, s, at);
        seeded.headers.push(("Pgoutbox-Seed".into(), "0/16B3D80".into()));
        seeded
    };
    let one_seed = [seeded(1, 2, 1), message(2, 0, 2), seeded(1, 0, 3), delivered];
    assert_eq!(found(&one_seed), []);
    let mut apart = TenantLedger { committed: ledger.committed.clone(), ..TenantLedger::default() };
    apart.committed[2].at = 2.0;
    let mut verdict = Verdict::default();
    check_tenants(&one_seed, &apart, &mut verdict);
    let kinds: Vec<_> = verdict.violations.iter().map(|(kind, (n, _))| (*kind, *n)).collect();
    assert_eq!(kinds, [("tenant out of order", 1)]);
    let early = [&clean[..], &[message(1, 1, 4_999)]].concat();
    assert_eq!(found(&early), [("tenant scheduled early", 1)]);
    let mut held = message(1, 1, 6_000);
    held.subject = "schedules.OUTBOX.tenant_1.outbox:x.0/1:0".into();
    let left = [&clean[..], &[held]].concat();
    assert_eq!(found(&left), [("tenant lost", 1), ("tenant schedule left", 1)]);
}
