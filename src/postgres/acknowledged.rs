//! What JetStream acknowledged, recorded in Postgres: a process that starts after a restart
//! of both pgoutbox and nats-server (a power loss of the host they share) has no memory of
//! the acknowledgements, and only a record kept where the loss did not reach tells it the
//! stream came back shorter (issue 46). One row per slot in `acknowledged`, in pgoutbox's
//! own schema (`postgres::own_schema`; beside the replay table before it): the stream (and
//! when it was created: a stream deleted and made again is another one), its last sequence
//! acknowledged and that message's position.
//! Written at most once a second, and only when a message was acknowledged since (an idle
//! outbox writes nothing), so it trails the acknowledgements by up to a second: a loss of
//! the newest second alone is not seen after a cold restart. It also holds the position up
//! to which everything decoded was acknowledged then (`acknowledged_lsn`), ahead of the
//! slot by the durability horizon: `pgoutbox replay` waits for that, or for the write
//! position the running pgoutbox reports (`pg_stat_replication.write_lsn`), not for the slot.
//!
//! pgoutbox writes only a table its own role owns: a trigger on it would run as pgoutbox.

use std::time::Duration;

use postgres_protocol::escape::{escape_identifier as quote_ident, escape_literal};
use tokio_postgres::Client;
use tokio_postgres::types::PgLsn;

use super::admin::TableName;
use crate::domain::horizon::Stored;
use crate::domain::progress::Position;

/// How often the record is brought up to date, at most.
pub const EVERY: Duration = Duration::from_secs(1);

/// The record in pgoutbox's own schema (`postgres::own_schema`).
pub fn table_in(own_schema: &str) -> TableName {
    TableName { schema: own_schema.to_owned(), name: "acknowledged".to_owned() }
}

/// Where versions before the own schema kept it: beside the replay table.
pub fn earlier_table(replay_table: &TableName) -> TableName {
    TableName { schema: replay_table.schema.clone(), name: "pgoutbox_acknowledged".to_owned() }
}

/// An upgrade: the record an earlier version kept at `earlier` moves into `table`'s schema
/// under its name, when pgoutbox's role owns it and `table` is missing (each judged from
/// the catalog first). One another role made there is never touched. Whether it moved.
pub async fn move_earlier(
    client: &Client,
    earlier: &TableName,
    table: &TableName,
) -> Result<bool, tokio_postgres::Error> {
    if owner(client, table).await? != Owner::Missing || owner(client, earlier).await? != Owner::Ours
    {
        return Ok(false);
    }
    let moved = TableName { schema: table.schema.clone(), name: earlier.name.clone() };
    client
        .batch_execute(&format!(
            // One query string: one implicit transaction, both or neither.
            "ALTER TABLE {} SET SCHEMA {}; ALTER TABLE {} RENAME TO {}",
            earlier.quoted(),
            quote_ident(&table.schema),
            moved.quoted(),
            quote_ident(&table.name)
        ))
        .await?;
    Ok(true)
}

/// Why `setup` cannot keep the record.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A table of the record's name that a role which could not be pgoutbox's made (neither
    /// a superuser nor one with REPLICATION): its indexes, triggers and rules would run as
    /// whoever writes or plans it, so it is never altered, read or written.
    #[error(
        "{table} exists, owned by role {owner:?}, which is not pgoutbox's: pgoutbox never \
         writes, reads or alters a table another role made under its name (its code would \
         run as pgoutbox); drop it, then run setup again"
    )]
    Foreign { table: TableName, owner: String },
    #[error(transparent)]
    Sql(#[from] tokio_postgres::Error),
}

/// Makes the table when it is missing (`setup`). Its owner is read from the catalog before
/// any statement names it: one made for pgoutbox's role (`sql/grants.sql`, by a role with
/// REPLICATION or a superuser) is left as it is, for that role to bring up to date; one of
/// any other role stops setup ([`RecordError::Foreign`]).
pub async fn ensure(client: &Client, table: &TableName) -> Result<(), RecordError> {
    match owner(client, table).await? {
        // No IF NOT EXISTS: a table made meanwhile by another role fails this, not joins it.
        Owner::Missing => Ok(client
            .batch_execute(&format!(
                "CREATE TABLE {} (slot pg_catalog.text PRIMARY KEY, \
                 stream pg_catalog.text NOT NULL, stream_created pg_catalog.text NOT NULL, \
                 stream_sequence pg_catalog.int8 NOT NULL, commit_lsn pg_catalog.pg_lsn NOT \
                 NULL, index pg_catalog.int8 NOT NULL, \
                 at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(), \
                 acknowledged_lsn pg_catalog.pg_lsn, stream_replaced pg_catalog.text)",
                table.quoted()
            ))
            .await?),
        Owner::Ours => Ok(add_acknowledged_lsn(client, table).await?),
        Owner::Theirs { replicator: true, .. } => Ok(()),
        Owner::Theirs { owner, .. } => Err(RecordError::Foreign { table: table.clone(), owner }),
    }
}

