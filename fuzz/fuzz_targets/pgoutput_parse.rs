//! The pgoutput decoder, and the replayed-row decoder that reuses its parts, on arbitrary
//! bytes: it must return `Ok` or `Err`, never panic,
//! and never allocate more than the input can justify (libFuzzer's -rss_limit_mb catches
//! that). Seed it with `tests/fixtures/pgoutput/*.bin`.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pgoutbox::postgres::pgoutput::{LogicalMessage, ReplayFrame};

fuzz_target!(|data: &[u8]| {
    let data = Bytes::copy_from_slice(data);
    let _ = LogicalMessage::parse(&data);
    let _ = ReplayFrame::decode(&data);
});
