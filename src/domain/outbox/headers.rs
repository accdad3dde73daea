//! A message's headers, kept as the lines they are sent as (`Name: value\r\n` each), so that
//! framing a message copies them in one go. async-nats's `HeaderMap` (a hash map of
//! allocated names and values, rehashed twice for our eight headers) was 15 % of pgoutbox's
//! CPU at full drain. Names compare case-sensitively, as NATS and `HeaderMap` compare them.

/// Headers in the order they were first set; setting a name again replaces its value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    lines: String,
}

impl Headers {
    pub fn with_capacity(bytes: usize) -> Self {
        Headers { lines: String::with_capacity(bytes) }
    }

    /// Sets `name` to `value`. The caller has checked both ([`valid_name`],
    /// [`valid_value`]): a line break here would end the header block early.
    pub fn insert(&mut self, name: &str, value: &str) {
        debug_assert!(valid_name(name) && valid_value(value), "{name:?}: {value:?}");
        if self.get(name).is_some() {
            self.remove(name);
        }
        self.lines.reserve(name.len() + value.len() + 4);
        self.lines.push_str(name);
        self.lines.push_str(": ");
        self.lines.push_str(value);
        self.lines.push_str("\r\n");
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(n, _)| *n == name).map(|(_, value)| value)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        // By single characters (memchr), not by `"\r\n"` and `": "`: a substring search
        // per line was a fifth of pgoutbox's CPU. A name holds no `:`, a value no `\r`.
        let mut rest = self.lines.as_str();
        std::iter::from_fn(move || {
            let end = rest.find('\r')?;
            let line = &rest[..end];
            rest = rest.get(end + 2..).unwrap_or_default();
            let colon = line.find(':')?;
            Some((&line[..colon], line.get(colon + 2..).unwrap_or_default()))
        })
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
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
        let mut kept = String::with_capacity(self.lines.len());
        for (n, value) in self.iter().filter(|(n, _)| !matches(n)) {
            kept.push_str(n);
            kept.push_str(": ");
            kept.push_str(value);
            kept.push_str("\r\n");
        }
        self.lines = kept;
    }
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
