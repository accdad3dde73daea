//! Durations and byte sizes as operators write them in flags (`24h`, `32MiB`).

use std::time::Duration;

/// A flag's value is not a duration or byte size pgoutbox can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("{0:?} is not a number followed by a unit, like {1}")]
    NotANumber(String, &'static str),
    #[error("{0:?}: unknown unit; use {1}")]
    UnknownUnit(String, &'static str),
    #[error("must be more than 0")]
    Zero,
    #[error("{0:?} is too large")]
    TooLarge(String),
}

const DURATION_UNITS: &str = "s, m, h or d, like 24h";
const SIZE_UNITS: &str = "B, kB, MB, GB, KiB, MiB or GiB, like 32MiB";

/// A whole number of seconds, minutes, hours or days: `90s`, `15m`, `24h`, `7d`; more than 0.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let (number, unit) = split_number(text);
    let number: u64 =
        number.parse().map_err(|_| UnitError::NotANumber(text.to_owned(), DURATION_UNITS))?;
    let seconds: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(UnitError::UnknownUnit(text.to_owned(), DURATION_UNITS)),
    };
    match number.checked_mul(seconds) {
        Some(0) => Err(UnitError::Zero),
        Some(total) => Ok(Duration::from_secs(total)),
        None => Err(UnitError::TooLarge(text.to_owned())),
    }
}

/// Like [`parse_duration`], where 0 is meaningful (`--recover-margin 0s`: trust the clocks).
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, UnitError> {
    match parse_duration(text) {
        Err(UnitError::Zero) => Ok(Duration::ZERO),
        other => other,
    }
}

/// A byte count with an optional unit: `B`, `kB`/`MB`/`GB` (powers of 1000) or
/// `KiB`/`MiB`/`GiB` (powers of 1024), as Postgres and Kubernetes write them.
pub fn parse_byte_size(text: &str) -> Result<usize, UnitError> {
    let (number, unit) = split_number(text);
    let multiplier: usize = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(UnitError::UnknownUnit(text.to_owned(), SIZE_UNITS)),
    };
    let number: usize =
        number.parse().map_err(|_| UnitError::NotANumber(text.to_owned(), SIZE_UNITS))?;
    match number.checked_mul(multiplier) {
        Some(0) => Err(UnitError::Zero),
        Some(bytes) => Ok(bytes),
        None => Err(UnitError::TooLarge(text.to_owned())),
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
        assert_eq!(parse_duration("0s"), Err(UnitError::Zero));
        assert_eq!(parse_duration_or_zero("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration_or_zero("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1w"), Err(UnitError::UnknownUnit("1w".into(), DURATION_UNITS)));
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
