//! What a seeded or replayed message carries (`service::seed`, `commands::replay`): pure
//! names and parsing.

use std::collections::HashMap;

use crate::domain::outbox::DEAD_LETTER_ID_PREFIX;

/// On every seeded message: the consistent point of the snapshot it was read from.
pub const SEED_HEADER: &str = "Pgoutbox-Seed";
/// On every seeded message of a recovery: its bound, in epoch seconds (`service::seed`).
pub const SEED_SINCE_HEADER: &str = "Pgoutbox-Seed-Since";

/// On every message `pgoutbox replay` publishes: the replay's id, by which a replay that
/// was cut short finds what it stored already.
pub const REPLAY_HEADER: &str = "Pgoutbox-Replay";

/// The time a replay id made by `pgoutbox replay` (`r<epoch seconds>-<random>`, or
/// `r<epoch seconds>` before) was made; `None` for an id chosen by hand.
pub fn replay_started(id: &str) -> Option<u64> {
    let made = id.strip_prefix('r')?;
    let seconds = made.split_once('-').map_or(made, |(seconds, _)| seconds);
    seconds.parse().ok()
}

/// Whether `id` may name a replay: letters, digits, '.', '_' and '-', so that
/// [`row_id_of`] reads a replayed message's id back without doubt.
pub fn is_replay_id(id: &str) -> bool {
    !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// What a replay puts before a row's id in its `Nats-Msg-Id`, `replay:<replay id>/<index>:`:
/// a replayed row is a message of its own, stored even while JetStream still holds the
/// first one's id in its duplicate window; the row's place in the replay's selection keeps
/// two rows that share an id (a non-unique id column) apart; and it is the same in every
/// run of one replay over the same rows, so a resumed replay stores it once.
pub fn replay_id_prefix(replay_id: &str, index: u64) -> String {
    format!("{REPLAY_ID_PREFIX}{replay_id}/{index}:")
}

const REPLAY_ID_PREFIX: &str = "replay:";

/// Whether a message's `Nats-Msg-Id` is a replay's: another copy of a row, written beside
/// the stream's order, never a place to anchor a recovery on.
pub fn is_replayed_message(msg_id: &str) -> bool {
    msg_id.starts_with(REPLAY_ID_PREFIX)
}

/// A digest of a message's body, the row's payload: with the row's id, what tells a row's
/// event from another row's that reused its id (a table truncated with its sequence
/// restarted, a restore). Computed in this process only, never stored.
pub fn payload_digest(body: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    body.hash(&mut hasher);
    hasher.finish()
}

/// What a stored message holds of its row's payload: its body's [`payload_digest`], or,
/// for a pointer to an object (`--object-store`), whose body is empty, the object's SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadDigest {
    Body(u64),
    Object([u8; 32]),
}

impl Default for PayloadDigest {
    fn default() -> Self {
        PayloadDigest::Body(0)
    }
}

impl PayloadDigest {
    /// A stored message's, from its body and its `Pgoutbox-Object-Sha256` header, if any
    /// (lowercase hex; a value that is not is read as no pointer).
    pub fn of_message(body: &[u8], object_sha256: Option<&str>) -> PayloadDigest {
        match object_sha256.and_then(sha256_of_hex) {
            Some(digest) => PayloadDigest::Object(digest),
            None => PayloadDigest::Body(payload_digest(body)),
        }
    }

    /// Whether a row's event with this payload is what the message holds.
    pub fn matches(&self, event: &EventPayload) -> bool {
        match self {
            PayloadDigest::Body(digest) => event.body == *digest,
            PayloadDigest::Object(digest) => event.sha256() == digest,
        }
    }
}

/// A row's event payload, as [`PayloadDigest::matches`] compares it: its body digest taken
/// once, its SHA-256 only if a pointer asks for it, and then once.
pub struct EventPayload<'a> {
    bytes: &'a [u8],
    body: u64,
    sha256: std::cell::OnceCell<[u8; 32]>,
}

