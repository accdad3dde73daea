//! Every session pgoutbox opens, SQL and replication, resolves names in `pg_catalog` only.
//!
//! pgoutbox usually has more privilege than the roles that write to its database. The
//! default `search_path` (`"$user", public`) lets a role with `CREATE` on the database make
//! a schema named after pgoutbox's login role and put there a function whose argument types
//! match a call better than `pg_catalog`'s does (an aggregate `string_agg(name, text)`
//! beats `pg_catalog.string_agg(text, text)` for a `name` column): it then runs as pgoutbox
//! (CVE-2018-1058). A database owner may even `ALTER DATABASE … SET search_path` to list a
//! schema before `pg_catalog`. So the startup packet itself sets `search_path` to
//! `pg_catalog, pg_temp`: a setting given at login outranks the role's and the database's,
//! and comes after any `options` the operator gave, so it wins over theirs too.
//! `pg_temp` is never searched for functions or operators, and last for tables and types.

/// The `-c` option that pins the search path, as the startup `options` parameter takes it.
const PIN: &str = "-c search_path=pg_catalog,pg_temp";

/// The startup `options` to send: the operator's, then the pin.
pub(crate) fn startup_options(operator: Option<&str>) -> String {
    match operator.map(str::trim).filter(|o| !o.is_empty()) {
        Some(options) => format!("{options} {PIN}"),
        None => PIN.to_owned(),
    }
}

/// `config` with the pin in its startup options, for a tokio-postgres connection.
pub(crate) fn pinned(config: &tokio_postgres::Config) -> tokio_postgres::Config {
    let mut pinned = config.clone();
    pinned.options(startup_options(config.get_options()));
    pinned
}

#[cfg(test)]
mod tests;
