//! Adopting a table a `--table` pattern matches that is out of the publication (a tenant's
//! table created without the event trigger): the table is added, and the rows already in
//! it are published once, without pgoutbox ever writing to it.
//!
//! A table created while pgoutbox runs is not in a `FOR TABLE` publication until someone
//! adds it, and rows committed before that are never decoded, now or on any later decoding
//! of that WAL (docs/proposals/several-tables.md, fact 3). So in one transaction the table
//! is locked against writers (`SHARE ROW EXCLUSIVE`: `ALTER PUBLICATION` alone does not
//! wait for them, fact 5), added, and its rows are read and handed to the pipeline as
//! frames through pgoutbox's own replay table (`ReplayFrame::Adopted`), which publishes
//! them as that table's Inserts, in its place in commit order, under their own ids. Rows
//! written after the commit are decoded as any.
//!
//! Never DML on the table: its row triggers, rules and constraints run as the role that
//! writes, so a tenant's `BEFORE INSERT` trigger would run with pgoutbox's privileges, a
//! superuser's included (issue 45, R1). Reading a table runs its owner's index and
//! statistics expressions as the reader when the query is planned, so the rows are read
//! only when the owner is trusted (`postgres::trust`); the session also turns
//! `row_security` off (a policy's expression would run as pgoutbox: the read fails
//! instead). A table of an owner not trusted joins the publication all the same, and its
//! new rows stream from the WAL; the rows it held before are not read, which one warning
//! names with the setting that would trust its owner, and `pgoutbox_tables_unread_total`
//! counts (a table that never held a row, `pg_relation_size` 0, lost nothing).
//!
//! A table that cannot be added (pgoutbox's role does not own it, it is unlogged, ...) is
//! skipped with a warning naming it and what to run, and counted on `/metrics`
//! (`pgoutbox_tables_not_streamed`): the other tables stream on. So is a table with
//! inheritance children ([`left_out`]), before anything locks it; a table is added alone
//! (`ADD TABLE ONLY`), and whether its rows are read is the judgement of the whole table,
//! partitions included (`postgres::trust`). A table busy past
//! [`LOCK_TIMEOUT`] is tried at the next check.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use postgres_protocol::escape::escape_identifier as quote_ident;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tracing::{info, warn};

use crate::domain::outbox::{ColumnRoles, TableName, TablePattern};
use crate::postgres::outbox_table::TableDrift;
use crate::postgres::pgoutput::{ADOPTION_ID, FrameWriter};
use crate::postgres::replay_table::{self, FRAME_BYTES};
use crate::postgres::table_snapshot::{insert_order, relation_of, text_rows};
use crate::postgres::tenant_tables;
use crate::postgres::trust::{self, TrustError, TrustedOwners, Untrusted};

/// How long adoption waits for the transactions writing to the table.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// Rows read per `FETCH`: the rows in memory at once.
const BATCH: usize = 1_000;

/// Where an adoption hands the rows over: pgoutbox's replay table, for its slot.
#[derive(Debug, Clone)]
pub struct Handover {
    pub publication: String,
    pub replay_table: TableName,
    pub slot: String,
    /// Whose tables' rows may be read (`--trusted-owner`).
    pub trusted: TrustedOwners,
}

/// What adopting a table did.
#[derive(Debug)]
pub enum Adopted {
    /// The table was in the publication already (another setup, or the trigger, was first).
    AlreadyPublished,
    /// The table joined the publication, and this many rows it held were handed over.
    Read(u64),
    /// The table joined the publication, but it held rows and its owner is not trusted,
    /// so they were not read.
    Unread(Untrusted),
    /// Nothing changed: the replay table the rows would be handed over through is of an
    /// owner not trusted, or runs such a one's trigger (it would run as pgoutbox).
    Refused(Untrusted),
    /// Nothing changed: the table cannot be streamed whole, and why ([`left_out`]).
    LeftOut(String),
}

/// The inheritance children of `table` (not partitions: only a table that is not
/// partitioned has such), by name, if any.
pub async fn inheritance_children(
    client: &impl tokio_postgres::GenericClient,
    table: &TableName,
) -> Result<Option<String>, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT pg_catalog.string_agg(i.inhrelid::pg_catalog.regclass::pg_catalog.text, \
                                          ', ' ORDER BY i.inhrelid) \
             FROM pg_catalog.pg_inherits i \
             JOIN pg_catalog.pg_class c ON c.oid = i.inhparent \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'r'",
            &[&table.schema, &table.name],
        )
        .await?;
    row.try_get(0)
}