impl<'a> EventPayload<'a> {
    pub fn new(bytes: &'a [u8]) -> EventPayload<'a> {
        EventPayload { bytes, body: payload_digest(bytes), sha256: Default::default() }
    }

    fn sha256(&self) -> &[u8; 32] {
        use sha2::Digest;
        self.sha256.get_or_init(|| sha2::Sha256::digest(self.bytes).into())
    }
}

fn sha256_of_hex(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(hex.chunks(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(digest)
}

/// The rows a stream holds, by table and row id: what tells a row's event from another
/// row's that reused its id, and a row of one table from a row of another with the same id.
///
/// The table is the message's `Pgoutbox-Table` (a message without it, written before
/// pgoutbox named tables, is the first table's); the id is the message's row id without
/// the `<schema>.<table>:` its table's qualified ids start with, so a row is found whether
/// its message was written with one table (plain ids) or several (qualified ids).
#[derive(Debug, Default)]
pub struct HeldRows(HashMap<(String, String), Vec<Held>>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// A message holding the row's payload digested so.
    Message(PayloadDigest),
    /// A replay's copy of the row (`Pgoutbox-Replay`), its payload digested so: the row is
    /// in the stream, and the copy is no duplicate.
    Replay(PayloadDigest),
    /// A dead letter, with the digest of the payload column's text it carries; `None` when
    /// it left the payload out: it holds its row by id alone.
    Letter(Option<u64>),
}

/// The key of the row `id` (as a message or a mapping names it, qualified or not) of
/// `table` (its `Pgoutbox-Table` value).
fn row_key(table: &str, id: &str) -> (String, String) {
    let own = id.strip_prefix(table).and_then(|rest| rest.strip_prefix(':')).unwrap_or(id);
    (table.to_owned(), own.to_owned())
}

impl HeldRows {
    /// The message of `table` with `Nats-Msg-Id` `msg_id` holding `payload`, published
    /// from a row.
    pub fn insert_message(&mut self, table: &str, msg_id: &str, payload: PayloadDigest) {
        let held = Held::Message(payload);
        self.0.entry(row_key(table, row_id_of(msg_id))).or_default().push(held);
    }

    /// A replay's copy of a row of `table`, under its replay's `Nats-Msg-Id` `msg_id`.
    pub fn insert_replay(&mut self, table: &str, msg_id: &str, payload: PayloadDigest) {
        let held = Held::Replay(payload);
        self.0.entry(row_key(table, row_id_of(msg_id))).or_default().push(held);
    }

    /// How many messages (not replays, not letters) of `table` hold the row `id` whose
    /// event's payload is `event`: more than one is a duplicate.
    pub fn copies(&self, table: &str, id: &str, event: &EventPayload) -> usize {
        let held = self.0.get(&row_key(table, id));
        let copy = |held: &&Held| matches!(held, Held::Message(digest) if digest.matches(event));
        held.map_or(0, |held| held.iter().filter(copy).count())
    }

    /// A dead letter of the row `id` of `table`, carrying the payload column's text
    /// `payload`.
    pub fn insert_letter(&mut self, table: &str, id: &str, payload: Option<&str>) {
        let held = Held::Letter(payload.map(|text| payload_digest(text.as_bytes())));
        self.0.entry(row_key(table, id)).or_default().push(held);
    }

    /// Whether some message names the row id `id` of `table`.
    pub fn has_id(&self, table: &str, id: &str) -> bool {
        self.0.contains_key(&row_key(table, id))
    }

    /// Whether the stream holds the row of `table` with `id` whose event's payload is
    /// `event` (`None`: it cannot become a message) and whose payload column's text digests
    /// to `payload`: as that message, or as its dead letter.
    pub fn holds(
        &self,
        table: &str,
        id: &str,
        event: Option<&EventPayload>,
        payload: Option<u64>,
    ) -> bool {
        self.0.get(&row_key(table, id)).is_some_and(|held| {
            held.iter().any(|held| match *held {
                Held::Message(digest) | Held::Replay(digest) => {
                    event.is_some_and(|event| digest.matches(event))
                }
                Held::Letter(None) => true,
                Held::Letter(digest) => digest == payload,
            })
        })
    }

    /// How many rows.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn extend(&mut self, other: HeldRows) {
        for (key, held) in other.0 {
            self.0.entry(key).or_default().extend(held);
        }
    }
}

/// The id of the row a message of `table` names, without its table's qualifier: how the
/// recovery's anchor finds the row in its table.
pub fn own_row_id<'a>(table: &str, msg_id: &'a str) -> &'a str {
    let id = row_id_of(msg_id);
    id.strip_prefix(table).and_then(|rest| rest.strip_prefix(':')).unwrap_or(id)
}

