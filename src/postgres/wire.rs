//! The CopyBoth envelope of a logical replication stream, without I/O.
//!
//! Inside `START_REPLICATION`, every CopyData frame carries one of two server messages:
//! XLogData (`w`), which wraps one pgoutput message, or a primary keepalive (`k`). The client
//! answers with standby status updates (`r`). See the PostgreSQL docs, "Streaming Replication
//! Protocol". Keeping this pure lets every edge case be tested on bytes.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Microseconds between the Unix epoch and the Postgres epoch (2000-01-01 UTC).
pub const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// A server message inside the replication CopyBoth stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationMessage {
    /// WAL data: `data` is one pgoutput message.
    XLogData { wal_start: u64, wal_end: u64, data: Bytes },
    /// The server's position, and whether it wants an answer right away.
    Keepalive { wal_end: u64, reply_requested: bool },
}

/// A CopyData payload that is not a well-formed replication message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("replication message `{tag}` is {len} bytes, shorter than its header")]
    Truncated { tag: char, len: usize },
    #[error("unknown replication message tag {0:#04x}")]
    UnknownTag(u8),
    #[error("empty CopyData frame in the replication stream")]
    Empty,
}

impl ReplicationMessage {
    /// Parses one CopyData payload. `payload` is consumed without copying the WAL data.
    pub fn parse(mut payload: Bytes) -> Result<ReplicationMessage, WireError> {
        if payload.is_empty() {
            return Err(WireError::Empty);
        }
        let tag = payload.get_u8();
        let need = match tag {
            b'w' => 24,
            b'k' => 17,
            other => return Err(WireError::UnknownTag(other)),
        };
        if payload.len() < need {
            return Err(WireError::Truncated { tag: tag as char, len: payload.len() + 1 });
        }
        match tag {
            b'w' => {
                let wal_start = payload.get_u64();
                let wal_end = payload.get_u64();
                let _send_time = payload.get_i64();
                Ok(ReplicationMessage::XLogData { wal_start, wal_end, data: payload })
            }
            _ => {
                let wal_end = payload.get_u64();
                let _send_time = payload.get_i64();
                let reply_requested = payload.get_u8() == 1;
                Ok(ReplicationMessage::Keepalive { wal_end, reply_requested })
            }
        }
    }
}

/// A standby status update: tells the server which WAL we have durably handled.
///
/// For a logical slot only `flush` matters: it becomes the slot's `confirmed_flush_lsn`, and
/// WAL before it may be recycled; flush and apply say the same. `write` is shown in
/// `pg_stat_replication` only (and used by no sync rep pgoutbox is part of): it says what
/// JetStream acknowledged, ahead of the slot by the durability horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyStatus {
    /// Received and made safe elsewhere (acknowledged by JetStream): the write position,
    /// which only `pg_stat_replication` shows. At or past `confirmed`.
    pub written: u64,
    /// The flush and apply positions: the slot's `confirmed_flush_lsn`.
    pub confirmed: u64,
    /// Microseconds since the Postgres epoch.
    pub now_micros: i64,
    pub reply_requested: bool,
}

/// At most this long between two standby status updates, however long the server waits.
const STATUS_KEEPALIVE: Duration = Duration::from_secs(10);

impl StandbyStatus {
    /// The CopyData payload (without the CopyData frame itself).
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(34);
        buf.put_u8(b'r');
        buf.put_u64(self.written.max(self.confirmed));
        buf.put_u64(self.confirmed);
        buf.put_u64(self.confirmed);
        buf.put_i64(self.now_micros);
        buf.put_u8(u8::from(self.reply_requested));
        buf.freeze()
    }
}

/// The longest a client may stay silent towards the walsender: half its
/// `wal_sender_timeout` (`None`: disabled), at most [`STATUS_KEEPALIVE`].
pub fn status_keepalive(wal_sender_timeout: Option<Duration>) -> Duration {
    match wal_sender_timeout {
        Some(timeout) => STATUS_KEEPALIVE.min(timeout / 2),
        None => STATUS_KEEPALIVE,
    }
}

/// A `SHOW wal_sender_timeout` answer that is not a duration.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("wal_sender_timeout {0:?} is not a duration")]
pub struct NotADuration(String);

/// The value of `SHOW wal_sender_timeout` (`60s`, `1min`, `500ms`, `0`; a bare number is
/// milliseconds); `None` when disabled.
pub fn parse_wal_sender_timeout(shown: &str) -> Result<Option<Duration>, NotADuration> {
    let shown = shown.trim();
    let split = shown.find(|c: char| !c.is_ascii_digit()).unwrap_or(shown.len());
    let (number, unit) = shown.split_at(split);
    let number: u64 = number.parse().map_err(|_| NotADuration(shown.to_owned()))?;
    let millis_per_unit = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(NotADuration(shown.to_owned())),
    };
    Ok((number > 0).then(|| Duration::from_millis(number.saturating_mul(millis_per_unit))))
}