/// Why a table with inheritance `children` is left out: added to a publication, each child
/// is published under its own name, which no pattern's table is; read or deleted from, the
/// table reaches the children's rows (and runs their code).
pub fn left_out(children: &str) -> String {
    format!(
        "it has inheritance children ({children}), whose rows would be published under their \
         own names and read and deleted with it, so pgoutbox leaves it out; a partitioned table \
         (PARTITION BY) streams whole"
    )
}

/// Adds `table` to the publication and hands the rows already in it to the pipeline, in
/// one transaction, ordered by the created-at column of `roles` (when the table has it),
/// then by transaction, then as each transaction inserted them ([`insert_order`]); the
/// rows of a table whose owner is not trusted are not read ([`Adopted::Unread`]).
pub async fn adopt(
    client: &mut Client,
    (table, roles): (&TableName, &ColumnRoles),
    to: &Handover,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<Adopted, tokio_postgres::Error> {
    if let Some(children) = inheritance_children(client, table).await? {
        return Ok(Adopted::LeftOut(left_out(&children)));
    }
    let tx = client.transaction().await?;
    if !lock_and_add(&tx, table, &to.publication).await? {
        tx.commit().await?;
        return Ok(Adopted::AlreadyPublished);
    }
    let quoted = table.quoted();
    match trust::check(&tx, table, &to.trusted).await {
        Ok(()) => {}
        Err(TrustError::Sql(err)) => return Err(err),
        Err(TrustError::Untrusted(untrusted)) => {
            let held = held_rows(&tx, table).await?;
            tx.commit().await?;
            return Ok(if held { Adopted::Unread(untrusted) } else { Adopted::Read(0) });
        }
    }
    match trust::check_writable(&tx, &to.replay_table, &to.trusted).await {
        Ok(_) => {}
        Err(TrustError::Sql(err)) => return Err(err),
        Err(TrustError::Untrusted(refusal)) => return Ok(Adopted::Refused(refusal)),
    }
    let relation = relation_of(&tx, table).await?;
    let columns: Vec<String> = relation.columns.iter().map(|c| quote_ident(&c.name)).collect();
    let in_transaction = insert_order(&relation, &roles.id);
    let order = match relation.columns.iter().any(|c| c.name == roles.created_at) {
        true => format!(
            "{}, xmin::pg_catalog.text::pg_catalog.int8, {in_transaction}",
            quote_ident(&roles.created_at)
        ),
        false => format!("xmin::pg_catalog.text::pg_catalog.int8, {in_transaction}"),
    };
    tx.batch_execute(&format!(
        "DECLARE pgoutbox_adopted NO SCROLL CURSOR FOR SELECT {} FROM {quoted} ORDER BY {order}",
        columns.join(", ")
    ))
    .await?;
    let fetch = format!("FETCH {BATCH} FROM pgoutbox_adopted");
    let mut read = 0u64;
    loop {
        let rows = text_rows(&tx.simple_query(&fetch).await?);
        if rows.is_empty() {
            break;
        }
        let mut frames: Vec<(i64, Vec<u8>)> = Vec::new();
        let mut frame: Option<FrameWriter> = None;
        for tuple in rows {
            let full = frame
                .as_ref()
                .is_some_and(|f| f.bytes() + FrameWriter::row_len(&tuple) > FRAME_BYTES);
            if let Some(done) = frame.take_if(|_| full) {
                frames.push((read as i64, done.finish()));
            }
            read += 1;
            frame.get_or_insert_with(|| FrameWriter::adoption(&relation)).push(read, &tuple);
        }
        frames.extend(frame.map(|done| (read as i64, done.finish())));
        replay_table::hand_over(&tx, &to.replay_table, (&to.slot, ADOPTION_ID, 0), &frames).await?;
        progress(read);
    }
    tx.commit().await?;
    progress(0);
    Ok(Adopted::Read(read))
}

/// Whether `table` (any of its partitions) ever held a row, without planning a query on it:
/// a heap with no page never did.
async fn held_rows(
    tx: &tokio_postgres::Transaction<'_>,
    table: &TableName,
) -> Result<bool, tokio_postgres::Error> {
    let row = tx
        .query_one(
            "SELECT pg_catalog.pg_relation_size(t.c) > 0 OR EXISTS (\
               SELECT FROM pg_catalog.pg_partition_tree(t.c) p \
               WHERE pg_catalog.pg_relation_size(p.relid) > 0) \
             FROM (SELECT $1::pg_catalog.text::pg_catalog.regclass AS c) t",
            &[&table.quoted()],
        )
        .await?;
    Ok(row.get(0))
}

/// Adds `table` to `publication` without handing any row over, before a new stream's slot
/// exists: its rows committed so far are history (a `--backfill` seed reads them from the
/// new slot's snapshot), and those committed after are decoded. A table with inheritance
/// children is left out, as an adoption leaves it ([`left_out`]).
pub async fn join_before_slot(
    client: &mut Client,
    table: &TableName,
    publication: &str,
) -> Result<Joined, tokio_postgres::Error> {
    if let Some(children) = inheritance_children(client, table).await? {
        return Ok(Joined::LeftOut(left_out(&children)));
    }
    let tx = client.transaction().await?;
    let added = lock_and_add(&tx, table, publication).await?;
    tx.commit().await?;
    Ok(if added { Joined::Added } else { Joined::AlreadyPublished })
}

/// What [`join_before_slot`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    Added,
    AlreadyPublished,
    /// Not added, and why.
    LeftOut(String),
}

