//! A message's headers, kept as the lines they are sent as (`Name: value\r\n` each), so that
//! framing a message copies them in one go. async-nats's `HeaderMap` (a hash map of
//! allocated names and values, rehashed twice for our eight headers) was 15 % of pgoutbox's
//! CPU at full drain. Names compare case-sensitively, as NATS and `HeaderMap` compare them.

/// Headers in the order they were first set; setting a name again replaces its value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    lines: String,
    /// Where each line's name and value lie in `lines`. Finding a name compares names only:
    /// scanning the lines for it on every insert was a third of mapping a row (callgrind,
    /// 2026-11-28: 7,500 of 12,000 instructions).
    index: Vec<Line>,
}

/// One header's place in [`Headers::lines`]: `lines[start..name_end]` is the name, the value
/// runs from `name_end + 2` (after `": "`) to `end` (before `"\r\n"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Line {
    start: usize,
    name_end: usize,
    end: usize,
}

impl Headers {
    pub fn with_capacity(bytes: usize) -> Self {
        Headers { lines: String::with_capacity(bytes), index: Vec::with_capacity(12) }
    }

    /// Sets `name` to `value`. The caller has checked both ([`valid_name`],
    /// [`valid_value`]): a line break here would end the header block early.
    pub fn insert(&mut self, name: &str, value: &str) {
        debug_assert!(valid_name(name) && valid_value(value), "{name:?}: {value:?}");
        if self.get(name).is_some() {
            self.remove(name);
        }
        self.push(name, value);
    }

    fn push(&mut self, name: &str, value: &str) {
        let start = self.lines.len();
        self.lines.reserve(name.len() + value.len() + 4);
        self.lines.push_str(name);
        self.lines.push_str(": ");
        self.lines.push_str(value);
        self.index.push(Line { start, name_end: start + name.len(), end: self.lines.len() });
        self.lines.push_str("\r\n");
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(n, _)| *n == name).map(|(_, value)| value)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.index.iter().map(|line| {
            let name = self.lines.get(line.start..line.name_end).unwrap_or_default();
            let value = self.lines.get(line.name_end + 2..line.end).unwrap_or_default();
            (name, value)
        })
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The `Name: value\r\n` lines, as a header block holds them.
    pub fn lines(&self) -> &str {
        &self.lines
    }

    /// How many bytes the headers take on the wire (`NATS/1.0\r\n`, the lines, and a closing
    /// `\r\n`), as the server counts them against `max_payload`.
    pub fn wire_len(&self) -> usize {
        "NATS/1.0\r\n".len() + self.lines.len() + "\r\n".len()
    }

    /// Removes every header named `name` in any case and returns the first one's value;
    /// for a header that HTTP names case-insensitively, such as W3C's `traceparent`. Without
    /// such a header nothing is allocated.
    pub fn take_any_case(&mut self, name: &str) -> Option<String> {
        let value = self.iter().find(|(n, _)| n.eq_ignore_ascii_case(name))?.1.to_owned();
        self.remove_where(|n| n.eq_ignore_ascii_case(name));
        Some(value)
    }

    fn remove(&mut self, name: &str) {
        self.remove_where(|n| n == name);
    }

    fn remove_where(&mut self, matches: impl Fn(&str) -> bool) {
        let mut kept = Headers::with_capacity(self.lines.len());
        for (n, value) in self.iter().filter(|(n, _)| !matches(n)) {
            kept.push(n, value);
        }
        *self = kept;
    }
}

/// The headers read from optional role columns, with each role's column name.
pub(super) fn optional_headers(
    roles: &super::ColumnRoles,
) -> impl Iterator<Item = (&'static str, &str)> {
    [
        ("Outbox-Aggregate-Type", &roles.aggregate_type),
        ("Outbox-Aggregate-Id", &roles.aggregate_id),
        ("Outbox-Event-Type", &roles.event_type),
        ("Outbox-Created-At", &roles.created_at),
    ]
    .into_iter()
    .map(|(header, column)| (header, column.as_str()))
}

/// `value`, when it can be a header's value; else why not, naming the `column` it came from.
pub(super) fn header_value<'v, 'n>(
    value: &'v str,
    column: impl Fn() -> &'n str,
) -> Result<&'v str, super::Rejection> {
    if valid_value(value) {
        Ok(value)
    } else {
        let why = format!("column {} holds a line break, not allowed in a header", column());
        Err(super::Rejection(why))
    }
}

