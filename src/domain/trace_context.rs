//! W3C Trace Context's `traceparent` header (<https://www.w3.org/TR/trace-context/>), read
//! from a row's headers and written on the message pgoutbox publishes. Pure: the spans
//! themselves are made in `service::traces`, only when tracing is configured.
//!
//! A value that does not parse is not an error: it names no parent, and the span it would
//! have parented starts a trace of its own. A row is never refused for its trace context.

use std::fmt;
use std::str::FromStr;

/// The header that carries the trace a message belongs to and its parent span.
pub const TRACEPARENT: &str = "traceparent";
/// Vendors' opaque state that travels with the trace.
pub const TRACESTATE: &str = "tracestate";

/// A parsed `traceparent`: `00-<trace id, 32 hex>-<parent span id, 16 hex>-<flags, 2 hex>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// Bit 0 is `sampled`: the caller may have recorded its span.
    pub flags: u8,
}

/// Why a `traceparent` value names no parent.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, lowercase, ids not all zero)")]
pub struct InvalidTraceParent;

impl TraceParent {
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

impl FromStr for TraceParent {
    type Err = InvalidTraceParent;

    /// As the recommendation reads it: version `ff` is invalid; version `00` is exactly 55
    /// characters; a later version may append fields after a `-`, which are ignored.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let value = value.trim_matches([' ', '\t']).as_bytes();
        let fields_end = 55;
        let version = value.get(..2).and_then(hex::<1>).ok_or(InvalidTraceParent)?[0];
        let well_sized = match version {
            0xff => false,
            0 => value.len() == fields_end,
            _ => value.len() == fields_end || value.get(fields_end) == Some(&b'-'),
        };
        let dashes = [2, 35, 52].iter().all(|&i| value.get(i) == Some(&b'-'));
        if !well_sized || !dashes {
            return Err(InvalidTraceParent);
        }
        let trace_id = hex::<16>(&value[3..35]).ok_or(InvalidTraceParent)?;
        let span_id = hex::<8>(&value[36..52]).ok_or(InvalidTraceParent)?;
        let flags = hex::<1>(&value[53..55]).ok_or(InvalidTraceParent)?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return Err(InvalidTraceParent);
        }
        Ok(TraceParent { trace_id, span_id, flags })
    }
}

impl fmt::Display for TraceParent {
    /// Into one buffer and written once: a `{:02x}` per byte was a third of the cost of a
    /// message's trace context.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = *b"00-00000000000000000000000000000000-0000000000000000-00";
        let fields = [(3, &self.trace_id[..]), (36, &self.span_id[..]), (53, &[self.flags][..])];
        for (start, bytes) in fields {
            for (i, byte) in bytes.iter().enumerate() {
                text[start + 2 * i] = DIGITS[usize::from(byte >> 4)];
                text[start + 2 * i + 1] = DIGITS[usize::from(byte & 0xf)];
            }
        }
        // Only ASCII digits and dashes were written.
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

/// `N` bytes from `2 * N` lowercase hex digits (uppercase is invalid in a traceparent).
fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    if digits.len() != 2 * N {
        return None;
    }
    let mut bytes = [0; N];
    for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_recommendations_example_parses_and_formats_back() {
        let parent: TraceParent = EXAMPLE.parse().unwrap();
        assert_eq!(parent.trace_id[0], 0x4b);
        assert_eq!(parent.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert!(parent.sampled());
        assert_eq!(parent.to_string(), EXAMPLE);
        let unsampled = TraceParent { flags: 0, ..parent };
        assert!(!unsampled.sampled());
        assert!(unsampled.to_string().ends_with("-00"));
    }

    #[test]
    fn surrounding_blanks_and_a_later_versions_extra_fields_are_accepted() {
        assert!(format!(" {EXAMPLE}\t").parse::<TraceParent>().is_ok());
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        let parent: TraceParent = later.parse().unwrap();
        assert_eq!(parent.to_string(), EXAMPLE, "written back as version 00");
    }

    #[test]
    fn malformed_values_name_no_parent_and_never_panic() {
        let bad = [
            "",
            "00",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ü1",
            "0ü-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for value in bad {
            assert_eq!(value.parse::<TraceParent>(), Err(InvalidTraceParent), "{value:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_text_parses_or_is_refused_without_panicking(value in ".{0,80}") {
            let _ = value.parse::<TraceParent>();
        }

        #[test]
        fn any_ids_round_trip(trace in proptest::array::uniform16(1u8..), span in proptest::array::uniform8(1u8..), flags: u8) {
            let parent = TraceParent { trace_id: trace, span_id: span, flags };
            proptest::prop_assert_eq!(parent.to_string().parse::<TraceParent>(), Ok(parent));
        }
    }
}
