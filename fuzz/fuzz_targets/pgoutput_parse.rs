//! The pgoutput decoder on arbitrary bytes: it must return `Ok` or `Err`, never panic,
//! and never allocate more than the input can justify (libFuzzer's -rss_limit_mb catches
//! that). Seed it with `tests/fixtures/pgoutput/*.bin`.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pgoutbox::postgres::pgoutput::LogicalMessage;

fuzz_target!(|data: &[u8]| {
    let _ = LogicalMessage::parse(&Bytes::copy_from_slice(data));
});
