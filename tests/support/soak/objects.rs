//! The soak's large events: a pointer's object read back from its bucket (size and digest
//! checked) and put in the pointer's place, so that the checkers judge the event it
//! carries; a pointer whose object is missing or not whole is a violation, since the
//! durability horizon's look must have stored it again before the slot moved past it.

use async_nats::jetstream;

use super::check::Verdict;
use crate::support::stream::{Stored, fetch_object};

/// What the pointers held: how many there were, and what was wrong with their objects.
pub struct Opened {
    pub pointers: usize,
    pub trouble: Verdict,
}

/// Replaces each pointer's empty body by its object's bytes.
pub async fn open_pointers(js: &jetstream::Context, messages: &mut [Stored]) -> Opened {
    let mut opened = Opened { pointers: 0, trouble: Verdict::default() };
    for message in messages.iter_mut() {
        if message.header("Pgoutbox-Object-Name").is_none() {
            continue;
        }
        opened.pointers += 1;
        match fetch_object(js, message).await {
            Ok(bytes) => message.payload = bytes,
            Err(why) => opened.trouble.add("object lost", format!("{}: {why}", message.subject)),
        }
    }
    opened
}
