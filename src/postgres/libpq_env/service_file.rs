//! Connection service files (`pg_service.conf`), read as libpq's `parseServiceFile`: INI
//! sections named after services, `key=value` lines under them, `#` comments. Only the
//! lines of the wanted section are checked, as in libpq: a mistake elsewhere in a shared
//! file is someone else's service.

use super::Params;

/// A line of the wanted section that libpq would refuse too.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceLineError {
    #[error("line {0}: expected key=value")]
    NotKeyValue(usize),
    #[error("line {0}: a service cannot name another service")]
    Nested(usize),
    #[error("line {line}: {key:?} is not a libpq connection parameter")]
    UnknownKey { line: usize, key: String },
}

/// The parameters of `service` in this file; `Ok(None)` when the file has no such section.
pub fn find(text: &str, service: &str) -> Result<Option<Params>, ServiceLineError> {
    let mut found: Option<Params> = None;
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[') {
            if found.is_some() {
                break; // the next section: ours is complete
            }
            if name.strip_suffix(']').map(str::trim) == Some(service) {
                found = Some(Params::new());
            }
            continue;
        }
        let Some(params) = found.as_mut() else { continue };
        let (key, value) = line.split_once('=').ok_or(ServiceLineError::NotKeyValue(line_no))?;
        let key = key.trim();
        if key == "service" || key == "servicefile" {
            return Err(ServiceLineError::Nested(line_no));
        }
        if !LIBPQ_KEYS.contains(&key) {
            return Err(ServiceLineError::UnknownKey { line: line_no, key: key.to_owned() });
        }
        // The first value of a key counts, as libpq sets only what is not set yet.
        params.entry(key.to_owned()).or_insert_with(|| value.trim().to_owned());
    }
    Ok(found)
}

/// libpq's connection parameters (PostgreSQL 18), for telling a typo from a parameter.
const LIBPQ_KEYS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "sslnegotiation",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslkeylogfile",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "min_protocol_version",
    "max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "target_session_attrs",
    "load_balance_hosts",
    "oauth_issuer",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
];

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_text_is_read_or_refused_without_panic(text in "(\\PC|\n|\\[|\\]|=){0,200}") {
            let _ = find(&text, "a");
            let _ = find(&format!("[a]\n{text}"), "a");
        }
    }

    const FILE: &str = "\
# shared file
[other]
this line is broken

[app]
host=db.example
 port = 5433
dbname=app
# a comment
host=ignored

[after]
user=nobody
";

    #[test]
    fn the_wanted_section_is_read_and_others_are_not_checked() {
        let params = find(FILE, "app").unwrap().unwrap();
        assert_eq!(params.get("host").map(String::as_str), Some("db.example"));
        assert_eq!(params.get("port").map(String::as_str), Some("5433"));
        assert_eq!(params.get("dbname").map(String::as_str), Some("app"));
        assert!(!params.contains_key("user"), "the next section is not ours");
        assert_eq!(find(FILE, "missing").unwrap(), None);
    }

    #[test]
    fn bad_lines_of_the_wanted_section_name_their_line() {
        assert_eq!(find(FILE, "other").unwrap_err(), ServiceLineError::NotKeyValue(3));
        let nested = "[a]\nservice=b\n";
        assert_eq!(find(nested, "a").unwrap_err(), ServiceLineError::Nested(2));
        let typo = "[a]\nhots=x\n";
        let err = find(typo, "a").unwrap_err();
        assert_eq!(err.to_string(), "line 2: \"hots\" is not a libpq connection parameter");
    }
}
