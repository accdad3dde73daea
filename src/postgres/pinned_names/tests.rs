use std::path::{Path, PathBuf};

use super::*;

#[test]
fn the_pin_comes_last_so_that_no_option_of_the_operator_overrides_it() {
    assert_eq!(startup_options(None), "-c search_path=pg_catalog,pg_temp");
    assert_eq!(startup_options(Some("  ")), "-c search_path=pg_catalog,pg_temp");
    assert_eq!(
        startup_options(Some("-c search_path=app -c statement_timeout=0")),
        "-c search_path=app -c statement_timeout=0 -c search_path=pg_catalog,pg_temp"
    );
}

#[test]
fn a_tokio_postgres_config_keeps_everything_else() {
    let config: tokio_postgres::Config =
        "host=db user=relay options='-c work_mem=64MB'".parse().unwrap();
    let pinned = pinned(&config);
    assert_eq!(pinned.get_options(), Some("-c work_mem=64MB -c search_path=pg_catalog,pg_temp"));
    assert_eq!(pinned.get_user(), Some("relay"));
}

/// Every function, type and system catalog pgoutbox names in SQL is named with its schema,
/// `pg_catalog.`, so that none of them hangs on the pinned `search_path` alone (operators
/// are left to it: docs/security.md). The check reads every string literal under `src/`
/// (`\`-continued lines joined) that holds SQL: an upper-case word of [`SQL_WORDS`], or a
/// `::` cast. In one, it names, as `file:line: name`:
///
/// - a call `name(` not after a `.`, but for the grammar of [`GRAMMAR`] (so a function is
///   called with no space before its parenthesis, and an alias's column list is written
///   `AS u (i, f)`);
/// - a cast `::type` that is not `::pg_catalog.type`; keyword types too (`bigint` is
///   written `pg_catalog.int8`, which it stands for);
/// - a bare `pg_…` name (a catalog relation, a type) not after `.` or `'` (a string),
///   but `pg_catalog` and `pg_temp` themselves.
///
/// A `::` after a CamelCase word (`Option::is_none`) is a Rust path, not a cast. Left out:
/// files named `tests.rs`, and a file's `#[cfg(test)]` module (clippy keeps it last in its
/// file): their SQL is a test's, not what pgoutbox sends.
#[test]
fn every_function_and_type_in_pgoutbox_sql_is_qualified() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut findings, mut sql) = (Vec::new(), 0);
    for path in rust_files(&root.join("src")) {
        let source = std::fs::read_to_string(&path).unwrap();
        let source = source.split("\n#[cfg(test)]\nmod ").next().unwrap_or_default();
        let file = path.strip_prefix(root).unwrap().display();
        for names in string_literals(source).iter().filter_map(|literal| unqualified(literal)) {
            sql += 1;
            findings.extend(names.into_iter().map(|(line, name)| format!("{file}:{line}: {name}")));
        }
    }
    assert!(sql > 50, "only {sql} literals of SQL found under src/: the check reads nothing");
    assert!(
        findings.is_empty(),
        "{} names in pgoutbox's SQL are not qualified with pg_catalog.:\n{}",
        findings.len(),
        findings.join("\n")
    );
}

#[test]
fn the_check_names_calls_casts_and_catalogs_but_not_grammar_strings_or_comments() {
    let source = r#"
        // "SELECT now()" in a comment is no literal.
        const SQL: &str = "SELECT string_agg(a.attname::text, ',') FROM pg_attribute a, \
            pg_catalog.pg_class c WHERE c.oid = to_regclass($1) AND c.relname <> 'pg_class' \
            AND EXISTS (SELECT coalesce(pg_catalog.now()::pg_catalog.text, ''))";
        const MESSAGE: &str = "3 line(s) on stderr, Option::is_none";
    "#;
    let names: Vec<_> =
        string_literals(source).iter().filter_map(|literal| unqualified(literal)).collect();
    let expected = [(3, "string_agg("), (3, "::text"), (3, "pg_attribute"), (4, "to_regclass(")];
    let expected: Vec<_> = expected.map(|(line, name)| (line, name.to_owned())).into();
    assert_eq!(names, [expected]);
}

/// Words that make a string literal SQL (besides a `::` cast).
const SQL_WORDS: &str = "SELECT FROM WHERE JOIN INSERT UPDATE DELETE CREATE ALTER DROP DECLARE \
    FETCH LOCK SET DEFAULT NULL CASE EXISTS RETURNING";

/// SQL grammar written like a call, which no schema can qualify (the parser itself maps
/// it to `pg_catalog`'s functions, if to any).
const GRAMMAR: &str = "all any array cast coalesce conflict exists extract greatest in least \
    nullif row values";

