//! The slot as `pg_replication_slots` and `pg_stat_replication` describe it: what `status`,
//! `setup` and each attempt read about it.

use tokio_postgres::Client;

use super::SetupError;

/// `pg_replication_slots.wal_status`: whether the WAL the slot needs is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalStatus {
    Reserved,
    Extended,
    Unreserved,
    /// The WAL the slot needs was removed (`max_slot_wal_keep_size`): the slot is unusable.
    Lost,
}

impl WalStatus {
    pub fn parse(text: &str) -> Option<WalStatus> {
        match text {
            "reserved" => Some(Self::Reserved),
            "extended" => Some(Self::Extended),
            "unreserved" => Some(Self::Unreserved),
            "lost" => Some(Self::Lost),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Extended => "extended",
            Self::Unreserved => "unreserved",
            Self::Lost => "lost",
        }
    }
}

/// What Postgres says about the slot.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotState {
    pub plugin: Option<String>,
    pub active: bool,
    pub active_pid: Option<i32>,
    pub confirmed_flush_lsn: Option<String>,
    pub restart_lsn: Option<String>,
    pub wal_status: Option<WalStatus>,
    pub safe_wal_size: Option<i64>,
    pub current_wal_lsn: String,
    pub lag_bytes: Option<i64>,
    pub retained_wal_bytes: Option<i64>,
    /// How far the streamer's confirmations trail the server in time (pg_stat_replication's
    /// flush_lag), while it is connected and the server has measured it.
    pub lag_seconds: Option<f64>,
    /// The streamer's `application_name` and client address, while it is connected.
    pub holder_application_name: Option<String>,
    pub holder_client_addr: Option<String>,
    /// PostgreSQL 17+: a failover slot, and (on a standby) a synchronised copy of one;
    /// `None` before 17.
    pub failover: Option<bool>,
    pub synced: Option<bool>,
    /// PostgreSQL 17+: why Postgres invalidated the slot (`wal_removed`, `rows_removed`,
    /// `wal_level_insufficient`, 18's `idle_timeout`); `None` while it is valid and before 17.
    pub invalidation_reason: Option<String>,
    /// Whether the slot was made for the database we are connected to (slots are
    /// cluster-wide, so two databases left on the default `--slot` meet here).
    pub in_this_database: bool,
}

pub async fn slot_state(client: &Client, slot: &str) -> Result<Option<SlotState>, SetupError> {
    let row = client
        .query_opt(
            "SELECT plugin::pg_catalog.text, active, active_pid, \
                    confirmed_flush_lsn::pg_catalog.text, restart_lsn::pg_catalog.text, \
                    wal_status, safe_wal_size, w.lsn::pg_catalog.text, \
                    pg_catalog.pg_wal_lsn_diff(w.lsn, confirmed_flush_lsn)::pg_catalog.int8, \
                    pg_catalog.pg_wal_lsn_diff(w.lsn, restart_lsn)::pg_catalog.int8, \
                    extract(epoch FROM r.flush_lag)::pg_catalog.float8, r.application_name, \
                    r.client_addr::pg_catalog.text, s.database = pg_catalog.current_database(), \
                    (pg_catalog.to_jsonb(s) ->> 'failover')::pg_catalog.bool, \
                    (pg_catalog.to_jsonb(s) ->> 'synced')::pg_catalog.bool, \
                    pg_catalog.to_jsonb(s) ->> 'invalidation_reason' \
             FROM pg_catalog.pg_replication_slots s \
             LEFT JOIN pg_catalog.pg_stat_replication r ON r.pid = s.active_pid \
             CROSS JOIN (SELECT CASE WHEN pg_catalog.pg_is_in_recovery() \
                                     THEN pg_catalog.pg_last_wal_replay_lsn() \
                                     ELSE pg_catalog.pg_current_wal_lsn() END AS lsn) w \
             WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|r| SlotState {
        plugin: r.get(0),
        active: r.get(1),
        active_pid: r.get(2),
        confirmed_flush_lsn: r.get(3),
        restart_lsn: r.get(4),
        wal_status: r.get::<_, Option<&str>>(5).and_then(WalStatus::parse),
        safe_wal_size: r.get(6),
        current_wal_lsn: r.get(7),
        lag_bytes: r.get(8),
        retained_wal_bytes: r.get(9),
        lag_seconds: r.get(10),
        holder_application_name: r.get(11),
        holder_client_addr: r.get(12),
        in_this_database: r.get::<_, Option<bool>>(13).unwrap_or(false),
        failover: r.get(14),
        synced: r.get(15),
        invalidation_reason: r.get(16),
    }))
}