/// The columns an earlier version's table may lack, with their types.
const ADDED_COLUMNS: [(&str, &str); 2] =
    [("acknowledged_lsn", "pg_catalog.pg_lsn"), ("stream_replaced", "pg_catalog.text")];

/// Adds the columns a table made by an earlier version lacks; only pgoutbox's own table is
/// altered ([`owner`] first). The catalog says which are missing: `ADD COLUMN IF NOT EXISTS`
/// said a NOTICE at every start for each column already there.
pub async fn add_acknowledged_lsn(
    client: &Client,
    table: &TableName,
) -> Result<(), tokio_postgres::Error> {
    let mut missing = Vec::new();
    for (column, kind) in ADDED_COLUMNS {
        let present: bool = client
            .query_one(
                &format!(
                    "SELECT EXISTS (SELECT FROM pg_catalog.pg_attribute \
                     WHERE attrelid = {} AND attname = $1 AND NOT attisdropped)",
                    oid_of(table)
                ),
                &[&column],
            )
            .await?
            .try_get(0)?;
        if !present {
            missing.push(format!("ADD COLUMN {column} {kind}"));
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let sql = format!("ALTER TABLE {} {}", table.quoted(), missing.join(", "));
    client.batch_execute(&sql).await
}

/// The stream a record is about: its name and its creation time as JetStream reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamIdentity {
    pub name: String,
    pub created: String,
}

/// Who may write `table`: pgoutbox's role when it owns it ([`Owner::Ours`]), else the role
/// that does (and whether it may replicate or is a superuser: a role pgoutbox could run
/// as), or nobody when it is missing. Read from the catalog alone, in a statement of its
/// own: planning a statement that names the table would already run its expressions.
#[derive(Debug, PartialEq, Eq)]
pub enum Owner {
    Ours,
    Theirs { owner: String, login: String, replicator: bool },
    Missing,
}

/// Whether pgoutbox may write `table`: it exists and pgoutbox's role owns it.
pub async fn owner(client: &Client, table: &TableName) -> Result<Owner, tokio_postgres::Error> {
    let row = client
        .query_opt(
            &format!(
                "SELECT o.rolname::pg_catalog.text, current_user::pg_catalog.text, \
                        o.rolreplication OR o.rolsuper \
                 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_roles o ON o.oid = c.relowner \
                 WHERE c.oid = {}",
                oid_of(table)
            ),
            &[],
        )
        .await?;
    let Some(row) = row else { return Ok(Owner::Missing) };
    let (owner, login): (String, String) = (row.try_get(0)?, row.try_get(1)?);
    let replicator = row.try_get(2)?;
    Ok(if owner == login { Owner::Ours } else { Owner::Theirs { owner, login, replicator } })
}

/// What JetStream acknowledged: the last message stored, and the position up to which
/// everything decoded was acknowledged (keepalives included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acknowledged {
    pub stored: Stored,
    pub up_to: u64,
}