/// The row a message was published from, by its `Nats-Msg-Id`: the id itself, or the id a
/// dead letter or a replay is named after (a letter named by position names no row id).
/// A replay id has no `:` and no `/` ([`is_replay_id`]), so both `replay:<id>/<index>:<row>`
/// and the older `replay:<id>:<row>` read back.
pub fn row_id_of(msg_id: &str) -> &str {
    let id = msg_id.strip_prefix(DEAD_LETTER_ID_PREFIX).unwrap_or(msg_id);
    match id.strip_prefix(REPLAY_ID_PREFIX).and_then(|rest| rest.split_once(':')) {
        Some((_, row)) => row,
        None => id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_names_its_row() {
        assert_eq!(row_id_of("42"), "42");
        assert_eq!(row_id_of("dead-letter:42"), "42");
        assert_eq!(row_id_of("dead-letter:dead-letter:1"), "dead-letter:1");
    }

    #[test]
    fn a_replayed_row_and_its_dead_letter_name_the_row() {
        let msg_id = format!("{}7f0c:1", replay_id_prefix("r1764050000", 12));
        assert_eq!(msg_id, "replay:r1764050000/12:7f0c:1");
        assert_eq!(row_id_of(&msg_id), "7f0c:1");
        assert_eq!(row_id_of("replay:r1764050000:7f0c:1"), "7f0c:1", "the older form");
        assert_eq!(row_id_of(&format!("dead-letter:{msg_id}")), "7f0c:1");
        assert_eq!(row_id_of("replay:"), "replay:", "no replay id: taken as it is");
    }

    #[test]
    fn a_replay_id_holds_no_separator() {
        assert!(is_replay_id("r1764050000") && is_replay_id("night.ly_2-b"));
        for bad in ["", "a:b", "a/b", "a b", "é"] {
            assert!(!is_replay_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_made_replay_id_says_when_it_began() {
        assert_eq!(replay_started("r1764050000"), Some(1_764_050_000));
        assert_eq!(replay_started("r1764050000-0f3a9c2b7d4e5a61"), Some(1_764_050_000));
        assert_eq!(replay_started("nightly"), None);
        assert_eq!(replay_started("r12x"), None);
    }

    #[test]
    fn a_row_is_held_only_with_its_own_payload() {
        let digest = |text: &str| Some(payload_digest(text.as_bytes()));
        let body = |text: &str| PayloadDigest::of_message(text.as_bytes(), None);
        let mut held = HeldRows::default();
        let t = "public.outbox";
        held.insert_message(t, "7", body("{\"n\": 1}"));
        held.insert_letter(t, "8", Some("{\"n\": 3}"));
        held.insert_letter(t, "9", None);
        assert!(held.holds(t, "7", Some(&EventPayload::new(b"{\"n\": 1}")), None));
        assert!(!held.holds(t, "7", Some(&EventPayload::new(b"{\"n\": 2}")), None), "a reused id");
        assert!(held.holds(t, "8", None, digest("{\"n\": 3}")), "its dead letter");
        assert!(!held.holds(t, "8", None, digest("{\"n\": 4}")), "another row's letter");
        assert!(held.holds(t, "9", None, None), "a letter without the payload holds its id");
        assert!(!held.holds(t, "10", None, None));
    }

    #[test]
    fn a_pointer_holds_the_payload_its_object_digest_names() {
        use sha2::Digest;
        let payload = vec![b'x'; 3 << 20];
        let hex: String =
            sha2::Sha256::digest(&payload).iter().map(|b| format!("{b:02x}")).collect();
        let mut held = HeldRows::default();
        held.insert_message("t", "7", PayloadDigest::of_message(b"", Some(&hex)));
        assert!(held.holds("t", "7", Some(&EventPayload::new(&payload)), None));
        assert!(
            !held.holds("t", "7", Some(&EventPayload::new(b"")), None),
            "the pointer's own empty body"
        );
        assert_eq!(held.copies("t", "7", &EventPayload::new(&payload)), 1);
        for not_hex in ["", "xyz", &hex[1..], &format!("{}g", &hex[1..])] {
            let read = PayloadDigest::of_message(b"", Some(not_hex));
            assert_eq!(read, PayloadDigest::Body(payload_digest(b"")), "{not_hex:?}");
        }
    }

    #[test]
    fn a_second_message_of_a_row_is_a_copy_and_a_replay_is_not() {
        let (t, body) = ("public.outbox", b"{\"n\": 1}");
        let digest = |body: &[u8]| PayloadDigest::of_message(body, None);
        let mut held = HeldRows::default();
        held.insert_message(t, "7", digest(body));
        held.insert_replay(t, "replay:r1/1:7", digest(body));
        assert!(held.holds(t, "7", Some(&EventPayload::new(body)), None));
        assert_eq!(held.copies(t, "7", &EventPayload::new(body)), 1);
        held.insert_message(t, "7", digest(body));
        held.insert_message(t, "7", digest(b"{\"n\": 2}"));
        assert_eq!(held.copies(t, "7", &EventPayload::new(body)), 2, "another row's is no copy");
    }

    #[test]
    fn the_same_id_in_two_tables_is_two_rows() {
        let mut held = HeldRows::default();
        held.insert_message(
            "public.outbox",
            "public.outbox:7",
            PayloadDigest::of_message(b"{}", None),
        );
        held.insert_letter("billing.outbox", "billing.outbox:8", None);
        assert!(held.holds(
            "public.outbox",
            "public.outbox:7",
            Some(&EventPayload::new(b"{}")),
            None
        ));
        assert!(
            held.holds("public.outbox", "7", Some(&EventPayload::new(b"{}")), None),
            "plain or qualified"
        );
        assert!(!held.holds(
            "billing.outbox",
            "billing.outbox:7",
            Some(&EventPayload::new(b"{}")),
            None
        ));
        assert!(held.has_id("billing.outbox", "billing.outbox:8"));
        assert!(!held.has_id("public.outbox", "public.outbox:8"), "B's letter holds no row of A");
        assert_eq!(own_row_id("billing.outbox", "dead-letter:billing.outbox:8"), "8");
        assert_eq!(own_row_id("billing.outbox", "8"), "8");
        assert_eq!(held.len(), 2);
    }
}
