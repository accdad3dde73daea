//! NATS's per-message controls a row may set: `Nats-TTL` from `--ttl-column`, and the
//! `Nats-` headers `--allow-nats-header` lets the headers column set.
//!
//! Any other `Nats-` header in a row is a dead letter: the server acts on them. Some can
//! never be allowed, since they would undo the publish protocol (`domain/publishing.rs`):
//! `Nats-Msg-Id` and `Nats-Expected-*` are pgoutbox's guard, `Nats-Rollup` purges the
//! stream's tail, `Nats-Trace-Only` keeps a message from being stored, the batch and counter
//! headers change what an ack means, and `Nats-Schedule*` makes the server write messages
//! of its own into the stream (a scheduled message's target must be in the same stream),
//! which breaks the chain of expected last sequences; `Nats-TTL` has its own column.

use super::Rejection;

/// The header holding a message's time to live (nats-server 2.11+, `allow_msg_ttl`).
pub const TTL_HEADER: &str = "Nats-TTL";

/// Names (lowercase, a trailing `*` for a prefix) `--allow-nats-header` refuses, and why.
const NEVER_ALLOWED: [(&str, &str); 9] = [
    ("nats-msg-id", "it is the row's id, pgoutbox's own"),
    ("nats-expected-*", "pgoutbox chains every message with these"),
    ("nats-rollup", "it purges messages, the stream's tail among them"),
    ("nats-trace-only", "the message would not be stored"),
    ("nats-batch-*", "pgoutbox publishes one message at a time"),
    ("nats-incr", "counters are not events"),
    ("nats-required-api-level", "pgoutbox checks the server itself"),
    (
        "nats-schedule*",
        "the server would write the scheduled message into pgoutbox's own stream, which breaks \
         its chain of expected last sequences",
    ),
    ("nats-ttl", "use --ttl-column"),
];

/// Why `name` cannot be in `--allow-nats-header`, if it cannot.
pub fn refuse_allowed(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if !lower.starts_with("nats-") || !super::headers::valid_name(name) {
        return Some(format!("{name:?} is not a header name starting with Nats-"));
    }
    NEVER_ALLOWED.iter().find_map(|(never, why)| {
        let matches = match never.strip_suffix('*') {
            Some(prefix) => lower.starts_with(prefix),
            None => lower == *never,
        };
        matches.then(|| format!("{name} cannot be allowed: {why}"))
    })
}

/// A TTL column's value as `Nats-TTL` sends it (whole seconds, or `never`), or why it
/// cannot be one. Taken: `never`, whole seconds (an integer column), or a duration in
/// whole seconds, minutes and hours such as `90s`, `10m`, `1h30m`; at least one second,
/// as nats-server requires. Checked here so that a bad value is a dead letter saying so
/// rather than a publish the server refuses.
pub fn ttl_value(text: &str) -> Result<String, Rejection> {
    let text = text.trim();
    let invalid = || {
        Rejection(format!(
            "{:?} is not a TTL: give whole seconds (e.g. 30), a duration such as 90s, 10m or \
             1h30m, or never",
            super::dead_letter::shorten(text, 64)
        ))
    };
    if text.eq_ignore_ascii_case("never") {
        return Ok("never".into());
    }
    let seconds = match text.parse::<u64>() {
        Ok(seconds) => seconds,
        Err(_) => {
            let mut total: u64 = 0;
            let mut number = String::new();
            for c in text.chars() {
                match c {
                    '0'..='9' => number.push(c),
                    's' | 'm' | 'h' if !number.is_empty() => {
                        let unit = match c {
                            's' => 1,
                            'm' => 60,
                            _ => 3_600,
                        };
                        let n: u64 = number.parse().map_err(|_| invalid())?;
                        total = n
                            .checked_mul(unit)
                            .and_then(|s| total.checked_add(s))
                            .ok_or_else(invalid)?;
                        number.clear();
                    }
                    _ => return Err(invalid()),
                }
            }
            if !number.is_empty() || text.is_empty() {
                return Err(invalid());
            }
            total
        }
    };
    // nats-server keeps a TTL as nanoseconds in an int64.
    if seconds == 0 || seconds > i64::MAX as u64 / 1_000_000_000 {
        return Err(Rejection(format!(
            "{text:?} is not a TTL: it must be at least 1s and at most 290 years"
        )));
    }
    Ok(seconds.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_read_as_nats_server_reads_them() {
        for (given, sent) in [
            ("2", "2"),
            ("90s", "90"),
            ("10m", "600"),
            ("1h30m", "5400"),
            (" 5 ", "5"),
            ("NEVER", "never"),
        ] {
            assert_eq!(ttl_value(given).as_deref(), Ok(sent), "{given}");
        }
        for bad in ["0", "0s", "-1", "1.5s", "500ms", "soon", "", "1d", "s", "99999999999999h"] {
            let Rejection(why) = ttl_value(bad).expect_err(bad);
            assert!(why.contains("is not a TTL"), "{why}");
        }
    }

    #[test]
    fn headers_that_undo_the_publish_protocol_cannot_be_allowed() {
        for never in [
            "Nats-Msg-Id",
            "Nats-Expected-Last-Sequence",
            "nats-rollup",
            "Nats-Schedule",
            "Nats-Schedule-Target",
            "Nats-TTL",
            "Nats-Batch-Id",
            "Outbox-Thing",
            "Nats",
        ] {
            assert!(refuse_allowed(never).is_some(), "{never}");
        }
        for fine in ["Nats-Trace-Dest", "Nats-Custom"] {
            assert_eq!(refuse_allowed(fine), None, "{fine}");
        }
    }
}
