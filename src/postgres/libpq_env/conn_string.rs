//! A connection string, URL or `key=value`, read into libpq's parameters, so that the
//! parameters it sets can be told from those left to the environment and service files.

use super::Params;
use crate::postgres::conninfo::percent_decode;

/// A connection string that libpq would refuse too.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnStringError {
    #[error("unterminated [ in host {0:?}")]
    UnterminatedBracket(String),
    #[error("invalid port {0:?}")]
    InvalidPort(String),
    #[error("missing \"=\" after {0:?}")]
    MissingEquals(String),
    #[error("a parameter without a name (\"=\" at its start)")]
    NoName,
    #[error("unterminated quoted value of {0:?}")]
    Unterminated(String),
}

/// Reads a URL (`postgres://` or `postgresql://`) or a `key=value` list.
pub fn parse(text: &str) -> Result<Params, ConnStringError> {
    match text.strip_prefix("postgresql://").or_else(|| text.strip_prefix("postgres://")) {
        Some(rest) => parse_url(rest),
        None => parse_key_values(text),
    }
}

/// `[user[:password]@][host[:port][,…]][/dbname][?key=value&…]`, percent-decoded.
fn parse_url(rest: &str) -> Result<Params, ConnStringError> {
    let mut params = Params::new();
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (user_info, host_spec) = match authority.rsplit_once('@') {
        Some((info, hosts)) => (Some(info), hosts),
        None => (None, authority),
    };
    if let Some(info) = user_info {
        let (user, password) = info.split_once(':').map_or((info, None), |(u, p)| (u, Some(p)));
        set(&mut params, "user", percent_decode(user));
        if let Some(password) = password {
            params.insert("password".into(), percent_decode(password));
        }
    }
    let (mut hosts, mut ports) = (Vec::new(), Vec::new());
    for spec in host_spec.split(',') {
        let (host, port) = match spec.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6
                    .split_once(']')
                    .ok_or_else(|| ConnStringError::UnterminatedBracket(spec.to_owned()))?;
                (host, after.strip_prefix(':').unwrap_or(after))
            }
            None => spec.split_once(':').unwrap_or((spec, "")),
        };
        if !port.is_empty() && port.parse::<u16>().is_err() {
            return Err(ConnStringError::InvalidPort(port.to_owned()));
        }
        hosts.push(percent_decode(host));
        ports.push(port.to_owned());
    }
    if hosts.iter().any(|h| !h.is_empty()) {
        params.insert("host".into(), hosts.join(","));
    }
    if ports.iter().any(|p| !p.is_empty()) {
        params.insert("port".into(), ports.join(","));
    }
    set(&mut params, "dbname", percent_decode(path));
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) =
            pair.split_once('=').ok_or_else(|| ConnStringError::MissingEquals(pair.to_owned()))?;
        params.insert(percent_decode(key), percent_decode(value));
    }
    Ok(params)
}

fn set(params: &mut Params, key: &str, value: String) {
    if !value.is_empty() {
        params.insert(key.to_owned(), value);
    }
}

/// `key=value key = 'quoted \' value'`, with backslash escapes, as libpq's `conninfo_parse`.
fn parse_key_values(text: &str) -> Result<Params, ConnStringError> {
    let mut params = Params::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        if key.is_empty() {
            if chars.peek().is_none() {
                return Ok(params);
            }
            return Err(ConnStringError::NoName);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(ConnStringError::MissingEquals(key));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(ConnStringError::Unterminated(key)),
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        params.insert(key, value);
    }
}

/// Writes parameters as a `key='value'` list, quoted and escaped as libpq reads it.
pub fn to_key_values<'a>(params: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    params
        .into_iter()
        .map(|(key, value)| format!("{key}='{}'", value.replace('\\', "\\\\").replace('\'', "\\'")))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_text_parses_or_is_refused_without_panic(text in "\\PC{0,80}") {
            let _ = parse(&text);
            let _ = parse(&format!("postgres://{text}"));
        }

        #[test]
        fn written_values_read_back(value in "\\PC{0,40}") {
            let params: Params = [("options".to_owned(), value)].into();
            prop_assert_eq!(parse(&to_key_values(&params)).unwrap(), params);
        }
    }

    fn get<'a>(params: &'a Params, key: &str) -> Option<&'a str> {
        params.get(key).map(String::as_str)
    }

    #[test]
    fn urls_give_their_parts() {
        let p = parse("postgres://al%40ice:p%3Ass@h1:5433,[::1]:5434/my%20db?sslmode=require&application_name=a%26b").unwrap();
        assert_eq!(get(&p, "user"), Some("al@ice"));
        assert_eq!(get(&p, "password"), Some("p:ss"));
        assert_eq!(get(&p, "host"), Some("h1,::1"));
        assert_eq!(get(&p, "port"), Some("5433,5434"));
        assert_eq!(get(&p, "dbname"), Some("my db"));
        assert_eq!(get(&p, "sslmode"), Some("require"));
        assert_eq!(get(&p, "application_name"), Some("a&b"));
    }

    #[test]
    fn a_url_without_host_leaves_the_host_to_the_environment() {
        let p = parse("postgresql:///app").unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), vec!["dbname"]);
        let p = parse("postgresql://%2Fvar%2Frun%2Fpostgresql/app").unwrap();
        assert_eq!(get(&p, "host"), Some("/var/run/postgresql"));
        assert!(parse("postgres://h:notaport/db").is_err());
    }

    #[test]
    fn key_values_are_unquoted_and_unescaped() {
        let p = parse(" host = h  password='it\\'s a \\\\ secret' dbname=d\\ b ").unwrap();
        assert_eq!(get(&p, "host"), Some("h"));
        assert_eq!(get(&p, "password"), Some("it's a \\ secret"));
        assert_eq!(get(&p, "dbname"), Some("d b"));
        assert!(parse("host").is_err());
        assert!(parse("password='open").is_err());
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn written_key_values_read_back_the_same() {
        let p = parse("host=h password='a \\' b \\\\' options='-c x=1'").unwrap();
        let again = parse(&to_key_values(&p)).unwrap();
        assert_eq!(p, again);
        let tokio: tokio_postgres::Config = to_key_values(&p).parse().unwrap();
        assert_eq!(tokio.get_password(), Some("a ' b \\".as_bytes()));
    }
}