/// The `.rs` files under `dir`, in name order, but those named `tests.rs`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension() == Some("rs".as_ref()) && !path.ends_with("tests.rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The string literals of Rust `source`, each character with its line; comments and
/// character literals are skipped, and a `\` at a line's end joins the next line.
fn string_literals(source: &str) -> Vec<Vec<(char, usize)>> {
    let chars: Vec<char> = source.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let (mut literals, mut line, mut i) = (Vec::new(), 1, 0);
    while i < chars.len() {
        let raw_hashes = (at(i) == 'r'
            && (i == 0 || !is_ident(chars[i - 1]) || chars[i - 1] == 'b'))
            .then(|| chars[i + 1..].iter().take_while(|&&c| c == '#').count())
            .filter(|&hashes| at(i + 1 + hashes) == '"');
        if at(i) == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if at(i) == '/' && at(i + 1) == '*' {
            while i < chars.len() && !(chars[i] == '*' && at(i + 1) == '/') {
                line += usize::from(chars[i] == '\n');
                i += 1;
            }
            i += 2;
        } else if at(i) == '\'' {
            // A character literal ('x', '\n', '\''), or a lifetime.
            i += match (at(i + 1), at(i + 2)) {
                ('\\', _) => 3 + chars[i + 3..].iter().position(|&c| c == '\'').unwrap_or(0) + 1,
                (_, '\'') => 3,
                _ => 1,
            };
        } else if let Some(hashes) = raw_hashes {
            let end: Vec<char> = std::iter::once('"').chain("#".repeat(hashes).chars()).collect();
            let mut literal = Vec::new();
            i += hashes + 2;
            while i < chars.len() && !chars[i..].starts_with(&end) {
                literal.push((chars[i], line));
                line += usize::from(chars[i] == '\n');
                i += 1;
            }
            i += end.len();
            literals.push(literal);
        } else if at(i) == '"' {
            let mut literal = Vec::new();
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' && at(i + 1) == '\n' {
                    i += 1;
                    while at(i).is_whitespace() {
                        line += usize::from(chars[i] == '\n');
                        i += 1;
                    }
                    continue;
                }
                if chars[i] == '\\' {
                    i += 1;
                }
                literal.push((chars[i], line));
                line += usize::from(chars[i] == '\n');
                i += 1;
            }
            i += 1;
            literals.push(literal);
        } else {
            line += usize::from(chars[i] == '\n');
            i += 1;
        }
    }
    literals
}

/// The names `literal` leaves unqualified (see the check), with their lines; `None` when
/// it is not SQL.
fn unqualified(literal: &[(char, usize)]) -> Option<Vec<(usize, String)>> {
    let text: Vec<char> = literal.iter().map(|&(c, _)| c).collect();
    let at = |i: usize| text.get(i).copied().unwrap_or(' ');
    let word_end = |from: usize| from + text[from..].iter().take_while(|&&c| is_ident(c)).count();
    let (mut found, mut sql, mut i) = (Vec::new(), false, 0);
    while i < text.len() {
        let before = if i == 0 { ' ' } else { text[i - 1] };
        if (text[i].is_ascii_alphabetic() || text[i] == '_') && !is_ident(before) {
            let end = word_end(i);
            let word: String = text[i..end].iter().collect();
            sql |= SQL_WORDS.split_whitespace().any(|w| w == word);
            let camel_case = word.starts_with(|c: char| c.is_ascii_uppercase())
                && word.contains(|c: char| c.is_ascii_lowercase());
            if at(end) == ':' && at(end + 1) == ':' && camel_case {
                i = end + 2; // a Rust path
                continue;
            }
            let grammar = GRAMMAR.split_whitespace().any(|w| w.eq_ignore_ascii_case(&word));
            let call = at(end) == '(' && !grammar;
            if call && before != '.' {
                found.push((i, format!("{word}(")));
            }
            let catalog = word.starts_with("pg_") && !["pg_catalog", "pg_temp"].contains(&&*word);
            if catalog && !matches!(before, '.' | '\'') && !matches!(at(end), '.' | '(') {
                found.push((i, word));
            }
            i = end;
        } else if text[i] == ':' && at(i + 1) == ':' {
            sql = true;
            let start = i + 2 + text[i + 2..].iter().take_while(|&&c| c == ' ').count();
            let end = word_end(start);
            let ty: String = text[start..end].iter().collect();
            if !(ty == "pg_catalog" && at(end) == '.') {
                found.push((i, format!("::{ty}")));
            }
            i = end;
        } else {
            i += 1;
        }
    }
    sql.then(|| found.into_iter().map(|(i, name)| (literal[i].1, name)).collect())
}
