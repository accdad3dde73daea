//! The soak's large events: a pointer's object read back from its bucket (size and digest
//! checked) and put in the pointer's place, so that the checkers judge the event it
//! carries; a pointer whose object is missing or not whole is a violation, since the
//! durability horizon's look must have stored it again before the slot moved past it.
//!
//! The bucket's stream is read once, whole: a read per object (async-nats's `get`) makes a
//! consumer each, and nats-server 2.15 refuses the 1,001st ("maximum consumers limit
//! reached") while the ones before wait for their inactivity to end.

use std::collections::HashMap;

use super::check::Verdict;
use crate::support::stream::{Stored, read_all, sha256_hex};
use async_nats::jetstream;

/// What the pointers held: how many there were, and what was wrong with their objects.
pub struct Opened {
    pub pointers: usize,
    pub trouble: Verdict,
}

/// Replaces each pointer's empty body by its object's bytes.
pub async fn open_pointers(js: &jetstream::Context, messages: &mut [Stored]) -> Opened {
    let mut opened = Opened { pointers: 0, trouble: Verdict::default() };
    let mut buckets: HashMap<String, Bucket> = HashMap::new();
    for message in messages.iter_mut() {
        let (Some(bucket), Some(name)) =
            (message.header("Pgoutbox-Object-Bucket"), message.header("Pgoutbox-Object-Name"))
        else {
            continue;
        };
        opened.pointers += 1;
        if !buckets.contains_key(bucket) {
            buckets.insert(bucket.to_owned(), Bucket::read(js, bucket).await);
        }
        let object = buckets.get(bucket).and_then(|b| b.object(name));
        match object.ok_or("not in the bucket").and_then(|bytes| matches(message, bytes)) {
            Ok(bytes) => message.payload = bytes,
            Err(why) => {
                let what = format!("{}: object {name}: {why}", message.subject);
                opened.trouble.add("object lost", what);
            }
        }
    }
    opened
}

/// The object's bytes, if they are what the pointer says.
fn matches(pointer: &Stored, bytes: Vec<u8>) -> Result<Vec<u8>, &'static str> {
    if pointer.header("Pgoutbox-Object-Size") != Some(&bytes.len().to_string()) {
        return Err("its size is not the pointer's");
    }
    if pointer.header("Pgoutbox-Object-Sha256") != Some(&sha256_hex(&bytes)) {
        return Err("its digest is not the pointer's");
    }
    Ok(bytes)
}

/// A bucket as its stream holds it: each object's latest metadata, and each nuid's chunks.
struct Bucket {
    /// By object name: the nuid its chunks are stored under, unless deleted.
    nuids: HashMap<String, Option<String>>,
    chunks: HashMap<String, Vec<u8>>,
}

impl Bucket {
    async fn read(js: &jetstream::Context, bucket: &str) -> Bucket {
        let (meta, chunk) = (format!("$O.{bucket}.M."), format!("$O.{bucket}.C."));
        let mut read = Bucket { nuids: HashMap::new(), chunks: HashMap::new() };
        for message in read_all(js, &format!("OBJ_{bucket}")).await {
            if let Some(nuid) = message.subject.strip_prefix(&chunk) {
                read.chunks.entry(nuid.to_owned()).or_default().extend(&message.payload);
            } else if message.subject.starts_with(&meta) {
                let info: serde_json::Value =
                    serde_json::from_slice(&message.payload).unwrap_or_default();
                let name = info["name"].as_str().unwrap_or_default().to_owned();
                let deleted = info["deleted"].as_bool().unwrap_or(false);
                let nuid = info["nuid"].as_str().filter(|_| !deleted).map(str::to_owned);
                read.nuids.insert(name, nuid);
            }
        }
        read
    }

    fn object(&self, name: &str) -> Option<Vec<u8>> {
        let nuid = self.nuids.get(name)?.as_ref()?;
        Some(self.chunks.get(nuid).cloned().unwrap_or_default())
    }
}