/// Records `acknowledged` for `slot` in `stream`.
pub async fn record(
    client: &Client,
    table: &TableName,
    slot: &str,
    stream: &StreamIdentity,
    acknowledged: Acknowledged,
) -> Result<(), tokio_postgres::Error> {
    // Within one stream's life the last message recorded never goes back: a stream that
    // lost acknowledged events and took new ones numbers them again from its shorter tail,
    // and the record keeps the loss visible to `run --recover` until the stream is longer.
    let newer = "(a.stream IS DISTINCT FROM excluded.stream OR a.stream_created IS DISTINCT \
                 FROM excluded.stream_created OR a.stream_sequence <= excluded.stream_sequence)";
    let sql = format!(
        "INSERT INTO {} AS a (slot, stream, stream_created, stream_sequence, commit_lsn, index, \
         acknowledged_lsn) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (slot) DO UPDATE \
         SET stream = excluded.stream, stream_created = excluded.stream_created, \
         stream_sequence = CASE WHEN {newer} THEN excluded.stream_sequence \
                                ELSE a.stream_sequence END, \
         commit_lsn = CASE WHEN {newer} THEN excluded.commit_lsn ELSE a.commit_lsn END, \
         index = CASE WHEN {newer} THEN excluded.index ELSE a.index END, \
         stream_replaced = CASE WHEN a.stream = excluded.stream AND a.stream_created \
                                IS DISTINCT FROM excluded.stream_created \
                                THEN a.stream_created ELSE a.stream_replaced END, \
         acknowledged_lsn = excluded.acknowledged_lsn, at = pg_catalog.now()",
        table.quoted()
    );
    let Acknowledged { stored, up_to } = acknowledged;
    let sequence = i64::try_from(stored.sequence).unwrap_or(i64::MAX);
    let lsn = PgLsn::from(stored.position.commit_lsn);
    let index = i64::from(stored.position.index);
    let up_to = PgLsn::from(up_to);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
        [&slot, &stream.name, &stream.created, &sequence, &lsn, &index, &up_to];
    client.execute(&sql, &params).await.map(drop)
}

/// The position up to which pgoutbox recorded everything decoded from `slot` as
/// acknowledged; none without the table, the column, or a record. Read only from a table
/// whose owner may replicate (as pgoutbox's role must): a role that may only log in cannot
/// make a record up that ends a replay's wait early.
pub async fn acknowledged_up_to(
    client: &Client,
    table: &TableName,
    slot: &str,
) -> Result<Option<u64>, tokio_postgres::Error> {
    let readable: bool = client
        .query_one(
            &format!(
                "SELECT coalesce((SELECT pg_catalog.has_table_privilege(c.oid, 'SELECT') \
                 AND (o.rolreplication OR o.rolsuper) FROM pg_catalog.pg_class c \
                 JOIN pg_catalog.pg_roles o ON o.oid = c.relowner \
                 JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid \
                 AND a.attname = 'acknowledged_lsn' AND NOT a.attisdropped \
                 WHERE c.oid = {}), false)",
                oid_of(table)
            ),
            &[],
        )
        .await?
        .try_get(0)?;
    if !readable {
        return Ok(None);
    }
    let sql = format!("SELECT acknowledged_lsn FROM {} WHERE slot = $1", table.quoted());
    let row = client.query_opt(&sql, &[&slot]).await?;
    Ok(row.and_then(|row| row.get::<_, Option<PgLsn>>(0)).map(u64::from))
}

/// `slot`'s record in `stream`, read on an ordinary connection (see [`parse_recorded`]);
/// none without the table.
pub async fn recorded(
    client: &Client,
    table: &TableName,
    slot: &str,
    stream: &StreamIdentity,
) -> Result<Option<Stored>, tokio_postgres::Error> {
    let exists: bool = client.query_one(&exists_sql(table), &[]).await?.try_get(0)?;
    if !exists {
        return Ok(None);
    }
    let rows = client.query(&read_sql(table, slot), &[]).await?;
    let rows: Vec<Vec<Option<String>>> =
        rows.iter().map(|row| (0..5).map(|i| row.get::<_, Option<String>>(i)).collect()).collect();
    Ok(parse_recorded(&rows, stream))
}

/// The stream under a name was made again: `before` is the creation time (unix ns) of the
/// one pgoutbox recorded; `recorded`, whether the new one's acknowledgements were recorded
/// since (the old one is then remembered in `stream_replaced`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeAgain {
    pub before: String,
    pub recorded: bool,
}

impl std::fmt::Display for MadeAgain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = if self.recorded { "replaced" } else { "replaces" };
        write!(f, "it {verb} one created at {} (unix ns)", self.before)
    }
}

/// What the record says of a stream named `name` other than the one of that name now:
/// the creation time and last sequence of the one it recorded, when that one was deleted
/// and the stream created again since (it is no longer there to say so), or the one
/// before, once the new one's acknowledgements were recorded.
pub async fn made_again(
    client: &Client,
    table: &TableName,
    slot: &str,
    now: &StreamIdentity,
) -> Result<Option<MadeAgain>, tokio_postgres::Error> {
    // The owner first, in a statement of its own: planning the read below would already run
    // the index and statistics expressions of a table another role made under this name.
    if owner(client, table).await? != Owner::Ours {
        return Ok(None);
    }
    // Through to_jsonb: a table made by an earlier version has no `stream_replaced` yet.
    let sql = format!(
        "SELECT a.stream, a.stream_created, pg_catalog.to_jsonb(a) ->> 'stream_replaced' \
         FROM {quoted} a WHERE a.slot = $1",
        quoted = table.quoted()
    );
    let Some(row) = client.query_opt(&sql, &[&slot]).await? else {
        return Ok(None);
    };
    let (name, created): (Option<String>, Option<String>) = (row.try_get(0)?, row.try_get(1)?);
    let replaced: Option<String> = row.try_get(2)?;
    Ok(match (name, created) {
        (Some(name), Some(created)) if name == now.name && created != now.created => {
            Some(MadeAgain { before: created, recorded: false })
        }
        _ => replaced.map(|before| MadeAgain { before, recorded: true }),
    })
}

