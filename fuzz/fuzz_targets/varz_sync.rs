//! The reader of nats-server's `/varz` (`--nats-monitor-url`), on arbitrary bytes: an answer
//! or an error, never a panic, and a sync interval it reports is judged against any horizon
//! without overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgoutbox::parse_varz;

fuzz_target!(|data: &[u8]| {
    if let Ok((_, sync)) = parse_varz(data) {
        let _ = sync.judge(std::time::Duration::from_secs(150));
        let _ = sync.judge(std::time::Duration::MAX);
    }
});
