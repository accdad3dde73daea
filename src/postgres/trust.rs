//! Which tables pgoutbox plans a query on: those whose owner it trusts.
//!
//! Reading a table runs its owner's code as the reader: planning folds index and
//! statistics expressions (an IMMUTABLE function may call a VOLATILE one), row-level
//! security policies run as the reader, and a column's type owner may `CREATE CAST`.
//! PostgreSQL's own maintenance commands switch to the table's owner for this reason.
//! pgoutbox usually holds more privilege than the roles that make tables (`REPLICATION`,
//! often a superuser's), so it reads rows (adoption, seed, recovery, backfill, verify,
//! replay) only from a table owned by a role whose code may run with its privileges:
//!
//! - pgoutbox's own login role,
//! - a superuser (who can do anything pgoutbox can already),
//! - a role the operator names with `--trusted-owner`.
//!
//! A partitioned table is trusted when it and every partition are. A table outside the
//! rule still streams from the WAL, where decoding runs none of its code; what would read
//! it is refused with [`Untrusted`], one line naming the table, its owner and the setting.

use tokio_postgres::GenericClient;

use crate::domain::outbox::TableName;

/// The roles named with `--trusted-owner`, besides pgoutbox's own and superusers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedOwners(Vec<String>);

impl TrustedOwners {
    pub fn new(roles: impl IntoIterator<Item = String>) -> TrustedOwners {
        TrustedOwners(roles.into_iter().filter(|r| !r.is_empty()).collect())
    }

    /// Whether `owner`'s code may run as pgoutbox.
    fn trusts(&self, owner: &Owner) -> bool {
        owner.is_login_role || owner.superuser || self.0.contains(&owner.name)
    }
}

/// The owner of a table, or of one of its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    name: String,
    superuser: bool,
    /// The role pgoutbox logged in as.
    is_login_role: bool,
}

/// A table pgoutbox will not read, or delete from: the code of `owner` would run as `login`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Untrusted {
    pub table: String,
    pub owner: String,
    pub login: String,
    /// Whose code: the table's, a column type's or a trigger's.
    pub part: Part,
}