/// Drops `slot`'s record (`teardown`).
pub async fn forget(
    client: &Client,
    table: &TableName,
    slot: &str,
) -> Result<(), tokio_postgres::Error> {
    let sql = format!("DELETE FROM {} WHERE slot = $1", table.quoted());
    client.execute(&sql, &[&slot]).await.map(drop)
}

/// The query asking whether the table exists and pgoutbox's role owns it (`t`); then
/// [`read_sql`], only when it does: a separate statement, since planning a read of a table
/// another role made under this name would run its index and statistics expressions. Both
/// run on the replication connection, which answers simple queries only.
pub fn exists_sql(table: &TableName) -> String {
    format!(
        "SELECT coalesce((SELECT o.rolname = current_user FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_roles o ON o.oid = c.relowner \
         WHERE c.oid = {}), false)",
        oid_of(table)
    )
}

/// `table`'s OID, or NULL when it is missing or this role may not use its schema: looked up
/// by name in the catalog (`to_regclass` raises "permission denied for schema" instead, and a
/// replay by a role without USAGE on pgoutbox's schema then failed).
fn oid_of(table: &TableName) -> String {
    format!(
        "(SELECT c.oid FROM pg_catalog.pg_class c \
          JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = {} AND c.relname = {} \
            AND pg_catalog.has_schema_privilege(n.oid, 'USAGE'))",
        escape_literal(&table.schema),
        escape_literal(&table.name)
    )
}

/// The query reading `slot`'s record, as one text row (`parse_recorded` reads it); sent
/// only once [`exists_sql`] found the table pgoutbox's own (a record another role made up
/// could make `--recover` drop the slot).
pub fn read_sql(table: &TableName, slot: &str) -> String {
    format!(
        "SELECT stream, stream_created, stream_sequence::pg_catalog.text, \
                commit_lsn::pg_catalog.text, index::pg_catalog.text \
         FROM {} WHERE slot = {}",
        table.quoted(),
        escape_literal(slot),
    )
}

/// The last message recorded as acknowledged in `stream`, from [`read_sql`]'s rows; none
/// when the record is of another stream, or of one of that name made again since.
pub fn parse_recorded(rows: &[Vec<Option<String>>], stream: &StreamIdentity) -> Option<Stored> {
    let row = rows.first()?;
    let text = |i: usize| row.get(i).cloned().flatten();
    let recorded = StreamIdentity { name: text(0)?, created: text(1)? };
    if recorded != *stream {
        return None;
    }
    let sequence = text(2)?.parse().ok()?;
    let commit_lsn = u64::from(text(3)?.parse::<PgLsn>().ok()?);
    let index = text(4)?.parse().ok()?;
    Some(Stored { sequence, position: Position { commit_lsn, index } })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(values: [&str; 5]) -> Vec<Vec<Option<String>>> {
        vec![values.iter().map(|v| Some((*v).to_owned())).collect()]
    }

    #[test]
    fn a_record_counts_only_for_the_stream_it_names() {
        let stream = StreamIdentity { name: "OUTBOX".into(), created: "17".into() };
        let rows = row(["OUTBOX", "17", "1000", "0/16B3748", "3"]);
        let stored =
            Stored { sequence: 1_000, position: Position { commit_lsn: 0x16B_3748, index: 3 } };
        assert_eq!(parse_recorded(&rows, &stream), Some(stored));
        let remade = StreamIdentity { created: "18".into(), ..stream.clone() };
        assert_eq!(parse_recorded(&rows, &remade), None, "a stream made again is another");
        assert_eq!(parse_recorded(&row(["OUTBOX", "17", "x", "0/1", "0"]), &stream), None);
        assert_eq!(parse_recorded(&[], &stream), None);
    }
}
