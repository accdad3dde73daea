//! SQL over a normal connection: prerequisites, the publication, the slot, status, teardown.

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

use postgres_protocol::escape::escape_identifier as quote_ident;

use crate::postgres::tls::PgTls;
use crate::postgres::walsender::user_name;

pub use crate::domain::outbox::TableName;
pub use slot::{SlotState, WalStatus, slot_state};

mod slot;

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("could not connect to Postgres: {0}")]
    Connect(String),
    #[error(
        "wal_level is {0:?}; pgoutbox needs logical decoding: run `ALTER SYSTEM SET wal_level = logical` and restart Postgres"
    )]
    WalLevel(String),
    #[error(
        "table {0} does not exist: create it (see sql/outbox.sql), point --table at yours, or \
         pass --messages-only to stream only pg_logical_emit_message events"
    )]
    TableMissing(String),
    #[error(
        "table {table} has no column {column:?} (the {role}); set the column roles (see --help) to match the table"
    )]
    ColumnMissing { table: String, column: String, role: String },
    #[error(
        "role {0:?} lacks the REPLICATION attribute: run `ALTER ROLE {0} REPLICATION` as a superuser"
    )]
    NoReplication(String),
    #[error(
        "publication {publication} exists but does not publish inserts of {table}; add it with `ALTER PUBLICATION {publication} ADD TABLE {table}`"
    )]
    PublicationMismatch { publication: String, table: String },
    #[error(
        "table {table} is partitioned but publication {publication} publishes its partitions \
         under their own names, so pgoutbox would miss their rows; run `ALTER PUBLICATION \
         {publication} SET (publish_via_partition_root = true)`"
    )]
    PartitionsNotViaRoot { publication: String, table: String },
    #[error(
        "table {table} has inheritance children ({children}); their rows are published under \
         their own names and pgoutbox would miss them: use declarative partitioning \
         (PARTITION BY) for a partitioned outbox"
    )]
    InheritanceChildren { table: String, children: String },
    #[error(
        "table {table} has no created-at column and track_commit_timestamp is off, so its rows \
         have no order to be published in: set --created-at-column, or turn \
         track_commit_timestamp on (a restart of Postgres) for commit order"
    )]
    SeedOrder { table: String },
    #[error(transparent)]
    Untrusted(#[from] crate::postgres::trust::Untrusted),
    #[error(transparent)]
    Sql(#[from] tokio_postgres::Error),
}

impl From<crate::postgres::trust::TrustError> for SetupError {
    fn from(err: crate::postgres::trust::TrustError) -> Self {
        match err {
            crate::postgres::trust::TrustError::Untrusted(untrusted) => untrusted.into(),
            crate::postgres::trust::TrustError::Sql(sql) => sql.into(),
        }
    }
}

/// Opens a normal SQL session, over TLS as `tls` says, with the password command's
/// password when there is one; its connection task runs in the background.
pub async fn connect(config: &tokio_postgres::Config, tls: &PgTls) -> Result<Client, SetupError> {
    let config = tls.login(config).await.map_err(|err| SetupError::Connect(err.to_string()))?;
    open(&config, tls.client_config())
        .await
        .map_err(|err| SetupError::Connect(describe_connect_error(&err, &user_name(&config))))
}

/// [`connect`] with the TLS configuration built, keeping tokio-postgres's error, which
/// tells a server's refusal from a network failure (see `liveness`). The session's names
/// resolve in `pg_catalog` only (`pinned_names`).
pub(crate) async fn open(
    config: &tokio_postgres::Config,
    rustls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> Result<Client, tokio_postgres::Error> {
    let config = crate::postgres::pinned_names::pinned(config);
    let client = match rustls {
        None => {
            let (client, connection) = config.connect(NoTls).await?;
            tokio::spawn(log_close(connection));
            client
        }
        Some(rustls) => {
            let tls = tokio_postgres_rustls::MakeRustlsConnect::new((*rustls).clone());
            let (client, connection) = config.connect(tls).await?;
            tokio::spawn(log_close(connection));
            client
        }
    };
    Ok(client)
}

async fn log_close<F: std::future::Future<Output = Result<(), tokio_postgres::Error>>>(
    connection: F,
) {
    if let Err(err) = connection.await {
        tracing::debug!(error = %err, "SQL connection closed");
    }
}

/// What the server said, for an error it answered; else the error itself
/// (`tokio_postgres::Error` alone prints "db error").
pub fn server_said(err: &tokio_postgres::Error) -> String {
    err.as_db_error().map_or_else(|| err.to_string(), |db| db.message().to_owned())
}

fn describe_connect_error(err: &tokio_postgres::Error, user: &str) -> String {
    match err.as_db_error() {
        Some(db) if db.code() == &SqlState::INVALID_PASSWORD => {
            format!("password authentication failed for user {user:?}")
        }
        Some(db) => db.message().to_owned(),
        None => {
            let mut text = err.to_string();
            let mut source = std::error::Error::source(err);
            while let Some(inner) = source {
                text = format!("{text}: {inner}");
                source = inner.source();
            }
            text
        }
    }
}

/// Checks what the streamer needs before touching anything: [`check_server`], and the table
/// with the columns the mapping reads.
pub async fn check_prerequisites(
    client: &Client,
    table: &TableName,
    required_columns: &[(&str, &str)],
) -> Result<(), SetupError> {
    check_server(client).await?;
    let columns: Vec<String> = client
        .query(
            "SELECT a.attname::pg_catalog.text FROM pg_catalog.pg_attribute a \
             WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 \
               AND NOT a.attisdropped",
            &[&table.quoted()],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if columns.is_empty() {
        return Err(SetupError::TableMissing(table.to_string()));
    }
    for (role, column) in required_columns {
        if !columns.iter().any(|c| c == column) {
            return Err(SetupError::ColumnMissing {
                table: table.to_string(),
                column: (*column).to_owned(),
                role: (*role).to_owned(),
            });
        }
    }
    Ok(())
}

/// The server is set up for logical decoding and the role may replicate.
pub async fn check_server(client: &Client) -> Result<(), SetupError> {
    let wal_level: String = client.query_one("SHOW wal_level", &[]).await?.get(0);
    if wal_level != "logical" {
        return Err(SetupError::WalLevel(wal_level));
    }
    let row = client
        .query_one(
            "SELECT r.rolreplication OR r.rolsuper, current_user::pg_catalog.text \
             FROM pg_catalog.pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await?;
    if !row.get::<_, bool>(0) {
        return Err(SetupError::NoReplication(row.get(1)));
    }
    Ok(())
}

/// Creates a publication without tables if missing (`--messages-only`): pgoutput needs a
/// publication to start, and sends logical decoding messages whatever it publishes. An
/// existing publication is used as it is; rows of its tables are ignored.
pub async fn ensure_publication_for_messages(
    client: &Client,
    publication: &str,
) -> Result<bool, SetupError> {
    if publication_exists(client, publication).await? {
        return Ok(false);
    }
    let sql = format!("CREATE PUBLICATION {} WITH (publish = 'insert')", quote_ident(publication));
    match client.batch_execute(&sql).await {
        Ok(()) => Ok(true),
        Err(err) if is_duplicate(&err) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// Creates the publication for `tables` if missing; safe when two instances race. A
/// partitioned outbox is published through its root (`publish_via_partition_root`), so rows
/// of every partition, attached now or later, arrive under the outbox's own name; a
/// publication that would name the partitions instead, and a table with inheritance
/// children, are refused before anything streams. An existing publication is never changed:
/// one that lacks a table is refused with the line that adds it, since a table an operator
/// dropped from it and that pgoutbox added back would lose the rows committed in between.
pub async fn ensure_publication(
    client: &Client,
    publication: &str,
    tables: &[TableName],
) -> Result<bool, SetupError> {
    let mut partitioned = Vec::with_capacity(tables.len());
    for table in tables {
        partitioned.push(publishable(client, table).await?);
    }
    let existing = client
        .query_opt(
            "SELECT p.pubinsert, p.pubviaroot FROM pg_catalog.pg_publication p \
             WHERE p.pubname = $1",
            &[&publication],
        )
        .await?;
    if let Some(row) = existing {
        let (inserts, via_root): (bool, bool) = (row.get(0), row.get(1));
        for (table, partitioned) in tables.iter().zip(partitioned) {
            if partitioned && !via_root {
                return Err(SetupError::PartitionsNotViaRoot {
                    publication: publication.to_owned(),
                    table: table.to_string(),
                });
            }
            let covers = publishes(client, publication, table).await?;
            if !(inserts && covers) {
                return Err(SetupError::PublicationMismatch {
                    publication: publication.to_owned(),
                    table: table.to_string(),
                });
            }
        }
        return Ok(false);
    }
    let listed: Vec<String> = tables.iter().map(TableName::quoted).collect();
    // Without tables (a pattern that matches none yet): tables join it later.
    let listed = match listed.is_empty() {
        true => String::new(),
        false => format!("FOR TABLE {}", listed.join(", ")),
    };
    let sql = format!(
        "CREATE PUBLICATION {} {listed} \
         WITH (publish = 'insert', publish_via_partition_root = true)",
        quote_ident(publication),
    );
    match client.batch_execute(&sql).await {
        Ok(()) => Ok(true),
        Err(err) if is_duplicate(&err) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// Whether `table` is partitioned; a table with inheritance children is refused.
async fn publishable(client: &Client, table: &TableName) -> Result<bool, SetupError> {
    let shape = client
        .query_one(
            "SELECT c.relkind = 'p', \
                    (SELECT pg_catalog.string_agg( \
                              i.inhrelid::pg_catalog.regclass::pg_catalog.text, ', ') \
                     FROM pg_catalog.pg_inherits i WHERE i.inhparent = c.oid) \
             FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            // By name in the catalog, not `to_regclass`, which needs USAGE on the schema:
            // a tenant's schema need not grant pgoutbox's role anything.
            &[&table.schema, &table.name],
        )
        .await?;
    let partitioned: bool = shape.get(0);
    if let Some(children) = shape.get::<_, Option<String>>(1)
        && !partitioned
    {
        return Err(SetupError::InheritanceChildren { table: table.to_string(), children });
    }
    Ok(partitioned)
}

/// `max_slot_wal_keep_size` in bytes: `None` when unlimited (-1).
pub async fn max_slot_wal_keep_size(client: &Client) -> Result<Option<i64>, SetupError> {
    let sql =
        "SELECT pg_catalog.pg_size_bytes(pg_catalog.current_setting('max_slot_wal_keep_size'))";
    let bytes: i64 = client.query_one(sql, &[]).await?.try_get(0)?;
    Ok((bytes >= 0).then_some(bytes))
}

/// Whether the server is in recovery: a standby, or a standby being promoted.
pub async fn in_recovery(client: &Client) -> Result<bool, SetupError> {
    Ok(client.query_one("SELECT pg_catalog.pg_is_in_recovery()", &[]).await?.get(0))
}

/// The server's version as `server_version_num` (e.g. 170010) and as shown (`17.10`).
pub async fn server_version(client: &Client) -> Result<(i32, String), SetupError> {
    let row = client
        .query_one(
            "SELECT pg_catalog.current_setting('server_version_num')::pg_catalog.int4, \
                    pg_catalog.current_setting('server_version')",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// The first version with failover slots (`failover` in pg_create_logical_replication_slot).
pub const FAILOVER_SLOTS_SINCE: i32 = 170_000;

/// The first version that decodes on a standby.
pub const STANDBY_DECODING_SINCE: i32 = 160_000;

pub async fn publication_exists(client: &Client, publication: &str) -> Result<bool, SetupError> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1)",
            &[&publication],
        )
        .await?;
    Ok(row.get(0))
}

/// Creates the logical slot, a failover slot when asked (17+); `Ok(false)` when it already
/// existed (two instances racing).
pub async fn create_slot(client: &Client, slot: &str, failover: bool) -> Result<bool, SetupError> {
    let created = if failover {
        client
            .query_one(
                "SELECT pg_catalog.pg_create_logical_replication_slot( \
                   $1, 'pgoutput', false, false, true)",
                &[&slot],
            )
            .await
    } else {
        client
            .query_one(
                "SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&slot],
            )
            .await
    };
    match created {
        Ok(_) => Ok(true),
        Err(err) if is_duplicate(&err) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// Drops the slot if present; fails if a streamer is using it.
pub async fn teardown_slot(client: &Client, slot: &str) -> Result<(), SetupError> {
    client
        .execute(
            "SELECT pg_catalog.pg_drop_replication_slot(slot_name) \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(())
}

/// Drops `table` from `publication` (`teardown --only-table`); `false` when it was not in
/// it (nothing to do).
pub async fn drop_from_publication(
    client: &Client,
    publication: &str,
    table: &TableName,
) -> Result<bool, SetupError> {
    let published = client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_publication_rel r \
             JOIN pg_catalog.pg_publication p ON p.oid = r.prpubid \
             WHERE p.pubname = $1 AND r.prrelid = $2::pg_catalog.text::pg_catalog.regclass",
            &[&publication, &table.quoted()],
        )
        .await?
        .is_some();
    if published {
        let sql =
            format!("ALTER PUBLICATION {} DROP TABLE {}", quote_ident(publication), table.quoted());
        client.batch_execute(&sql).await?;
    }
    Ok(published)
}

/// Drops the slot (if present and not in use) and the publication.
pub async fn teardown(client: &Client, slot: &str, publication: &str) -> Result<(), SetupError> {
    teardown_slot(client, slot).await?;
    client
        .batch_execute(&format!("DROP PUBLICATION IF EXISTS {}", quote_ident(publication)))
        .await?;
    Ok(())
}

fn is_duplicate(err: &tokio_postgres::Error) -> bool {
    matches!(err.code(), Some(c) if *c == SqlState::DUPLICATE_OBJECT || *c == SqlState::UNIQUE_VIOLATION)
}

/// Whether `publication` publishes `table` (directly, by its schema, or for all tables).
pub async fn publishes(
    client: &impl tokio_postgres::GenericClient,
    publication: &str,
    table: &TableName,
) -> Result<bool, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT EXISTS ( \
               SELECT 1 FROM pg_catalog.pg_publication_tables t \
               WHERE t.pubname = $1 AND t.schemaname = $2 AND t.tablename = $3)",
            &[&publication, &table.schema, &table.name],
        )
        .await?;
    Ok(row.get(0))
}

#[cfg(test)]
mod tests {
    use super::TableName;

    #[test]
    fn wal_status_round_trips_and_refuses_unknown_words() {
        use super::WalStatus;
        for status in
            [WalStatus::Reserved, WalStatus::Extended, WalStatus::Unreserved, WalStatus::Lost]
        {
            assert_eq!(WalStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(WalStatus::parse("gone"), None);
    }

    #[test]
    fn table_names_default_to_public_and_reject_extra_dots() {
        let t: TableName = "outbox".parse().unwrap();
        assert_eq!((t.schema.as_str(), t.name.as_str()), ("public", "outbox"));
        let t: TableName = "app.events".parse().unwrap();
        assert_eq!(t.quoted(), "\"app\".\"events\"");
        assert!("a.b.c".parse::<TableName>().is_err());
        assert!(".x".parse::<TableName>().is_err());
    }
}
