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
//! A table is judged whole ([`query::JUDGE`]): the table and every descendant through
//! `pg_inherits` (partitions and inheritance children), and for each its owner, its schema's,
//! and the owner of every function, operator, type and operator class its indexes, statistics,
//! partition key, columns, constraints, defaults, policies, rules and triggers reference,
//! found through `pg_depend` rather than a list of cases. Ownership of the table is not
//! ownership of its parts: a table handed over keeps its former owner's operators, triggers
//! and rules. A delete (`--retention`) is also refused where a DELETE would not do what it
//! says: an `ON DELETE` rule, an inheritance child (published under its own name); it goes
//! to each relation judged, with `ONLY`. A table outside the rule still streams from the WAL,
//! where decoding runs none of its code; what would read it is refused with [`Untrusted`],
//! one line naming the table, the part, its owner and the setting.

use tokio_postgres::GenericClient;

mod query;

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

/// The owner of a table, or of one of its parts.
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
    /// What of the table runs `owner`'s code, or why a delete cannot be judged safe (boxed:
    /// errors that carry this one stay small).
    pub part: Box<Part>,
    /// Refused for a delete (`--retention`), not a read.
    pub deleting: bool,
}

/// What of a table belongs to an owner not trusted, or keeps pgoutbox from deleting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// The table itself.
    Table,
    /// One of its partitions or inheritance children, by name: reading or deleting from the
    /// table plans and reads it too.
    Descendant(String),
    /// The schema of the table or of a descendant: its owner may rename it and put another
    /// relation (a view) in the table's place between two statements.
    Schema(String),
    /// An object the table's parts reference, and which part: `via` such as `index i on t`,
    /// `column c of t`, `partition key of t`, `trigger g on t`, `rule r on t`; `object` such
    /// as `function f(text)`, `operator o.###(text,text)`, `type t`.
    Uses { via: String, object: String },
    /// An `ON DELETE` rule (`rule` on relation `on`): a delete would do what it says instead.
    DeleteRule { rule: String, on: String },
    /// An inheritance child (not a partition): its rows are published under its own name,
    /// not the table's, so a delete there would take rows no message carries.
    InheritanceChild(String),
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Untrusted { table, owner, login, part, deleting } = self;
        let does = match deleting {
            true => "delete from",
            false => "read",
        };
        write!(f, "pgoutbox does not {does} table {table}: ")?;
        match part.as_ref() {
            Part::Table => write!(
                f,
                "it is owned by role {owner:?}, and reading a table runs its owner's index \
                 expressions, policies and casts as the reader ({login}); pgoutbox reads only \
                 tables owned by {login}, a superuser or a role named with --trusted-owner"
            )?,
            Part::Descendant(rel) => write!(
                f,
                "its partition or inheritance child {rel} is owned by role {owner:?}, whose \
                 index expressions, policies, casts and triggers would run as {login}"
            )?,
            Part::Schema(schema) => write!(
                f,
                "its schema {schema} is owned by role {owner:?}, who may rename it and put a \
                 view of its own in the table's place between two of pgoutbox's statements"
            )?,
            Part::Uses { via, object } => {
                let verb = if object.starts_with("type") { "uses" } else { "calls" };
                write!(
                    f,
                    "{via} {verb} {object}, owned by role {owner:?}, whose code would run as {login}"
                )?
            }
            Part::DeleteRule { rule, on } => {
                return write!(
                    f,
                    "rule {rule} on {on} rewrites a DELETE into what the rule says; pgoutbox \
                     deletes only where a DELETE deletes (drop the rule, or leave the table out \
                     of --retention)"
                );
            }
            Part::InheritanceChild(child) => {
                return write!(
                    f,
                    "it has an inheritance child {child}, whose rows are published under its own \
                     name, not the table's (a DELETE of the table would take them too); use \
                     declarative partitioning (PARTITION BY)"
                );
            }
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

/// `Ok(())` when pgoutbox may plan a query on `table` and read it: it is judged whole
/// ([`query::JUDGE`]), and every owner of it and of its parts is trusted (a table handed to a
/// trusted role keeps its old owner's expressions, operators, rules and triggers).
pub async fn check(
    client: &impl GenericClient,
    table: &TableName,
    trusted: &TrustedOwners,
) -> Result<(), TrustError> {
    judge(client, table, trusted, false).await.map(|_| ())
}

/// The relations to delete from, each with `DELETE FROM ONLY` (the table itself, or the
/// partitions that hold its rows), when pgoutbox may delete from `table`: [`check`], no
/// `ON DELETE` rule on any of them, and no inheritance child.
pub async fn check_writable(
    client: &impl GenericClient,
    table: &TableName,
    trusted: &TrustedOwners,
) -> Result<Vec<TableName>, TrustError> {
    judge(client, table, trusted, true).await
}

async fn judge(
    client: &impl GenericClient,
    table: &TableName,
    trusted: &TrustedOwners,
    deleting: bool,
) -> Result<Vec<TableName>, TrustError> {
    let rows = client.query(query::JUDGE, &[&table.quoted(), &deleting]).await?;
    let mut leaves = Vec::new();
    for row in &rows {
        let owner = Owner {
            name: row.try_get(3)?,
            superuser: row.try_get(4)?,
            is_login_role: row.try_get(5)?,
        };
        let (kind, name, via): (String, String, String) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let refused = match kind.as_str() {
            "delete rule" => Some(Part::DeleteRule { rule: name, on: via }),
            "child" if deleting => Some(Part::InheritanceChild(name)),
            _ if trusted.trusts(&owner) => None,
            "table" => Some(Part::Table),
            "partition" | "child" => Some(Part::Descendant(name)),
            "schema" => Some(Part::Schema(name)),
            _ => Some(Part::Uses { via, object: format!("{kind} {name}") }),
        };
        if let Some(part) = refused {
            let (table, login) = (table.to_string(), row.try_get(6)?);
            let part = Box::new(part);
            return Err(Untrusted { table, owner: owner.name, login, part, deleting }.into());
        }
        if let (Some(schema), Some(name)) = (row.try_get(7)?, row.try_get(8)?) {
            leaves.push(TableName { schema, name });
        }
    }
    Ok(leaves)
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
    fn the_refusal_names_the_table_the_part_its_owner_and_the_setting_and_asks_for_no_superuser() {
        let table = Untrusted {
            table: "tenant_evil.outbox".to_owned(),
            owner: "mallory".to_owned(),
            login: "postgres".to_owned(),
            part: Box::new(Part::Table),
            deleting: false,
        };
        let uses = |via: &str, object: &str| {
            Box::new(Part::Uses { via: via.into(), object: object.into() })
        };
        let trigger = Untrusted {
            part: uses("trigger audit on tenant_evil.outbox_2024", "function m.audit()"),
            deleting: true,
            ..table.clone()
        };
        let column = Untrusted {
            part: uses("column mood of tenant_evil.outbox", "type m.mood"),
            ..table.clone()
        };
        let operator = Untrusted {
            part: uses("index i on tenant_evil.child", "operator m.###(text,text)"),
            ..table.clone()
        };
        let child = Untrusted {
            part: Box::new(Part::Descendant("tenant_evil.child".into())),
            ..table.clone()
        };
        for (refusal, says) in [
            (table.to_string(), ["does not read table tenant_evil.outbox", "\"mallory\""]),
            (
                trigger.to_string(),
                [
                    "does not delete from table tenant_evil.outbox",
                    "trigger audit on tenant_evil.outbox_2024 calls function m.audit()",
                ],
            ),
            (
                column.to_string(),
                [
                    "does not read table tenant_evil.outbox",
                    "column mood of tenant_evil.outbox uses type m.mood",
                ],
            ),
            (
                operator.to_string(),
                ["index i on tenant_evil.child", "calls operator m.###(text,text)"],
            ),
            (child.to_string(), ["inheritance child tenant_evil.child", "\"mallory\""]),
        ] {
            for says in says.iter().chain(&["--trusted-owner mallory"]) {
                assert!(refusal.contains(says), "no {says} in {refusal}");
            }
            assert!(!refusal.contains("OWNER TO") && !refusal.contains("SUPERUSER"), "{refusal}");
            assert!(!refusal.contains('\n'), "one line: {refusal}");
        }
        // What no trust can mend names no role to trust.
        let rule = Part::DeleteRule { rule: "keep".into(), on: "tenant_evil.outbox".into() };
        let child = Part::InheritanceChild("tenant_evil.child".into());
        for part in [rule, child] {
            let part = Box::new(part);
            let refusal = Untrusted { part, deleting: true, ..table.clone() }.to_string();
            assert!(refusal.starts_with("pgoutbox does not delete from table"), "{refusal}");
            assert!(!refusal.contains("--trusted-owner") && !refusal.contains('\n'), "{refusal}");
        }
    }
}
