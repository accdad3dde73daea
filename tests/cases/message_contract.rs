//! docs/reference/message.md is the consumer's contract: every header pgoutbox sets is
//! named there. No servers: the names are read from the source, the way a reader of the
//! code would find them, and a header the code names and the reference does not fails here.
//!
//! What counts as a header pgoutbox sets: every `Pgoutbox-…` name in a string literal under
//! `src/` (constants, error messages, tests), and the value of every `…_HEADER` string
//! constant (its `Nats-…` headers: the id, the guard, TTLs and schedules). The reference
//! must name each in backquotes, whole: `` `Pgoutbox-Seed` `` is not named by
//! `` `Pgoutbox-Seed-Since` ``.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const REFERENCE: &str = "docs/reference/message.md";

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The contents of `code`'s string literals (plain and raw, escapes left as written),
/// comments and char literals passed over.
fn string_literals(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut literals = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match (chars[i], chars.get(i + 1).copied()) {
            ('/', Some('/')) => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ('/', Some('*')) => {
                i += 2;
                while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            }
            ('\'', Some('\\')) => {
                // An escaped char literal: up to its closing quote.
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            }
            ('\'', _) if chars.get(i + 2) == Some(&'\'') => i += 3,
            ('r', Some('"' | '#')) if i == 0 || !is_ident(chars[i - 1]) => {
                let mut j = i + 1;
                let mut hashes = 0;
                while chars.get(j) == Some(&'#') {
                    hashes += 1;
                    j += 1;
                }
                if chars.get(j) != Some(&'"') {
                    i += 1;
                    continue;
                }
                let start = j + 1;
                let closes = |k: usize| {
                    chars[k] == '"' && (1..=hashes).all(|h| chars.get(k + h) == Some(&'#'))
                };
                let mut k = start;
                while k < chars.len() && !closes(k) {
                    k += 1;
                }
                literals.push(chars[start..k.min(chars.len())].iter().collect());
                i = k + 1 + hashes;
            }
            ('"', _) => {
                let start = i + 1;
                let mut k = start;
                while k < chars.len() && chars[k] != '"' {
                    k += if chars[k] == '\\' { 2 } else { 1 };
                }
                literals.push(chars[start..k.min(chars.len())].iter().collect());
                i = k + 1;
            }
            _ => i += 1,
        }
    }
    literals
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The `Pgoutbox-…` header names in `text`.
fn pgoutbox_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("Pgoutbox-") {
        let tail = &rest[at + "Pgoutbox-".len()..];
        let len =
            tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).unwrap_or(tail.len());
        let name = tail[..len].trim_end_matches('-');
        if name.starts_with(|c: char| c.is_ascii_uppercase()) {
            names.push(format!("Pgoutbox-{name}"));
        }
        rest = &tail[len..];
    }
    names
}

/// The values of `const …_HEADER: &str = "…";` in `code`.
fn header_constants(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(": &str = \"")?;
            left.trim_end().ends_with("_HEADER").then_some(())?;
            Some(right.split_once('"')?.0.to_owned())
        })
        .collect()
}

/// Every header name the source sets or reads, by the rule above, with a file naming it.
fn headers_in_source() -> BTreeSet<(String, String)> {
    let root = Path::new(ROOT);
    let mut found = BTreeSet::new();
    for file in rust_files(&root.join("src")) {
        let code = std::fs::read_to_string(&file).expect("a readable source file");
        let shown = file.strip_prefix(root).unwrap_or(&file).display().to_string();
        let literals = string_literals(&code);
        let names = literals.iter().flat_map(|l| pgoutbox_names(l)).chain(header_constants(&code));
        found.extend(names.map(|name| (name, shown.clone())));
    }
    found
}

#[test]
fn the_message_reference_names_every_header_the_code_sets() {
    let reference =
        std::fs::read_to_string(Path::new(ROOT).join(REFERENCE)).expect("the message reference");
    let found = headers_in_source();
    let names: BTreeSet<&str> = found.iter().map(|(name, _)| name.as_str()).collect();
    // The reader works: the headers every consumer meets are among what it finds.
    for known in ["Pgoutbox-Position", "Pgoutbox-Transaction-Rows", "Pgoutbox-Seed", "Nats-Msg-Id"]
    {
        assert!(names.contains(known), "{known} not found in src/: the reader is broken");
    }
    let missing: Vec<String> = found
        .iter()
        .filter(|(name, _)| !reference.contains(&format!("`{name}`")))
        .map(|(name, file)| format!("{name} ({file})"))
        .collect();
    assert!(
        missing.is_empty(),
        "{REFERENCE} does not name these headers the code sets (name each in backquotes, \
         with the messages that carry it and what it means): {}",
        missing.join(", ")
    );
}

#[test]
fn string_literals_are_read_past_comments_and_chars() {
    let code = r####"// "Pgoutbox-Comment"
        let quote = '"'; let a = "Pgoutbox-One: \"x\""; /* "Pgoutbox-Block" */
        let raw = r#"Pgoutbox-Two "quoted""#; let life: &'static str = "Pgoutbox-Three";"####;
    let names: Vec<String> = string_literals(code).iter().flat_map(|l| pgoutbox_names(l)).collect();
    assert_eq!(names, ["Pgoutbox-One", "Pgoutbox-Two", "Pgoutbox-Three"]);
    let constants = header_constants(
        "pub const SEED_HEADER: &str = \"Pgoutbox-Seed\";\n\
        const PIN: &str = \"-c x\";",
    );
    assert_eq!(constants, ["Pgoutbox-Seed"]);
}
