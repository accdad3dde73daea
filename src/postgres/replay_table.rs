//! The replay table (`PipelineConfig::replay_table`) on an ordinary connection: created and
//! published by `setup` and `run`, checked by `pgoutbox replay` before it hands anything
//! over; and whether PUBLIC may hand pgoutbox emitted events.

use postgres_protocol::escape::escape_identifier as quote_ident;
use tokio_postgres::{Client, GenericClient};

use super::admin::TableName;
use super::outbox_table::REPLAY_TABLE_COLUMNS;

/// Why replays cannot go through the replay table.
#[derive(Debug, thiserror::Error)]
pub enum ReplayTableError {
    #[error(
        "the replay table {table} could not be {doing} ({reason}): replays into the live \
         stream are off until `pgoutbox setup` runs as a role that owns the publication and \
         may create tables in schema {schema}"
    )]
    NotSetUp { table: String, doing: &'static str, reason: String, schema: String },
    #[error(
        "the replay table {table} exists, owned by role {owner}, not by {role} which runs \
         setup: it was not made by pgoutbox, whoever owns it could hand pgoutbox any event, \
         and its triggers would run as pgoutbox, so it is not used (replays into the live \
         stream and adoptions are off); drop it and run setup again"
    )]
    ForeignOwner { table: String, owner: String, role: String },
    #[error(
        "the replay table {table} does not exist or is not in publication {publication}: \
         run `pgoutbox setup` (this version) first"
    )]
    Missing { table: String, publication: String },
    #[error(
        "role {role} may not replay: run `GRANT INSERT, SELECT, DELETE ON {table} TO {role}` \
         as the table's owner (see docs/runbooks/replay.md)"
    )]
    NotGranted { role: String, table: String },
    #[error(transparent)]
    Sql(#[from] tokio_postgres::Error),
}

/// Creates the replay table `replay` (`PipelineConfig::replay_table`) when missing and adds
/// it to the publication (an insert-only one: the handover's cleanup deletes are not
/// published). `Ok(true)` when anything was changed.
pub async fn ensure(
    client: &Client,
    publication: &str,
    replay: &TableName,
) -> Result<bool, ReplayTableError> {
    let failed = |doing, err: tokio_postgres::Error| ReplayTableError::NotSetUp {
        table: replay.to_string(),
        doing,
        reason: crate::postgres::admin::server_said(&err),
        schema: replay.schema.clone(),
    };
    let (exists, published) = state(client, publication, replay).await?;
    if !exists {
        // Its deletes need no key in a publication that publishes deletes too. Frames of
        // up to 7,500 bytes stay in the row, uncompressed (the default is 2 kB).
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {0} ({REPLAY_TABLE_COLUMNS}) WITH (toast_tuple_target = 8160); \
             ALTER TABLE {0} REPLICA IDENTITY FULL",
            replay.quoted()
        );
        client.batch_execute(&sql).await.map_err(|err| failed("created", err))?;
    }
    if exists {
        // Publishing it makes its owner a source of events, and writing to it runs its
        // owner's triggers: only a table of this role's, or a superuser's (an
        // administrator's setup, for a pgoutbox granted its rows).
        let row = client
            .query_one(
                "SELECT r.rolname::pg_catalog.text, current_user::pg_catalog.text, r.rolsuper \
                 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_roles r ON r.oid = c.relowner \
                 WHERE c.oid = $1::pg_catalog.text::pg_catalog.regclass",
                &[&replay.quoted()],
            )
            .await?;
        let (owner, role, superuser): (String, String, bool) = (row.get(0), row.get(1), row.get(2));
        if owner != role && !superuser {
            return Err(ReplayTableError::ForeignOwner { table: replay.to_string(), owner, role });
        }
    }
    if !published {
        let sql =
            format!("ALTER PUBLICATION {} ADD TABLE {}", quote_ident(publication), replay.quoted());
        match client.batch_execute(&sql).await {
            Ok(()) => {}
            // Two instances racing: the other one added it.
            Err(err) if state(client, publication, replay).await?.1 => drop(err),
            Err(err) => return Err(failed("added to the publication", err)),
        }
    }
    Ok(!(exists && published))
}

/// Bytes of rows per frame, at most (a larger row has a frame of its own): each row of the
/// replay table costs an insert, a delete and their decoding once for all the rows of its
/// frame. Within the replay table's `toast_tuple_target` (8,160), below which a row stays
/// in its page uncompressed: 1,900 bytes (PostgreSQL's default target) replayed 63,000-
/// 82,000 rows/s, 7,500 bytes 84,000-85,000 (docs/performance.md).
pub const FRAME_BYTES: usize = 7_500;

