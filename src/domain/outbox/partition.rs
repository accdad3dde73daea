//! `{$partition}`: which of N partitions a row's aggregate belongs to, computed exactly as
//! nats-server's subject mapping `{{partition(N, token)}}` computes it.
//!
//! The server (`server/subject_transform.go`, `getHashPartition`; `server/accounts.go` before
//! 2.10) hashes the selected tokens' bytes, concatenated with no separator, with FNV-1a
//! 32-bit (Go's `hash/fnv.New32a`) and takes `Sum32() % N`; with one token, its bytes alone.
//! So a subject whose partition pgoutbox filled in is the subject a mapping over the
//! aggregate id's token would have made, and consumers partitioned by the server (consumer
//! groups, nats-server 2.11+) and consumers reading `orders.3.>` agree on who owns an
//! aggregate, with no mapping in front of the stream.

/// FNV-1a 32-bit's offset basis and prime, as in Go's `hash/fnv`.
const OFFSET_BASIS: u32 = 0x811c_9dc5;
const PRIME: u32 = 0x0100_0193;

/// The partition of `key` among `partitions`, in `0..partitions`: FNV-1a 32 of the bytes,
/// modulo the count. Zero partitions give 0, as nats-server guards its division since 2.10
/// (the settings refuse `--partitions 0` before this is reached).
pub fn partition(key: &[u8], partitions: u32) -> u32 {
    if partitions == 0 {
        return 0;
    }
    let hash =
        key.iter().fold(OFFSET_BASIS, |hash, &byte| (hash ^ u32::from(byte)).wrapping_mul(PRIME));
    hash % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a 32 itself: the reference vectors ("", "a", "foobar") of the FNV authors'
    /// test suite, which Go's `hash/fnv` passes, seen through a modulus that keeps them.
    #[test]
    fn the_hash_is_fnv_1a_32() {
        assert_eq!(partition(b"", u32::MAX), 0x811c_9dc5);
        assert_eq!(partition(b"a", u32::MAX), 0xe40c_292c);
        assert_eq!(partition(b"foobar", u32::MAX), 0xbf9c_f968);
    }

    /// Computed with Go's algorithm (`fnv.New32a`, `Write`, `Sum32() % n`) over the UTF-8
    /// bytes.
    #[test]
    fn known_partitions_of_ascii_uuid_and_non_ascii_keys() {
        for (key, of_7, of_4) in [
            ("", 2, 1),
            ("a", 5, 0),
            ("foobar", 0, 0),
            ("order-42", 4, 0),
            ("ÄÖü-ключ-日本", 6, 2),
            ("550e8400-e29b-41d4-a716-446655440000", 4, 0),
        ] {
            assert_eq!(partition(key.as_bytes(), 7), of_7, "{key:?} of 7");
            assert_eq!(partition(key.as_bytes(), 4), of_4, "{key:?} of 4");
        }
    }

    #[test]
    fn one_partition_holds_everything_and_zero_does_not_divide() {
        assert_eq!(partition(b"anything", 1), 0);
        assert_eq!(partition(b"anything", 0), 0);
    }
}
