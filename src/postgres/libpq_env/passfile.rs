//! The password file (`~/.pgpass`, `PGPASSFILE`, the `passfile` key), read as libpq reads
//! it: one `host:port:database:user:password` entry a line, `*` matching anything in the
//! first four fields, `\:` and `\\` for a literal colon or backslash, lines starting with
//! `#` ignored, and the first matching line wins. A line with fewer than five fields
//! matches nothing (libpq skips it silently; we say which line it is).

/// One field of an entry: `*`, or a value to compare exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    Any,
    Exact(String),
}

impl Field {
    fn matches(&self, value: &str) -> bool {
        match self {
            Field::Any => true,
            Field::Exact(exact) => exact == value,
        }
    }
}

/// One usable line of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    host: Field,
    port: Field,
    database: Field,
    user: Field,
    password: String,
}

/// A password file's entries, and the lines that could not be read as entries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Passfile {
    entries: Vec<Entry>,
    /// 1-based numbers of the lines with fewer than five fields.
    pub malformed_lines: Vec<usize>,
}

/// What a connection is looked up by.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub host: &'a str,
    pub port: &'a str,
    pub database: &'a str,
    pub user: &'a str,
}

impl Passfile {
    /// Reads the file's bytes; never fails: what is not an entry is skipped.
    pub fn parse(bytes: &[u8]) -> Passfile {
        let text = String::from_utf8_lossy(bytes);
        let mut file = Passfile::default();
        for (index, line) in text.split('\n').enumerate() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match parse_line(line) {
                Some(entry) => file.entries.push(entry),
                None => file.malformed_lines.push(index + 1),
            }
        }
        file
    }

    /// The password of the first entry that matches, as libpq's `passwordFromFile`.
    pub fn lookup(&self, target: Target<'_>) -> Option<&str> {
        self.entries
            .iter()
            .find(|e| {
                e.host.matches(target.host)
                    && e.port.matches(target.port)
                    && e.database.matches(target.database)
                    && e.user.matches(target.user)
            })
            .map(|e| e.password.as_str())
    }
}

fn parse_line(line: &str) -> Option<Entry> {
    let mut chars = line.chars();
    let mut fields = Vec::with_capacity(4);
    for _ in 0..4 {
        let (text, escaped_star, ended_by_colon) = read_field(&mut chars);
        if !ended_by_colon {
            return None;
        }
        fields.push(if text == "*" && !escaped_star { Field::Any } else { Field::Exact(text) });
    }
    // The password ends at the line's end, or at an unescaped colon, as in libpq.
    let (password, _, _) = read_field(&mut chars);
    let mut fields = fields.into_iter();
    Some(Entry {
        host: fields.next()?,
        port: fields.next()?,
        database: fields.next()?,
        user: fields.next()?,
        password,
    })
}

/// Reads up to an unescaped `:`; says whether a `*` was escaped (`\*` is a literal star)
/// and whether a colon ended the field.
fn read_field(chars: &mut std::str::Chars<'_>) -> (String, bool, bool) {
    let (mut text, mut escaped_star) = (String::new(), false);
    while let Some(c) = chars.next() {
        match c {
            ':' => return (text, escaped_star, true),
            '\\' => match chars.next() {
                Some(next) => {
                    escaped_star |= next == '*';
                    text.push(next);
                }
                None => text.push('\\'),
            },
            c => text.push(c),
        }
    }
    (text, escaped_star, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn target<'a>(host: &'a str, port: &'a str, database: &'a str, user: &'a str) -> Target<'a> {
        Target { host, port, database, user }
    }

    #[test]
    fn the_first_matching_line_wins_and_stars_match_anything() {
        let file = Passfile::parse(
            b"# comment\n\ndb.example:5432:app:alice:first\n*:*:*:alice:second\n*:*:*:*:any\n",
        );
        assert_eq!(file.lookup(target("db.example", "5432", "app", "alice")), Some("first"));
        assert_eq!(file.lookup(target("other", "5433", "x", "alice")), Some("second"));
        assert_eq!(file.lookup(target("other", "5433", "x", "bob")), Some("any"));
        assert!(file.malformed_lines.is_empty());
    }

    #[test]
    fn escapes_give_literal_colons_backslashes_and_stars() {
        let file = Passfile::parse(b"h\\:x:5432:d\\\\b:\\*:pa\\:ss\\\\word\r\n");
        assert_eq!(file.lookup(target("h:x", "5432", "d\\b", "*")), Some("pa:ss\\word"));
        assert_eq!(file.lookup(target("h:x", "5432", "d\\b", "bob")), None, "\\* is no wildcard");
    }

    #[test]
    fn an_unescaped_colon_ends_the_password() {
        let file = Passfile::parse(b"*:*:*:*:secret:trailing");
        assert_eq!(file.lookup(target("h", "1", "d", "u")), Some("secret"));
    }

    #[test]
    fn short_lines_match_nothing_and_are_reported() {
        let file = Passfile::parse(b"#x\nh:5432:db:user\n*:*:*:*:ok\n");
        assert_eq!(file.malformed_lines, vec![2]);
        assert_eq!(file.lookup(target("h", "5432", "db", "user")), Some("ok"));
    }

    #[test]
    fn an_empty_password_is_a_password() {
        let file = Passfile::parse(b"*:*:*:u:\n");
        assert_eq!(file.lookup(target("h", "1", "d", "u")), Some(""));
    }

    proptest! {
        #[test]
        fn any_bytes_parse_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let file = Passfile::parse(&bytes);
            let _ = file.lookup(target("h", "5432", "d", "u"));
        }

        #[test]
        fn escaped_fields_round_trip(fields in proptest::collection::vec("[a-z:\\\\*]{1,8}", 5)) {
            let escape = |f: &str| f.replace('\\', "\\\\").replace(':', "\\:").replace('*', "\\*");
            let line = fields.iter().map(|f| escape(f)).collect::<Vec<_>>().join(":");
            let file = Passfile::parse(line.as_bytes());
            let found = file.lookup(target(&fields[0], &fields[1], &fields[2], &fields[3]));
            prop_assert_eq!(found, Some(fields[4].as_str()));
        }
    }
}
