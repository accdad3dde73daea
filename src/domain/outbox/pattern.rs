//! A table named by a pattern: `tenant_*.outbox` is the table `outbox` of every schema
//! whose name starts with `tenant_`, those there now and those created later
//! (schema-per-tenant). `*` stands for any run of characters, empty included, in either
//! part; a part without `*` is matched exactly, as PostgreSQL spells the name (case
//! included: `Tenant_*` does not match `tenant_1`).
//!
//! The catalog is asked with `LIKE` ([`TablePattern::like_clauses`]), where `_` and `%`
//! are wildcards of their own: a table name holds `_` more often than not, so each `_`,
//! `%` and `\` of the pattern is escaped, and `tenant_*` never matches `tenantX1`.
//! [`TablePattern::matches`] is the same test without SQL, for a Relation pgoutput sends.

use std::fmt;
use std::str::FromStr;

use super::TableName;

/// `schema.table`, either part holding `*`; a bare `table` is in `public`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TablePattern {
    schema: String,
    name: String,
}

/// A `--table` value that is not a table pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid table pattern {0:?}: expected schema.table, where either part may hold *")]
pub struct InvalidPattern(String);

impl FromStr for TablePattern {
    type Err = InvalidPattern;

    fn from_str(s: &str) -> Result<Self, InvalidPattern> {
        let (schema, name) = s.split_once('.').unwrap_or(("public", s));
        if schema.is_empty() || name.is_empty() || name.contains('.') {
            return Err(InvalidPattern(s.to_owned()));
        }
        Ok(TablePattern { schema: schema.to_owned(), name: name.to_owned() })
    }
}

impl fmt::Display for TablePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

impl TablePattern {
    /// Whether the pattern names one table only (no `*`).
    pub fn is_exact(&self) -> bool {
        !self.schema.contains('*') && !self.name.contains('*')
    }

    /// The pattern's text as a [`TableName`]: the entry's name in logs and errors until a
    /// table matches.
    pub fn as_table_name(&self) -> TableName {
        TableName { schema: self.schema.clone(), name: self.name.clone() }
    }

    /// Whether the table `schema.name` is one the pattern names.
    pub fn matches(&self, schema: &str, name: &str) -> bool {
        glob(&self.schema, schema) && glob(&self.name, name)
    }

    /// The `LIKE` patterns of the schema and the table name (escape character `\`, the
    /// default): `_`, `%` and `\` escaped, each `*` a `%`. Quote them as literals.
    pub fn like_clauses(&self) -> (String, String) {
        (like(&self.schema), like(&self.name))
    }
}

fn like(part: &str) -> String {
    let mut out = String::with_capacity(part.len() + 4);
    for c in part.chars() {
        match c {
            '*' => out.push('%'),
            '_' | '%' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// `*` matches any run of characters; everything else itself. Greedy with one backtrack
/// point: linear in practice, quadratic at worst, for names of at most 63 bytes.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < t.len() {
        if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == t[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pattern(s: &str) -> TablePattern {
        s.parse().unwrap()
    }

    #[test]
    fn an_underscore_is_a_character_not_a_wildcard() {
        let p = pattern("tenant_*.outbox");
        assert!(p.matches("tenant_1", "outbox"));
        assert!(p.matches("tenant_", "outbox"), "* may be empty");
        assert!(!p.matches("tenantX1", "outbox"));
        assert!(!p.matches("tenant_1", "outbox_replay"));
        assert!(!p.matches("Tenant_1", "outbox"), "names are matched as spelled");
        assert_eq!(p.like_clauses(), ("tenant\\_%".to_owned(), "outbox".to_owned()));
        assert!(!p.is_exact() && pattern("app.outbox").is_exact());
    }

    #[test]
    fn either_part_may_hold_stars_and_a_bare_name_is_in_public() {
        assert!(pattern("app.*_outbox").matches("app", "orders_outbox"));
        assert!(!pattern("app.*_outbox").matches("app2", "orders_outbox"));
        assert!(pattern("*.outbox").matches("anything", "outbox"));
        assert!(pattern("t*_*.o*x").matches("t1_2", "outbox"));
        assert_eq!(pattern("outbox*").to_string(), "public.outbox*");
        assert!(pattern("a%b\\c.x").like_clauses().0 == "a\\%b\\\\c");
        for bad in ["", ".x", "x.", "a.b.c"] {
            assert!(bad.parse::<TablePattern>().is_err(), "{bad:?}");
        }
    }

    /// Reads a `LIKE` pattern back into the pattern text it came from; `None` when it
    /// holds an unescaped `_` (which would match any character).
    fn unlike(like: &str) -> Option<String> {
        let mut out = String::new();
        let mut chars = like.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.push(chars.next()?),
                '%' => out.push('*'),
                '_' => return None,
                c => out.push(c),
            }
        }
        Some(out)
    }

    proptest! {
        /// Every name made by filling the stars matches, and the `LIKE` clauses say the
        /// same as the pattern: read back, they give its text, with no bare `_`.
        #[test]
        fn filled_patterns_match_and_like_clauses_say_the_same(
            parts in prop::collection::vec("[a-z_%\\\\]{0,4}", 1..4),
            fills in prop::collection::vec("[a-zA-Z0-9_%\\\\*]{0,5}", 3),
            schema in "[a-z_]{1,6}",
        ) {
            let name_pattern = parts.join("*");
            prop_assume!(!name_pattern.is_empty());
            let p = TablePattern { schema: schema.clone(), name: name_pattern.clone() };
            let filled: String = parts
                .iter()
                .enumerate()
                .map(|(k, part)| match k {
                    0 => part.clone(),
                    k => format!("{}{part}", fills[(k - 1) % fills.len()]),
                })
                .collect();
            prop_assert!(p.matches(&schema, &filled), "{p} vs {filled}");
            let (like_schema, like_name) = p.like_clauses();
            prop_assert_eq!(unlike(&like_schema), Some(schema));
            prop_assert_eq!(unlike(&like_name), Some(name_pattern));
        }

        /// Without a star, a pattern matches its own name and nothing else.
        #[test]
        fn an_exact_pattern_matches_only_itself(a in "[a-z_]{1,5}", b in "[a-z_]{1,5}") {
            let p = TablePattern { schema: "s".into(), name: a.clone() };
            prop_assert!(p.is_exact());
            prop_assert_eq!(p.matches("s", &b), a == b);
        }
    }
}