/// Now, in microseconds since the Postgres epoch.
pub fn pg_now_micros() -> i64 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    unix - PG_EPOCH_OFFSET_MICROS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_xlogdata_without_copying_the_payload() {
        let mut frame = vec![b'w'];
        frame.extend_from_slice(&0x0100u64.to_be_bytes());
        frame.extend_from_slice(&0x0200u64.to_be_bytes());
        frame.extend_from_slice(&7i64.to_be_bytes());
        frame.extend_from_slice(b"B123");
        let msg = ReplicationMessage::parse(Bytes::from(frame)).unwrap();
        assert_eq!(
            msg,
            ReplicationMessage::XLogData {
                wal_start: 0x100,
                wal_end: 0x200,
                data: Bytes::from_static(b"B123")
            }
        );
    }

    #[test]
    fn parses_keepalive_and_its_reply_flag() {
        let mut frame = vec![b'k'];
        frame.extend_from_slice(&0xABCDu64.to_be_bytes());
        frame.extend_from_slice(&0i64.to_be_bytes());
        frame.push(1);
        let msg = ReplicationMessage::parse(Bytes::from(frame)).unwrap();
        assert_eq!(msg, ReplicationMessage::Keepalive { wal_end: 0xABCD, reply_requested: true });
    }

    #[test]
    fn rejects_truncated_unknown_and_empty_frames() {
        assert_eq!(ReplicationMessage::parse(Bytes::new()), Err(WireError::Empty));
        assert_eq!(
            ReplicationMessage::parse(Bytes::from_static(b"x")),
            Err(WireError::UnknownTag(b'x'))
        );
        for len in 1..25 {
            let frame = Bytes::from(vec![b'w'; len]);
            assert_eq!(
                ReplicationMessage::parse(frame),
                Err(WireError::Truncated { tag: 'w', len })
            );
        }
        let keepalive = Bytes::from(vec![b'k'; 17]);
        assert_eq!(
            ReplicationMessage::parse(keepalive),
            Err(WireError::Truncated { tag: 'k', len: 17 })
        );
    }

    #[test]
    fn standby_status_reports_the_acknowledged_position_then_the_confirmed_one_twice() {
        let status = StandbyStatus {
            written: 0x3344,
            confirmed: 0x1122,
            now_micros: 5,
            reply_requested: false,
        };
        let bytes = status.encode();
        assert_eq!(bytes.len(), 34);
        assert_eq!(bytes[0], b'r');
        assert_eq!(&bytes[1..9], &0x3344u64.to_be_bytes());
        assert_eq!(&bytes[9..17], &0x1122u64.to_be_bytes());
        assert_eq!(&bytes[17..25], &0x1122u64.to_be_bytes());
        assert_eq!(&bytes[25..33], &5i64.to_be_bytes());
        assert_eq!(bytes[33], 0);
        // Never a write position behind the flush position.
        let behind = StandbyStatus { written: 1, ..status }.encode();
        assert_eq!(&behind[1..9], &0x1122u64.to_be_bytes());
    }

    #[test]
    fn wal_sender_timeout_is_read_as_show_prints_it() {
        let ms = |n| Ok(Some(Duration::from_millis(n)));
        assert_eq!(parse_wal_sender_timeout("60s"), ms(60_000));
        assert_eq!(parse_wal_sender_timeout("1min"), ms(60_000));
        assert_eq!(parse_wal_sender_timeout("500ms"), ms(500));
        assert_eq!(parse_wal_sender_timeout("2h"), ms(7_200_000));
        assert_eq!(parse_wal_sender_timeout("1500"), ms(1_500));
        assert_eq!(parse_wal_sender_timeout("0"), Ok(None));
        assert!(parse_wal_sender_timeout("soon").is_err());
        assert!(parse_wal_sender_timeout("5 fortnights").is_err());
    }

    #[test]
    fn statuses_go_out_within_half_the_wal_sender_timeout() {
        let secs = Duration::from_secs;
        assert_eq!(status_keepalive(Some(secs(60))), STATUS_KEEPALIVE);
        assert_eq!(status_keepalive(Some(secs(10))), secs(5));
        assert_eq!(status_keepalive(Some(secs(1))), Duration::from_millis(500));
        assert_eq!(status_keepalive(None), STATUS_KEEPALIVE, "0 disables the timeout");
    }
}