/// In `tx`: locks `table` against writers (waiting up to [`LOCK_TIMEOUT`] for those there)
/// with nothing of its owner's able to run in this session, and adds it alone (`ONLY`: no
/// child published under a name of its own) to `publication` unless it is there already
/// (`false`). Locking and adding plan nothing: no code of the table's runs.
async fn lock_and_add(
    tx: &tokio_postgres::Transaction<'_>,
    table: &TableName,
    publication: &str,
) -> Result<bool, tokio_postgres::Error> {
    let quoted = table.quoted();
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '{}ms'; SET LOCAL row_security = off; \
         SET LOCAL search_path = pg_catalog, pg_temp; \
         LOCK TABLE {quoted} IN SHARE ROW EXCLUSIVE MODE",
        LOCK_TIMEOUT.as_millis()
    ))
    .await?;
    if crate::postgres::admin::publishes(tx, publication, table).await? {
        return Ok(false);
    }
    let publication = quote_ident(publication);
    tx.batch_execute(&format!("ALTER PUBLICATION {publication} ADD TABLE ONLY {quoted}")).await?;
    Ok(true)
}

/// A round of adoptions over one pattern's tables: what stops pgoutbox, if anything.
pub struct Adoptions<'a> {
    pub to: &'a Handover,
    /// The OIDs of the tables the patterns matched at the attempt's start: one of these out
    /// of the publication was taken out on purpose, and stops pgoutbox.
    pub streamed: &'a [u32],
    /// The tables already warned about as not streamable, with the reason, so that each is
    /// named once for each reason.
    pub warned: &'a mut HashMap<u32, String>,
    /// The tables found not streamable in this round, by every pattern.
    pub not_streamed: usize,
    /// The tables that joined in this round without the rows they held being read (an
    /// owner not trusted).
    pub unread: usize,
    /// Told the rows read so far by the adoption under way after each batch, and 0 once it
    /// committed.
    pub progress: &'a mut (dyn FnMut(u64) + Send),
}