/// Inserts `frames` (each with its row's index) into the replay table `table`, for the
/// pgoutbox of `slot`, as `(slot, replay id, total)` says, and deletes them again in the
/// caller's transaction: the inserts are in the WAL, and the insert-only publication does
/// not publish the deletes.
///
/// The delete names the rows the insert made by their `ctid`s (a TID scan), not by a
/// condition: a condition scans the whole table, whose dead rows pile up between two
/// vacuums, so each transaction of a replay took longer than the one before.
pub async fn hand_over<C: GenericClient>(
    client: &C,
    table: &TableName,
    (slot, replay_id, total): (&str, &str, u64),
    frames: &[(i64, Vec<u8>)],
) -> Result<(), tokio_postgres::Error> {
    let (indexes, frames): (Vec<i64>, Vec<&[u8]>) =
        frames.iter().map(|(index, frame)| (*index, frame.as_slice())).unzip();
    let table = table.quoted();
    // Two arrays side by side: `ROWS FROM`, since `unnest(a, b)` is grammar only unqualified.
    let insert = format!(
        "INSERT INTO {table} (slot, replay_id, row_index, total, frame) \
         SELECT $1, $2, i, $3, f \
         FROM ROWS FROM (pg_catalog.unnest($4::pg_catalog.int8[]), \
                         pg_catalog.unnest($5::pg_catalog.bytea[])) AS u (i, f) \
         RETURNING ctid::pg_catalog.text"
    );
    let total = total as i64;
    let rows = client.query(&insert, &[&slot, &replay_id, &total, &indexes, &frames]).await?;
    let ctids = rows.iter().map(|row| row.try_get(0)).collect::<Result<Vec<&str>, _>>()?;
    let delete =
        format!("DELETE FROM {table} WHERE ctid = ANY($1::pg_catalog.text[]::pg_catalog.tid[])");
    client.execute(&delete, &[&ctids]).await?;
    Ok(())
}

/// Whether the replay table exists, and whether the publication holds it.
async fn state(
    client: &Client,
    publication: &str,
    replay: &TableName,
) -> Result<(bool, bool), tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT pg_catalog.to_regclass($1) IS NOT NULL, \
                    EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables \
                            WHERE pubname = $2 AND schemaname = $3 AND tablename = $4)",
            &[&replay.quoted(), &publication, &replay.schema, &replay.name],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Before a replay hands anything over: the replay table is set up and this role was
/// granted what the handover does there.
pub async fn check_may_replay(
    client: &Client,
    publication: &str,
    replay: &TableName,
) -> Result<(), ReplayTableError> {
    if state(client, publication, replay).await? != (true, true) {
        return Err(ReplayTableError::Missing {
            table: replay.to_string(),
            publication: publication.to_owned(),
        });
    }
    let row = client
        .query_one(
            "SELECT current_user::pg_catalog.text, \
                    pg_catalog.has_table_privilege($1, 'INSERT') \
                AND pg_catalog.has_table_privilege($1, 'SELECT') \
                AND pg_catalog.has_table_privilege($1, 'DELETE')",
            &[&replay.quoted()],
        )
        .await?;
    if row.get(1) {
        return Ok(());
    }
    Err(ReplayTableError::NotGranted { role: row.get(0), table: replay.to_string() })
}

/// When PUBLIC may execute `pg_logical_emit_message` (some overload), and so any login
/// can hand pgoutbox an emitted event when `--message-prefix` is set: the statement that
/// revokes it, naming the overloads this server has (three arguments before PostgreSQL 17,
/// four, with `flush`, from 17 on).
pub async fn public_may_emit(client: &Client) -> Result<Option<String>, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT pg_catalog.string_agg( \
                      DISTINCT p.oid::pg_catalog.regprocedure::pg_catalog.text, ', ') \
             FROM pg_catalog.pg_proc p, pg_catalog.aclexplode( \
                    coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a \
             WHERE p.proname = 'pg_logical_emit_message' AND a.grantee = 0 \
               AND a.privilege_type = 'EXECUTE'",
            &[],
        )
        .await?;
    let overloads: Option<String> = row.get(0);
    Ok(overloads.map(|list| format!("REVOKE EXECUTE ON FUNCTION {list} FROM PUBLIC")))
}

/// The warning when [`public_may_emit`] gives `revoke`.
pub fn public_may_emit_warning(revoke: &str) -> String {
    format!(
        "any role may hand pgoutbox an event: PUBLIC may execute pg_logical_emit_message and \
         --message-prefix is set; run `{revoke}`, then GRANT EXECUTE on it to the application's \
         role and to every other role that emits messages (other tools' own prefixes keep \
         working) (docs/runbooks/emitted-events.md)"
    )
}
