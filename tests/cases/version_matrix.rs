//! The version matrices: `PGOUTBOX_TEST_PG=<major>` runs every test against that PostgreSQL
//! (binaries from `scripts/fetch-postgres.sh`), `PGOUTBOX_TEST_NATS=<minor>` against that
//! nats-server (`scripts/fetch-nats.sh`), so the servers the tests start must be them.

use crate::support::pg_bin;
use crate::support::{Nats, Postgres, http_get};

#[test]
fn the_server_under_test_is_the_version_asked_for() {
    let pg = Postgres::start();
    let num: u32 = pg.psql("SHOW server_version_num").parse().expect("a version number");
    assert_eq!(num / 10_000, pg_bin::major(), "the cluster runs another version than found");
    if let Ok(asked) = std::env::var("PGOUTBOX_TEST_PG")
        && std::env::var_os("PGOUTBOX_PG_BINDIR").is_none()
    {
        assert_eq!(num / 10_000, asked.parse::<u32>().expect("PGOUTBOX_TEST_PG=<major>"));
    }
    assert_eq!(pg.psql("SHOW wal_level"), "logical");
}

#[test]
fn the_nats_server_under_test_is_the_version_asked_for() {
    let nats = Nats::start();
    let (_, varz) = http_get(nats.monitor_port(), "/varz").expect("the monitor answers");
    let varz: serde_json::Value = serde_json::from_str(&varz).expect("/varz is JSON");
    let version = varz["version"].as_str().expect("/varz names the version");
    let asked = std::env::var("PGOUTBOX_TEST_NATS").unwrap_or_else(|_| "2.9".to_owned());
    if std::env::var_os("PGOUTBOX_NATS_SERVER").is_none() {
        assert!(version.starts_with(&format!("{asked}.")), "asked for {asked}, got {version}");
    }
}
