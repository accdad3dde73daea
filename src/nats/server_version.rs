//! Which nats-server releases pgoutbox supports, read from the version a server announces
//! in its `INFO`. Pure.

/// The releases the test suite runs against (scripts/test-nats-matrix.sh and Debian's 2.9).
pub const TESTED: &str = "2.9, 2.10, 2.11, 2.12 and 2.15";
/// The oldest supported minor release.
const OLDEST: (u32, u32) = (2, 9);

/// One warning line when `version` (as `2.9.10`, `v2.12.8` or `2.11.0-RC.1`) is older than
/// the oldest supported release; `None` for a supported one or one that cannot be read.
pub fn unsupported(version: &str) -> Option<String> {
    let mut parts = version.trim_start_matches('v').split(['.', '-']);
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    ((major, minor) < OLDEST).then(|| {
        format!(
            "nats-server {version} is older than the oldest supported release ({}.{}); \
             pgoutbox is tested on {TESTED}: upgrade the server",
            OLDEST.0, OLDEST.1
        )
    })
}

/// Whether `version` is a release before `minor` (as `(2, 11)`); `false` when it cannot be
/// read, so that a server with an odd version string is left to answer for itself.
pub fn older_than(version: &str, minor: (u32, u32)) -> bool {
    let mut parts = version.trim_start_matches('v').split(['.', '-']);
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let release = parts.next().and_then(|p| p.parse::<u32>().ok());
    major.zip(release).is_some_and(|read| read < minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_before_2_9_are_named_unsupported() {
        for old in ["2.8.4", "v2.2.0", "1.4.1"] {
            let warning = unsupported(old).expect("older than 2.9");
            assert!(warning.contains(old) && warning.contains("2.9"), "{warning}");
        }
        for supported in ["2.9.10", "v2.10.26", "2.12.0-RC.1", "2.15.1", "3.0.0"] {
            assert_eq!(unsupported(supported), None, "{supported}");
        }
        for unreadable in ["", "x.y", "2", "dev"] {
            assert_eq!(unsupported(unreadable), None, "{unreadable}");
        }
    }

    #[test]
    fn features_are_told_by_minor_release() {
        assert!(older_than("2.10.26", (2, 11)) && older_than("v2.9.10", (2, 11)));
        assert!(!older_than("2.11.0-RC.1", (2, 11)) && !older_than("3.0.0", (2, 11)));
        assert!(!older_than("dev", (2, 11)));
    }
}
