//! The replication connection is our own: it must log in with every method Postgres offers
//! (SCRAM-SHA-256, md5, cleartext password, trust) and over a Unix socket, with the same
//! connection string as the SQL connection.

use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::stream::{count, jetstream};
use crate::support::{Nats, Postgres, eventually, numbered_rows, wait_until_streaming};

#[tokio::test(flavor = "multi_thread")]
async fn streams_with_scram_md5_password_and_trust_over_tcp_and_unix_socket() {
    let pg = Postgres::builder()
        .hba("host all scram_user 127.0.0.1/32 scram-sha-256")
        .hba("host all md5_user 127.0.0.1/32 md5")
        .hba("host all password_user 127.0.0.1/32 password")
        .start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg.psql(
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE scram_user LOGIN REPLICATION PASSWORD 's3cret'; \
         CREATE ROLE password_user LOGIN REPLICATION PASSWORD 's3cret'; \
         CREATE ROLE trust_user LOGIN REPLICATION; \
         SET password_encryption = 'md5'; \
         CREATE ROLE md5_user LOGIN REPLICATION PASSWORD 's3cret'; \
         GRANT SELECT ON outbox TO scram_user, md5_user, password_user, trust_user;",
    );
    let nats = Nats::start();
    // The superuser sets up once; each role then only needs REPLICATION and SELECT.
    let setup = command(&pg, &nats).arg("setup").output().expect("setup runs");
    assert!(setup.status.success(), "{}", String::from_utf8_lossy(&setup.stderr));

    let socket_url = format!(
        "host={} port={} user=trust_user dbname=postgres",
        pg.socket_dir().display(),
        pg.port()
    );
    let logins = [
        ("scram", pg.url_for("scram_user", Some("s3cret"), "postgres")),
        ("md5", pg.url_for("md5_user", Some("s3cret"), "postgres")),
        ("password", pg.url_for("password_user", Some("s3cret"), "postgres")),
        ("trust over a Unix socket", socket_url),
    ];
    let js = jetstream(&nats.url()).await;
    for (i, (method, url)) in logins.iter().enumerate() {
        let mut cmd = command(&pg, &nats);
        cmd.env("PGOUTBOX_DATABASE_URL", url).arg("run");
        let app = Pgoutbox::spawn(cmd);
        wait_until_streaming(&pg, &app).await;
        pg.psql(&numbered_rows(i * 10, i * 10 + 10, 10));
        let want = (i as u64 + 1) * 10;
        eventually(Duration::from_secs(20), &format!("rows streamed with {method}"), || async {
            (count(&js, "OUTBOX").await == want).then_some(())
        })
        .await;
        crate::support::stop_and_wait_released(&pg, app).await;
    }
}
