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
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=server",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(dir.join("san.ext"), format!("subjectAltName={subject_alt_names}\n"))
        .expect("write san.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ],
    );
}