impl Adoptions<'_> {
    /// Records `why` as the reason table `oid` is not streamed: `true` when it is new for
    /// that table, and so worth a warning.
    fn new_reason(&mut self, oid: u32, why: &str) -> bool {
        let new = self.warned.get(&oid).is_none_or(|said| said != why);
        if new {
            self.warned.insert(oid, why.to_owned());
        }
        new
    }

    /// Adopts each table `pattern` matches that is out of the publication ([`adopt`]),
    /// until `until` (the rest wait for the next round). `Some(drift)`: a table that was
    /// streamed was taken out of the publication, and pgoutbox must stop. A table that
    /// cannot be added is skipped with a warning (once) and counted.
    pub async fn round(
        &mut self,
        client: &mut Client,
        pattern: &TablePattern,
        roles: &ColumnRoles,
        until: Instant,
    ) -> Result<Option<TableDrift>, tokio_postgres::Error> {
        let matched = tenant_tables::matched(client, pattern, &self.to.publication).await?;
        for missed in matched.into_iter().filter(|m| !m.published) {
            let table = &missed.table;
            if self.streamed.contains(&missed.oid) && missed.unlogged {
                // Its owner made it UNLOGGED (under `FOR ALL TABLES`, which then leaves it
                // out): a tenant's doing, which must not stop the others' stream.
                self.not_streamed += 1;
                let why = format!("it is UNLOGGED: run ALTER TABLE {} SET LOGGED", table.quoted());
                if self.new_reason(missed.oid, &why) {
                    warn!(%table, %pattern, "a table of the pattern is no longer streamed, \
                        its rows no longer in the WAL ({why}); the other tables stream on");
                }
                continue;
            }
            if self.streamed.contains(&missed.oid) {
                let (table, publication) = (table.to_string(), self.to.publication.clone());
                return Ok(Some(TableDrift::NotPublished { table, publication }));
            }
            if Instant::now() >= until {
                break;
            }
            match adopt(client, (table, roles), self.to, self.progress).await {
                Ok(Adopted::AlreadyPublished) => {
                    self.warned.remove(&missed.oid);
                }
                Ok(Adopted::Read(rows)) => {
                    self.warned.remove(&missed.oid);
                    info!(%table, %pattern, publication = %self.to.publication, rows,
                        "a new table of the pattern joined the publication, its rows handed over");
                }
                Ok(Adopted::Unread(untrusted)) => {
                    self.warned.remove(&missed.oid);
                    self.unread += 1;
                    warn!(%table, %pattern, publication = %self.to.publication,
                        "a new table of the pattern joined the publication and its new rows \
                         stream, but the rows it held before were not read: {untrusted}");
                }
                Ok(Adopted::LeftOut(why)) => {
                    self.not_streamed += 1;
                    if self.new_reason(missed.oid, &why) {
                        warn!(%table, %pattern, "a table of the pattern is left out: {why}; the \
                            other tables stream on");
                    }
                }
                Ok(Adopted::Refused(refusal)) => {
                    self.not_streamed += 1;
                    let why = refusal.to_string();
                    if self.new_reason(missed.oid, &why) {
                        warn!(%table, %pattern, replay_table = %self.to.replay_table,
                            "a table of the pattern is not adopted: the rows it holds would be \
                             handed over through the replay table, and {why}");
                    }
                }
                Err(err) if err.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                    warn!(%table, "the new table is busy; adopting it at the next check");
                }
                Err(err) if err.as_db_error().is_some() => {
                    self.not_streamed += 1;
                    let why = crate::postgres::admin::server_said(&err);
                    if self.new_reason(missed.oid, &why) {
                        let fix = fix(client, (missed.oid, table), self.to).await?;
                        warn!(%table, %pattern, reason = %why, %fix,
                            "a table of the pattern cannot be streamed and is skipped; \
                             the other tables stream on");
                    }
                }
                Err(err) => return Err(err),
            }
        }
        Ok(None)
    }
}

/// The statements that make `table` (of OID `oid`) one pgoutbox may add to `publication`: adding a table
/// takes owning it and the publication, and locking it takes the schema's `USAGE`;
/// pgoutbox only reads the table, so owning it gives it nothing to run. An unlogged table
/// cannot be published at all.
async fn fix(
    client: &Client,
    (oid, table): (u32, &TableName),
    to: &Handover,
) -> Result<String, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT current_user::pg_catalog.text, \
               coalesce((SELECT pg_catalog.pg_has_role(pubowner, 'USAGE') \
                         FROM pg_catalog.pg_publication WHERE pubname = $2), true), \
               pg_catalog.pg_has_role(c.relowner, 'USAGE'), \
               pg_catalog.has_schema_privilege(c.relnamespace, 'USAGE'), \
               c.relpersistence = 'u', \
               coalesce((SELECT pg_catalog.has_table_privilege(r.oid, 'INSERT') \
                           AND pg_catalog.has_table_privilege(r.oid, 'SELECT') \
                           AND pg_catalog.has_table_privilege(r.oid, 'DELETE') \
                         FROM pg_catalog.pg_class r \
                         JOIN pg_catalog.pg_namespace rn ON rn.oid = r.relnamespace \
                         WHERE rn.nspname = $3 AND r.relname = $4), true) \
             FROM pg_catalog.pg_class c WHERE c.oid = $1",
            &[&oid, &to.publication, &to.replay_table.schema, &to.replay_table.name],
        )
        .await?;
    let needs = Needs {
        publication: !row.get::<_, bool>(1),
        table: !row.get::<_, bool>(2),
        schema: !row.get::<_, bool>(3),
        unlogged: row.get(4),
        replay_table: (!row.get::<_, bool>(5)).then(|| to.replay_table.clone()),
    };
    Ok(needs.statements(table, &to.publication, &row.get::<_, String>(0)))
}

