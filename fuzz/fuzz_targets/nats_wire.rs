//! The parser of what a NATS server sends on the publishing connection, on arbitrary
//! bytes: every operation it returns lies within the input, and reading op after op ends
//! in "need more" or an error, never a panic or a loop.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgoutbox::nats_wire::parse;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((_, used))) = parse(rest) {
        assert!(used > 0 && used <= rest.len());
        rest = &rest[used..];
    }
});
