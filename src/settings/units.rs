//! Durations and byte sizes as operators write them in flags (`24h`, `32MiB`).

use std::time::Duration;

/// A whole number of seconds, minutes, hours or days: `90s`, `15m`, `24h`, `7d`; more than 0.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = split_number(text);
    let number: u64 =
        number.parse().map_err(|_| format!("{text:?} is not a duration like 30s, 15m or 24h"))?;
    let seconds: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: use a number with s, m, h or d, like 24h")),
    };
    match number.checked_mul(seconds) {
        Some(0) => Err("must be more than 0".to_owned()),
        Some(total) => Ok(Duration::from_secs(total)),
        None => Err(format!("{text:?} is too long")),
    }
}

/// A byte count with an optional unit: `B`, `kB`/`MB`/`GB` (powers of 1000) or
/// `KiB`/`MiB`/`GiB` (powers of 1024), as Postgres and Kubernetes write them.
pub fn parse_byte_size(text: &str) -> Result<usize, String> {
    let (number, unit) = split_number(text);
    let multiplier: usize = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown unit {other:?}: use B, kB, MB, GB, KiB, MiB or GiB")),
    };
    let number: usize =
        number.parse().map_err(|_| format!("{text:?} is not a byte size like 32MiB"))?;
    match number.checked_mul(multiplier) {
        Some(0) => Err("must be more than 0 bytes".to_owned()),
        Some(bytes) => Ok(bytes),
        None => Err(format!("{text:?} is too large")),
    }
}

/// `" 32 MiB "` → `("32", "MiB")`.
fn split_number(text: &str) -> (&str, &str) {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    (number, unit.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        for bad in ["", "24", "h", "-1h", "1.5h", "1w", "0s", "300000000000000d"] {
            assert!(parse_duration(bad).is_err(), "{bad} was accepted");
        }
        assert_eq!(parse_duration("0s"), Err("must be more than 0".to_owned()));
    }

    #[test]
    fn byte_sizes_take_decimal_and_binary_units() {
        assert_eq!(parse_byte_size("32MiB"), Ok(32 << 20));
        assert_eq!(parse_byte_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_byte_size("4096"), Ok(4096));
        assert_eq!(parse_byte_size(" 8 KiB "), Ok(8192));
        assert!(parse_byte_size("0").is_err());
        assert!(parse_byte_size("12 parsecs").is_err());
        assert!(parse_byte_size("MiB").is_err());
        assert!(parse_byte_size("99999999999999999999GiB").is_err());
    }
}
