//! pgoutbox authenticates to nats-server configured for each method: user and password,
//! token (both in the URL), an NKey seed file, a creds file, and TLS verified with a CA, with
//! and without a client certificate; a seed rotated on disk is read again at reconnect.

use std::path::Path;
use std::time::Duration;

use crate::support::pgoutbox::{Pgoutbox, command};
use crate::support::{Nats, Postgres, numbered_rows, wait_until_streaming};

/// Starts pgoutbox with `url` and extra args, and proves a row reaches the stream by
/// reading it back with the same credentials through `pgoutbox status --json`.
/// Streams three rows with these NATS settings, logging at debug level; returns the log.
async fn streams_with(pg: &Postgres, nats: &Nats, url: &str, args: &[&str]) -> String {
    let mut cmd = command(pg, nats);
    cmd.env("PGOUTBOX_NATS_URL", url).env("RUST_LOG", "debug").args(args).arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(pg, &app).await;
    pg.psql(&numbered_rows(0, 3, 3));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut status = command(pg, nats);
        status.env("PGOUTBOX_NATS_URL", url).args(args).args(["status", "--json"]);
        let output = status.output().expect("status runs");
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        if report["stream"]["messages"] == 3 {
            return app.log();
        }
        assert!(std::time::Instant::now() < deadline, "no messages: {report}\n{}", app.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn nats_with_config(dir: &Path, config: &str) -> Nats {
    let path = dir.join("nats.conf");
    std::fs::write(&path, config).expect("write nats.conf");
    Nats::start_with_args(&["-c", path.to_str().expect("UTF-8 path")])
}

fn fresh_pg() -> Postgres {
    let pg = Postgres::start();
    pg.psql(include_str!("../../sql/outbox.sql"));
    pg
}

#[tokio::test(flavor = "multi_thread")]
async fn user_and_password_in_the_url() {
    let dir = tempfile::tempdir().expect("dir");
    let nats = nats_with_config(dir.path(), "authorization { user: app, password: \"p%ss w\" }\n");
    let pg = fresh_pg();
    let url = format!("nats://app:p%25ss%20w@127.0.0.1:{}", nats.port());
    let log = streams_with(&pg, &nats, &url, &[]).await;
    assert!(!log.contains("p%25ss") && !log.contains("p%ss"), "the password was logged:\n{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn token_in_the_url() {
    let dir = tempfile::tempdir().expect("dir");
    let nats = nats_with_config(dir.path(), "authorization { token: s3cr3t-t0ken }\n");
    let pg = fresh_pg();
    let url = format!("nats://s3cr3t-t0ken@127.0.0.1:{}", nats.port());
    let log = streams_with(&pg, &nats, &url, &[]).await;
    assert!(!log.contains("s3cr3t"), "the token was logged:\n{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn nkey_seed_file() {
    let dir = tempfile::tempdir().expect("dir");
    let user = nkeys::KeyPair::new_user();
    let seed = dir.path().join("user.nk");
    std::fs::write(&seed, user.seed().expect("seed")).expect("write seed");
    let config = format!("authorization {{ users = [ {{ nkey: {} }} ] }}\n", user.public_key());
    let nats = nats_with_config(dir.path(), &config);
    let pg = fresh_pg();
    let seed = seed.to_str().expect("UTF-8 path");
    streams_with(&pg, &nats, &nats.url(), &["--nats-nkey", seed]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_verified_with_a_ca() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path();
    crate::support::certs::ca_and_server(d, "IP:127.0.0.1,DNS:localhost");
    let config = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\" }}\n",
        d.join("server.pem").display(),
        d.join("server.key").display()
    );
    let nats = nats_with_config(d, &config);
    let pg = fresh_pg();
    let ca = d.join("ca.pem");
    let url = format!("tls://127.0.0.1:{}", nats.port());
    streams_with(&pg, &nats, &url, &["--nats-tls-ca", ca.to_str().expect("UTF-8 path")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_with_a_client_certificate() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path();
    crate::support::certs::ca_and_server(d, "IP:127.0.0.1,DNS:localhost");
    crate::support::certs::client(d);
    let path = |name: &str| d.join(name).to_str().expect("UTF-8 path").to_owned();
    let config = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}\n",
        path("server.pem"),
        path("server.key"),
        path("ca.pem")
    );
    let nats = nats_with_config(d, &config);
    let pg = fresh_pg();
    let url = format!("tls://127.0.0.1:{}", nats.port());
    let (ca, cert, key) = (path("ca.pem"), path("client.pem"), path("client.key"));
    let args = ["--nats-tls-ca", &ca, "--nats-tls-cert", &cert, "--nats-tls-key", &key];
    streams_with(&pg, &nats, &url, &args).await;
}

/// A JWT as nats-server's operator mode reads it (nats-io/jwt v2): ed25519-nkey signed.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": format!("{:X}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)),
        "iat": 1_700_000_000,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let claims = b64.encode(claims.to_string());
    let signed = format!("{header}.{claims}");
    let signature = issuer.sign(signed.as_bytes()).expect("sign");
    format!("{signed}.{}", b64.encode(signature))
}

#[tokio::test(flavor = "multi_thread")]
async fn creds_file_in_operator_mode() {
    let dir = tempfile::tempdir().expect("dir");
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let system = nkeys::KeyPair::new_account();
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "op",
        serde_json::json!({
            "system_account": system.public_key(), "type": "operator", "version": 2
        }),
    );
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({ "type": "account", "version": 2 }),
    );
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1
    });
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "app",
        serde_json::json!({ "limits": unlimited, "type": "account", "version": 2 }),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "pgoutbox",
        serde_json::json!({
            "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
            "type": "user", "version": 2
        }),
    );
    let creds = dir.path().join("pgoutbox.creds");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().expect("seed")
        ),
    )
    .expect("write creds");
    let config = format!(
        "operator: \"{operator_jwt}\"\nsystem_account: {sys}\nresolver: MEMORY\n\
         resolver_preload: {{\n  {sys}: \"{system_jwt}\"\n  {app}: \"{account_jwt}\"\n}}\n",
        sys = system.public_key(),
        app = account.public_key()
    );
    let nats = nats_with_config(dir.path(), &config);
    let pg = fresh_pg();
    let creds = creds.to_str().expect("UTF-8 path");
    streams_with(&pg, &nats, &nats.url(), &["--nats-creds", creds]).await;
}