/// What pgoutbox's role lacks to add a table.
struct Needs {
    publication: bool,
    table: bool,
    schema: bool,
    unlogged: bool,
    /// The replay table the rows are handed over through, when the role may not write it.
    replay_table: Option<TableName>,
}

impl Needs {
    fn statements(&self, table: &TableName, publication: &str, role: &str) -> String {
        let (quoted, publication, role) =
            (table.quoted(), quote_ident(publication), quote_ident(role));
        let mut run = Vec::new();
        if self.unlogged {
            run.push(format!("ALTER TABLE {quoted} SET LOGGED"));
        }
        // Adding a table takes owning it and the publication. Handing either to pgoutbox's
        // role would make the table's code its own: a role that owns both adopts it instead.
        if self.table || self.publication {
            let run = run.iter().map(|s| format!("run {s}; then ")).collect::<String>();
            return format!(
                "{run}run `pgoutbox setup` with the same settings as a role that may add \
                 {quoted} to publication {publication} (the one that set pgoutbox up): it \
                 adopts the table, reading it (when its owner is trusted) and never writing it, \
                 and `pgoutbox setup --tenant-trigger` adds the tables made from then on"
            );
        }
        if self.schema {
            run.push(format!("GRANT USAGE ON SCHEMA {} TO {role}", quote_ident(&table.schema)));
        }
        if let Some(replay) = &self.replay_table {
            run.push(format!("GRANT INSERT, SELECT, DELETE ON {} TO {role}", replay.quoted()));
        }
        match run.is_empty() {
            true => format!("make {quoted} a table {role} may add to publication {publication}"),
            false => format!(
                "run {}; then pgoutbox adds it at its next check (within 10 s), reading it, \
                 never writing it",
                run.join("; ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Needs;
    use crate::domain::outbox::TableName;

    #[test]
    fn each_lack_gets_the_statement_that_fixes_it_and_none_asks_for_a_superuser() {
        let table: TableName = "tenant_2.outbox".parse().unwrap();
        let replay_table = Some("public.pgoutbox_replay".parse().unwrap());
        let grants = Needs {
            publication: false,
            table: false,
            schema: true,
            unlogged: true,
            replay_table: replay_table.clone(),
        };
        let fix = grants.statements(&table, "pgoutbox", "relay");
        for says in [
            "ALTER TABLE \"tenant_2\".\"outbox\" SET LOGGED",
            "GRANT USAGE ON SCHEMA \"tenant_2\" TO \"relay\"",
            "GRANT INSERT, SELECT, DELETE ON \"public\".\"pgoutbox_replay\" TO \"relay\"",
        ] {
            assert!(fix.contains(says), "no {says} in {fix}");
        }
        // Owning the table or the publication: never handed to pgoutbox's role, whose
        // reads and writes would then run the table's code as its own.
        let all =
            Needs { publication: true, table: true, schema: true, unlogged: true, replay_table };
        let fix = all.statements(&table, "pgoutbox", "relay");
        assert!(fix.contains("SET LOGGED") && fix.contains("run `pgoutbox setup`"), "{fix}");
        assert!(!fix.contains("OWNER TO") && !fix.contains("superuser"), "{fix}");
        let none = Needs {
            publication: false,
            table: false,
            schema: false,
            unlogged: false,
            replay_table: None,
        };
        let fix = none.statements(&table, "pgoutbox", "relay");
        assert!(fix.starts_with("make"), "{fix}");
        assert!(!fix.contains("superuser"), "{fix}");
    }
}
