//! Test certificates made with the `openssl` command: a CA and a server certificate it
//! signed, for TLS tests against real servers.

use std::path::Path;
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("run openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Writes `<name>.pem` and `<name>.key`: a self-signed CA.
pub fn ca(dir: &Path, name: &str) {
    let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
    let subject = format!("/CN={name}");
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", &subject,
            "-keyout", &key, "-out", &pem,
        ],
    );
}

/// Writes `ca.pem`/`ca.key` and `server.pem`/`server.key`, the server certificate signed by
/// the CA for `subject_alt_names` (e.g. `IP:127.0.0.1,DNS:localhost`).
pub fn ca_and_server(dir: &Path, subject_alt_names: &str) {
    ca(dir, "ca");
    signed_by_ca(dir, "server", &format!("subjectAltName={subject_alt_names}\n"));
}

/// Writes `client.pem`/`client.key`, a client certificate signed by the CA of
/// [`ca_and_server`], for mutual TLS.
pub fn client(dir: &Path) {
    signed_by_ca(dir, "client", "extendedKeyUsage=clientAuth\n");
}

/// Writes `<name>.pem`/`<name>.key`, signed by `ca.pem` with the extensions `ext`.
fn signed_by_ca(dir: &Path, name: &str, ext: &str) {
    let (key, csr, pem, ext_file) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
        format!("{name}.ext"),
    );
    let subject = format!("/CN={name}");
    openssl(
        dir,
        &["req", "-newkey", "rsa:2048", "-nodes", "-subj", &subject, "-keyout", &key, "-out", &csr],
    );
    std::fs::write(dir.join(&ext_file), ext).expect("write the extensions");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext_file,
            "-out",
            &pem,
        ],
    );
}