/// What of a table belongs to an owner not trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// The table itself, or one of its partitions.
    Table,
    /// The table's schema: its owner may rename it and put another relation (a view) in
    /// the table's place between two statements.
    Schema(String),
    /// A column's type (`column type`): its owner may `CREATE CAST` from it.
    ColumnType(String),
    /// A function an index, statistics object, policy or constraint of the table calls
    /// (`name(argument types)`): the planner may fold it, a read may evaluate it.
    Function(String),
    /// A trigger, by name: its function runs as the role that writes.
    Trigger(String),
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Untrusted { table, owner, login, part } = self;
        match part {
            Part::Table => write!(
                f,
                "pgoutbox does not read table {table}: it is owned by role {owner:?}, and reading \
                 a table runs its owner's index expressions, policies and casts as the reader \
                 ({login}); pgoutbox reads only tables owned by {login}, a superuser or a role \
                 named with --trusted-owner"
            )?,
            Part::Schema(schema) => write!(
                f,
                "pgoutbox does not read table {table}: its schema {schema} is owned by role \
                 {owner:?}, who may rename it and put a view of its own in the table's place \
                 between two of pgoutbox's statements"
            )?,
            Part::ColumnType(column) => write!(
                f,
                "pgoutbox does not read table {table}: its column {column} is of a type owned by \
                 role {owner:?}, whose casts would run as the reader ({login})"
            )?,
            Part::Function(function) => write!(
                f,
                "pgoutbox does not read table {table}: an index, statistics object, policy or \
                 constraint of it calls function {function}, owned by role {owner:?}, which \
                 would run as the reader ({login})"
            )?,
            Part::Trigger(trigger) => write!(
                f,
                "pgoutbox does not delete from table {table}: its trigger {trigger} runs a \
                 function owned by role {owner:?}, which would run as {login} (drop or disable \
                 the trigger)"
            )?,
        }
        write!(
            f,
            "; if {owner:?}'s code may run with {login}'s privileges, add --trusted-owner {owner}"
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(transparent)]
    Untrusted(#[from] Untrusted),
    #[error(transparent)]
    Sql(#[from] tokio_postgres::Error),
}

/// The owners of a table's parts, each row: the part's kind (`table`, `schema`, `type`,
/// `function`, `trigger`),
/// its name, the owner's name, whether the owner is a superuser and pgoutbox's login role,
/// and that role's name.
const OWNERS: &str = "\
    WITH t AS (SELECT $1::pg_catalog.text::pg_catalog.regclass AS oid), \
    rels AS (SELECT oid FROM t \
             UNION SELECT relid FROM pg_catalog.pg_partition_tree((SELECT oid FROM t))), \
    parts AS ( \
      SELECT 'table' AS kind, '' AS name, c.relowner AS owner FROM pg_catalog.pg_class c \
      WHERE c.oid IN (SELECT oid FROM rels) \
      UNION ALL \
      SELECT 'schema', n.nspname::pg_catalog.text, \
             CASE WHEN o.rolname = 'pg_database_owner' \
                  THEN (SELECT datdba FROM pg_catalog.pg_database \
                        WHERE datname = pg_catalog.current_database()) \
                  ELSE n.nspowner END \
      FROM pg_catalog.pg_class c, pg_catalog.pg_namespace n, pg_catalog.pg_roles o, t \
      WHERE c.oid = t.oid AND n.oid = c.relnamespace AND o.oid = n.nspowner \
      UNION ALL \
      SELECT 'type', \
             a.attname::pg_catalog.text || ' ' || pg_catalog.format_type(a.atttypid, NULL), \
             ty.typowner \
      FROM pg_catalog.pg_attribute a, pg_catalog.pg_type ty, t \
      WHERE a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped AND ty.oid = a.atttypid \
      UNION ALL \
      SELECT 'function', p.oid::pg_catalog.regprocedure::pg_catalog.text, p.proowner \
      FROM pg_catalog.pg_depend d, pg_catalog.pg_proc p \
      WHERE d.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND p.oid = d.refobjid \
        AND ((d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objid IN \
               (SELECT indexrelid FROM pg_catalog.pg_index WHERE indrelid IN (SELECT oid FROM rels))) \
          OR (d.classid = 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass AND d.objid IN \
               (SELECT oid FROM pg_catalog.pg_statistic_ext WHERE stxrelid IN (SELECT oid FROM rels))) \
          OR (d.classid = 'pg_catalog.pg_policy'::pg_catalog.regclass AND d.objid IN \
               (SELECT oid FROM pg_catalog.pg_policy WHERE polrelid IN (SELECT oid FROM rels))) \
          OR (d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND d.objid IN \
               (SELECT oid FROM pg_catalog.pg_constraint WHERE conrelid IN (SELECT oid FROM rels)))) \
      UNION ALL \
      SELECT 'trigger', tg.tgname::pg_catalog.text, p.proowner \
      FROM pg_catalog.pg_trigger tg, pg_catalog.pg_proc p, t \
      WHERE tg.tgrelid = t.oid AND NOT tg.tgisinternal AND tg.tgenabled <> 'D' \
        AND p.oid = tg.tgfoid AND $2) \
    SELECT parts.kind, parts.name, r.rolname::pg_catalog.text, r.rolsuper, \
           r.rolname = current_user, current_user::pg_catalog.text \
    FROM parts JOIN pg_catalog.pg_roles r ON r.oid = parts.owner \
    ORDER BY parts.kind = 'table' DESC";

/// `Ok(())` when every owner of `table` is trusted, its schema's (whose owner could swap a
/// view in under its name; `public`'s `pg_database_owner` is the database's owner), its
/// partitions', its column types' and
/// those of the functions its indexes, statistics, policies and constraints call included
/// (a table handed to a trusted role keeps its old owner's expressions): pgoutbox may read
/// it.
pub async fn check(
    client: &impl GenericClient,
    table: &TableName,
    trusted: &TrustedOwners,
) -> Result<(), TrustError> {
    check_parts(client, table, trusted, false).await
}

/// `Ok(())` when pgoutbox may delete from `table`: [`check`], and every enabled trigger on
/// it runs a function of a trusted owner.
pub async fn check_writable(
    client: &impl GenericClient,
    table: &TableName,
    trusted: &TrustedOwners,
) -> Result<(), TrustError> {
    check_parts(client, table, trusted, true).await
}

async fn check_parts(
    client: &impl GenericClient,
    table: &TableName,
    trusted: &TrustedOwners,
    triggers: bool,
) -> Result<(), TrustError> {
    let rows = client.query(OWNERS, &[&table.quoted(), &triggers]).await?;
    for row in &rows {
        let owner = Owner { name: row.get(2), superuser: row.get(3), is_login_role: row.get(4) };
        if trusted.trusts(&owner) {
            continue;
        }
        let part = match (row.get::<_, &str>(0), row.get::<_, String>(1)) {
            ("schema", schema) => Part::Schema(schema),
            ("type", column) => Part::ColumnType(column),
            ("trigger", trigger) => Part::Trigger(trigger),
            ("function", function) => Part::Function(function),
            _ => Part::Table,
        };
        let (table, login) = (table.to_string(), row.get(5));
        return Err(Untrusted { table, owner: owner.name, login, part }.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(name: &str, superuser: bool, is_login_role: bool) -> Owner {
        Owner { name: name.to_owned(), superuser, is_login_role }
    }

    #[test]
    fn its_own_role_superusers_and_named_roles_are_trusted_and_no_one_else() {
        let none = TrustedOwners::default();
        assert!(none.trusts(&owner("relay", false, true)));
        assert!(none.trusts(&owner("postgres", true, false)));
        assert!(!none.trusts(&owner("tenant", false, false)));
        let app = TrustedOwners::new(["app".to_owned(), String::new()]);
        assert!(app.trusts(&owner("app", false, false)));
        assert!(!app.trusts(&owner("App", false, false)), "role names are case-sensitive");
        assert!(!app.trusts(&owner("", false, false)), "an empty name trusts no one");
    }

    #[test]
    fn the_refusal_names_the_table_its_owner_and_the_setting_and_asks_for_no_superuser() {
        let table = Untrusted {
            table: "tenant_evil.outbox".to_owned(),
            owner: "mallory".to_owned(),
            login: "postgres".to_owned(),
            part: Part::Table,
        };
        let trigger = Untrusted { part: Part::Trigger("audit".to_owned()), ..table.clone() };
        let column = Untrusted { part: Part::ColumnType("mood mood".to_owned()), ..table.clone() };
        for (refusal, says) in [
            (table.to_string(), ["does not read table tenant_evil.outbox", "\"mallory\""]),
            (
                trigger.to_string(),
                ["does not delete from table tenant_evil.outbox", "trigger audit"],
            ),
            (column.to_string(), ["does not read table tenant_evil.outbox", "column mood mood"]),
        ] {
            for says in says.iter().chain(&["--trusted-owner mallory"]) {
                assert!(refusal.contains(says), "no {says} in {refusal}");
            }
            assert!(!refusal.contains("OWNER TO") && !refusal.contains("SUPERUSER"), "{refusal}");
            assert!(!refusal.contains('\n'), "one line: {refusal}");
        }
    }
}
