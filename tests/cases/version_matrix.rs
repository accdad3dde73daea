//! The version matrix: `PGOUTBOX_TEST_PG=<major>` runs every test against that PostgreSQL
//! (binaries from `scripts/fetch-postgres.sh`), so the server the tests start must be it.

use crate::support::Postgres;
use crate::support::pg_bin;

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