/// `schema.table` as a header value: control characters (a quoted identifier may hold
/// them) are written escaped, as Rust writes them, and at most 512 bytes are kept, so a
/// dead letter of the smallest budget still fits.
pub(super) fn header_safe_table(table: &str) -> String {
    let mut safe = String::with_capacity(table.len());
    for c in table.chars() {
        match c.is_control() {
            true => safe.extend(c.escape_default()),
            false => safe.push(c),
        }
        if safe.len() > 512 {
            break;
        }
    }
    safe
}

/// Whether NATS accepts `name` as a header name: printable ASCII without `:`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
}

/// Whether `value` can stand in a header: no line break.
pub fn valid_value(value: &str) -> bool {
    !value.contains(['\r', '\n'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_their_order_and_a_name_set_again_is_replaced() {
        let mut headers = Headers::default();
        headers.insert("Nats-Msg-Id", "a-1");
        headers.insert("Outbox-Event-Type", "created");
        headers.insert("trace", "x: y");
        headers.insert("Outbox-Event-Type", "updated");
        let all: Vec<_> = headers.iter().collect();
        assert_eq!(
            all,
            [("Nats-Msg-Id", "a-1"), ("trace", "x: y"), ("Outbox-Event-Type", "updated")]
        );
        assert_eq!(headers.get("trace"), Some("x: y"));
        assert_eq!(headers.get("TRACE"), None, "names compare case-sensitively");
        assert_eq!(headers.len(), 3);
        assert_eq!(headers.wire_len(), "NATS/1.0\r\n".len() + headers.lines().len() + 2);
    }

    #[test]
    fn a_header_is_taken_whatever_its_case() {
        let mut headers = Headers::default();
        headers.insert("Traceparent", "first");
        headers.insert("a", "1");
        headers.insert("TRACEPARENT", "second");
        assert_eq!(headers.take_any_case("traceparent").as_deref(), Some("first"));
        assert_eq!(headers.iter().collect::<Vec<_>>(), [("a", "1")]);
        assert_eq!(headers.take_any_case("traceparent"), None);
    }

    #[test]
    fn an_empty_value_is_kept() {
        let mut headers = Headers::default();
        headers.insert("Empty", "");
        assert_eq!(headers.get("Empty"), Some(""));
        assert_eq!(headers.len(), 1);
    }

    /// Headers behave as an ordered list in which setting a name again moves it to the end
    /// with its new value, and their lines are exactly that list rendered.
    #[test]
    fn headers_match_a_list_model_under_any_inserts_and_takes() {
        use proptest::prelude::*;
        let name =
            proptest::sample::select(vec!["a", "A", "ab", "Nats-Msg-Id", "b", "traceparent"]);
        let value = "[ -~]{0,12}";
        let op = prop_oneof![
            4 => (name.clone(), value).prop_map(|(n, v)| (true, n, v)),
            1 => name.prop_map(|n| (false, n, String::new())),
        ];
        proptest!(|(ops in proptest::collection::vec(op, 0..24))| {
            let mut headers = Headers::default();
            let mut model: Vec<(String, String)> = Vec::new();
            for (insert, name, value) in ops {
                if insert {
                    headers.insert(name, &value);
                    model.retain(|(n, _)| n != name);
                    model.push((name.to_owned(), value));
                } else {
                    let first = model.iter().find(|(n, _)| n.eq_ignore_ascii_case(name));
                    let expected = first.map(|(_, v)| v.clone());
                    prop_assert_eq!(headers.take_any_case(name), expected);
                    model.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
                }
                let listed: Vec<(String, String)> =
                    headers.iter().map(|(n, v)| (n.to_owned(), v.to_owned())).collect();
                prop_assert_eq!(&listed, &model);
                let rendered: String = model.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
                prop_assert_eq!(headers.lines(), rendered.as_str());
                prop_assert_eq!(headers.len(), model.len());
                for (n, v) in &model {
                    prop_assert_eq!(headers.get(n), Some(v.as_str()));
                }
            }
        });
    }

    #[test]
    fn names_and_values_are_checked_as_nats_checks_them() {
        assert!(valid_name("Outbox-Event-Type") && valid_name("x.y_z"));
        for bad in ["", "a b", "a:b", "ä", "a\tb"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_value("") && valid_value("a: b\tc"));
        assert!(!valid_value("a\rb") && !valid_value("a\nb"));
    }
}
