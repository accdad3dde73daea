//! `pgoutbox verify`: proof of delivery. The outbox table's rows (all, or those created in a
//! range), read in one snapshot, against the stream read from its start: each row must be
//! held once, as its message, a replay's copy or its dead letter (a message with the row's
//! id and another body is another row's: a reused id), and the stream's messages must be in
//! commit order (`domain::delivery`). An acknowledgement is not durability; this is how an
//! operator (or a cron job, by the exit code) learns what a server forgot.
//!
//! Rows deleted by `--retention` are not in the table and are not looked for; rows
//! committed after the snapshot are not either, and the stream is read to its end as it
//! was when the read began, so a row committed just before can be reported missing while
//! pgoutbox publishes it: give `--created-to` a time a few seconds back.

use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;

use crate::domain::delivery::{Findings, OrderCheck, SHOWN};
use crate::nats::publisher::{Publisher, ReadFrom};
use crate::postgres::table_snapshot::Selection;
use crate::service::delivery_check::{self, Checked};
use crate::settings::cli::{ReplayArgs, VerifyArgs};
use crate::settings::config::Config;

/// Exit code when the stream lacks a row, holds one twice or has one out of order.
const FOUND: u8 = 2;

pub async fn run(config: &Config, args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    if config.messages_only {
        anyhow::bail!(
            "verify compares the outbox table with the stream, and --messages-only reads none"
        );
    }
    let entry = config.replay_entry(args.from_table.as_deref())?;
    let nats = crate::nats::connect::connect_nats(&config.nats).await?;
    let publisher = Publisher::new(nats, &config.stream, crate::nats::connect::ACK_TIMEOUT)
        .with_schedules(config.schedules().cloned().collect());
    let selection = match (&args.created_from, &args.created_to) {
        (None, None) => Selection::Since(None),
        (from, to) => Selection::Created { from: from.clone(), to: to.clone() },
    };
    let checked = delivery_check::check(
        &delivery_check::Scope::of(config),
        &publisher,
        &entry,
        &selection,
        ReadFrom::Start,
        true,
    )
    .await
    .with_context(|| format!("verifying {}", entry.table))?;
    let Checked { table: name, findings, order, last } = &checked;
    let clean = checked.clean();
    report(config, args, name, (findings, order, *last));
    if args.replay_missing && findings.missing > 0 {
        let replay = ReplayArgs {
            ids: findings.missing_ids.clone(),
            created_from: None,
            created_to: None,
            dead_letters: false,
            dry_run: false,
            rate: None,
            replay_id: None,
            from_table: args.from_table.clone(),
            objects: Default::default(),
        };
        crate::commands::replay::run(config, &replay)
            .await
            .context("handing the missing rows to replay")?;
    }
    Ok(if clean { ExitCode::SUCCESS } else { ExitCode::from(FOUND) })
}

fn report(
    config: &Config,
    args: &VerifyArgs,
    table: &str,
    (findings, order, last): (&Findings, &OrderCheck, u64),
) {
    let shown = |ids: &[String]| ids.iter().take(SHOWN).cloned().collect::<Vec<_>>();
    if args.json {
        let report = json!({
            "table": table,
            "stream": config.stream,
            "stream_last_sequence": last,
            "created_from": args.created_from,
            "created_to": args.created_to,
            "rows": findings.rows,
            "missing": findings.missing,
            "missing_ids": shown(&findings.missing_ids),
            "duplicated": findings.duplicated,
            "duplicated_ids": shown(&findings.duplicated_ids),
            "out_of_order": order.violations,
            "out_of_order_examples": order.examples,
        });
        say!("{report:#}");
        return;
    }
    say!(
        "verify {table}: {} rows, {} missing from stream {} (read to sequence {last}), {} \
         held twice, {} messages out of commit order",
        findings.rows,
        findings.missing,
        config.stream,
        findings.duplicated,
        order.violations
    );
    if findings.missing > 0 {
        let ids = shown(&findings.missing_ids).join(",");
        say!("missing (first {SHOWN}): {ids}");
        if !args.replay_missing {
            let table = args.from_table.as_deref().map(|t| format!(" --from-table {t}"));
            say!(
                "publish them again: pgoutbox replay{} --ids {ids}, or verify --replay-missing",
                table.unwrap_or_default()
            );
        }
    }
    if findings.duplicated > 0 {
        say!("held twice (first {SHOWN}): {}", shown(&findings.duplicated_ids).join(","));
    }
    for example in &order.examples {
        say!("out of order: {example}");
    }
}