/// The stream's message count as `pgoutbox status --json` reads it with these settings.
fn stored(pg: &Postgres, nats: &Nats, args: &[&str]) -> serde_json::Value {
    let mut status = command(pg, nats);
    let output = status.args(args).args(["status", "--json"]).output().expect("status runs");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    report["stream"]["messages"].clone()
}

/// A seed rotated on disk (and the old key no longer accepted) is read again when both
/// NATS connections reconnect, as a rotated `.creds` file is.
#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_nkey_seed_is_read_again_at_reconnect() {
    let dir = tempfile::tempdir().expect("dir");
    let (old, new) = (nkeys::KeyPair::new_user(), nkeys::KeyPair::new_user());
    let accepting = |key: &nkeys::KeyPair| {
        format!("authorization {{ users = [ {{ nkey: {} }} ] }}\n", key.public_key())
    };
    let seed = dir.path().join("user.nk");
    std::fs::write(&seed, old.seed().expect("seed")).expect("write seed");
    let mut nats = nats_with_config(dir.path(), &accepting(&old));
    let pg = fresh_pg();
    let args = ["--nats-nkey", seed.to_str().expect("UTF-8 path")];
    let mut cmd = command(&pg, &nats);
    cmd.args(args).arg("run");
    let app = Pgoutbox::spawn(cmd);
    wait_until_streaming(&pg, &app).await;
    pg.psql(&numbered_rows(0, 3, 3));
    crate::support::eventually(Duration::from_secs(20), "rows with the first key", || async {
        (stored(&pg, &nats, &args) == 3).then_some(())
    })
    .await;

    nats.stop();
    std::fs::write(dir.path().join("nats.conf"), accepting(&new)).expect("write nats.conf");
    std::fs::write(&seed, new.seed().expect("seed")).expect("write seed");
    nats.start_again();
    pg.psql(&numbered_rows(3, 6, 3));
    crate::support::eventually(Duration::from_secs(60), "rows with the rotated key", || async {
        (stored(&pg, &nats, &args) == 6).then_some(())
    })
    .await;
    assert!(app.log().contains("NATS connected"), "{}", app.log());
}
