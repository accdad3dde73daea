//! pgoutbox's own schema (`--own-schema`, `pgoutbox` by default): its record of what
//! JetStream acknowledged (`postgres::acknowledged`) and the tenant trigger's function
//! (`postgres::tenant_tables`) live there, never in `public`, where on PostgreSQL 14 any
//! role may make an object under pgoutbox's names first and have pgoutbox plan, write or
//! replace it.
//!
//! The schema is judged from the catalog, in a statement of its own, before any statement
//! names it or an object in it: owned by pgoutbox's role (or a superuser, or a role with
//! REPLICATION that pgoutbox could run as), and no other role may create in it. Then only its owner makes objects there, and an object found
//! there under one of pgoutbox's names is pgoutbox's own.

use tokio_postgres::Client;

use postgres_protocol::escape::escape_identifier as quote_ident;

/// Who holds the schema, as the catalog says.
#[derive(Debug, PartialEq, Eq)]
pub enum Holder {
    /// Missing: pgoutbox may make it.
    Missing,
    /// pgoutbox's role's, a superuser's or a role's with REPLICATION (one pgoutbox runs
    /// as: an admin's setup uses the schema `sql/grants.sql` made for pgoutbox's role), and
    /// no one else may create in it.
    Ours,
    /// Another role's: its owner may drop or rename what is in it.
    Theirs { owner: String, login: String },
    /// Ours, but `role` (`PUBLIC` for every role) may create in it.
    Open { role: String },
}

/// Why pgoutbox will not use its schema.
#[derive(Debug, thiserror::Error)]
pub enum OwnSchemaError {
    #[error(
        "schema {schema} exists, owned by role {owner:?}, not by pgoutbox's role {login:?}: \
         pgoutbox keeps its own objects only in a schema its role owns (its owner could \
         replace them); name another one with --own-schema, or drop that schema, then run \
         setup again"
    )]
    Theirs { schema: String, owner: String, login: String },
    #[error(
        "schema {schema} lets role {role} create objects in it: pgoutbox keeps its own \
         objects only where no other role can make one under their names; run `REVOKE \
         CREATE ON SCHEMA {quoted} FROM {role}`, then run setup again"
    )]
    Open { schema: String, quoted: String, role: String },
    #[error(transparent)]
    Sql(#[from] tokio_postgres::Error),
}

/// Reads who holds `schema`.
pub async fn holder(client: &Client, schema: &str) -> Result<Holder, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT o.rolname::pg_catalog.text, current_user::pg_catalog.text, \
                    o.rolsuper OR o.rolreplication, \
                    (SELECT COALESCE(g.rolname::pg_catalog.text, 'PUBLIC'::pg_catalog.text) \
                     FROM pg_catalog.aclexplode(n.nspacl) a \
                     LEFT JOIN pg_catalog.pg_roles g ON g.oid = a.grantee \
                     WHERE a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner \
                       AND NOT COALESCE(g.rolsuper, false) \
                     ORDER BY 1 LIMIT 1) \
             FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner \
             WHERE n.nspname = $1",
            &[&schema],
        )
        .await?;
    let Some(row) = row else { return Ok(Holder::Missing) };
    let (owner, login): (String, String) = (row.try_get(0)?, row.try_get(1)?);
    let could_be_ours: bool = row.try_get(2)?;
    if owner != login && !could_be_ours {
        return Ok(Holder::Theirs { owner, login });
    }
    Ok(match row.try_get::<_, Option<String>>(3)? {
        Some(role) => Holder::Open { role },
        None => Holder::Ours,
    })
}

/// Makes `schema` when it is missing; `Ok` when it is pgoutbox's to use.
pub async fn ensure(client: &Client, schema: &str) -> Result<(), OwnSchemaError> {
    match holder(client, schema).await? {
        // No IF NOT EXISTS: a schema made meanwhile by another role fails this, not joins it.
        Holder::Missing => {
            client.batch_execute(&format!("CREATE SCHEMA {}", quote_ident(schema))).await?;
            Ok(())
        }
        Holder::Ours => Ok(()),
        Holder::Theirs { owner, login } => {
            Err(OwnSchemaError::Theirs { schema: schema.to_owned(), owner, login })
        }
        Holder::Open { role } => {
            let quoted = quote_ident(schema);
            Err(OwnSchemaError::Open { schema: schema.to_owned(), quoted, role })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_is_one_line_naming_the_schema_and_asks_for_no_superuser() {
        let theirs = OwnSchemaError::Theirs {
            schema: "pgoutbox".into(),
            owner: "mallory".into(),
            login: "relay".into(),
        };
        let open = OwnSchemaError::Open {
            schema: "pgoutbox".into(),
            quoted: "pgoutbox".into(),
            role: "PUBLIC".into(),
        };
        for (said, names) in [
            (theirs.to_string(), ["schema pgoutbox", "\"mallory\"", "--own-schema"]),
            (
                open.to_string(),
                ["schema pgoutbox", "REVOKE CREATE ON SCHEMA pgoutbox FROM PUBLIC", "setup"],
            ),
        ] {
            for name in names {
                assert!(said.contains(name), "no {name} in {said}");
            }
            assert!(
                !said.contains('\n') && !said.contains("SUPERUSER") && !said.contains("OWNER TO")
            );
        }
    }
}
