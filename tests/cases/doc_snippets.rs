//! Every snippet of the README and the docs runs as written, so a doc that drifts from the
//! code fails here. Each document's fenced blocks run in order, against throwaway servers of
//! its own, in a temporary working directory holding `sql/`:
//!
//! - ` ```sh `: `bash -euo pipefail -c`, with `DATABASE_URL`/`PGOUTBOX_DATABASE_URL` and
//!   `NATS_URL`/`PGOUTBOX_NATS_URL` set to the servers and this build's `pgoutbox` first on
//!   `PATH`;
//! - ` ```sql `: psql with `ON_ERROR_STOP`;
//! - ` ```toml `: written to `pgoutbox.toml` and checked by `pgoutbox setup --config`.
//!
//! A block preceded by `<!-- not run: <reason> -->` is skipped (the reason is required); one
//! preceded by `<!-- in the background: <reason> -->` (a `pgoutbox run`) is started, waited
//! for until it streams, and stopped at the next such block or the document's end. Other
//! languages (`text`, `python`, `rust`, ...) are read, never run.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::pgoutbox::Pgoutbox;
use crate::support::{Nats, Postgres, free_port, pg_bin, wait_until_streaming};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// What to do with a block.
#[derive(Debug, PartialEq)]
enum Mode {
    Run,
    Skip(String),
    Background,
}

/// One fenced block: where it starts (1-based line of its opening fence), its language, text.
#[derive(Debug)]
struct Block {
    line: usize,
    lang: String,
    code: String,
    mode: Mode,
}

/// The fenced blocks of `text`, each with the marker comment on the line before its fence.
fn blocks(file: &str, text: &str) -> Vec<Block> {
    parse(file, text).unwrap_or_else(|err| panic!("{err}"))
}

/// [`blocks`], or what is wrong with a marker.
fn parse(file: &str, text: &str) -> Result<Vec<Block>, String> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    let mut marker: Option<(usize, Mode)> = None;
    while let Some((i, line)) = lines.next() {
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("<!--") {
            let inner = rest.trim_end_matches("-->").trim();
            let mode = if let Some(reason) = inner.strip_prefix("not run:") {
                if reason.trim().is_empty() {
                    return Err(format!("{file}:{}: `not run` needs a reason", i + 1));
                }
                Some(Mode::Skip(reason.trim().to_owned()))
            } else if let Some(reason) = inner.strip_prefix("in the background:") {
                if reason.trim().is_empty() {
                    return Err(format!("{file}:{}: `in the background` needs a reason", i + 1));
                }
                Some(Mode::Background)
            } else {
                None
            };
            marker = mode.map(|m| (i, m));
            continue;
        }
        let Some(lang) = trimmed.strip_prefix("```") else {
            if !trimmed.is_empty() && marker.is_some() {
                return Err(format!("{file}:{i}: a marker not followed by a block"));
            }
            continue;
        };
        let mut code = String::new();
        for (_, body) in lines.by_ref() {
            if body.trim() == "```" {
                break;
            }
            code.push_str(body);
            code.push('\n');
        }
        let mode = marker.take().map_or(Mode::Run, |(_, m)| m);
        out.push(Block { line: i + 1, lang: lang.trim().to_owned(), code, mode });
    }
    match marker {
        Some((i, _)) => Err(format!("{file}:{}: a marker before no block", i + 1)),
        None => Ok(out),
    }
}

/// The servers and the directory one document's blocks run in.
struct Sandbox {
    pg: Postgres,
    nats: Nats,
    dir: tempfile::TempDir,
    http_addr: String,
    background: Option<Pgoutbox>,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().expect("a working directory");
        std::os::unix::fs::symlink(Path::new(ROOT).join("sql"), dir.path().join("sql"))
            .expect("link sql/");
        let http_addr = format!("127.0.0.1:{}", free_port());
        Sandbox { pg: Postgres::start(), nats: Nats::start(), dir, http_addr, background: None }
    }

    /// A command with the servers' variables, `pgoutbox` and `psql` first on PATH, and no
    /// PG*, PGOUTBOX_* or OTEL_* variable of the caller's.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        for (key, _) in std::env::vars() {
            if key.starts_with("PG") || key.starts_with("OTEL_") || key == "DATABASE_URL" {
                cmd.env_remove(key);
            }
        }
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_pgoutbox"));
        let psql = &pg_bin::server().psql;
        let mut path = vec![bin.parent().expect("bin dir").to_owned()];
        path.extend(psql.parent().map(Path::to_owned));
        path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
        cmd.env("PATH", std::env::join_paths(path).expect("PATH"))
            .env("DATABASE_URL", self.pg.url())
            .env("PGOUTBOX_DATABASE_URL", self.pg.url())
            .env("NATS_URL", self.nats.url())
            .env("PGOUTBOX_NATS_URL", self.nats.url())
            .env("PGOUTBOX_HTTP_ADDR", &self.http_addr)
            .env("RUST_LOG", "info")
            .current_dir(self.dir.path());
        cmd
    }

    /// Runs one block; the error names the file, the line and the output.
    async fn run(&mut self, file: &str, block: &Block) -> Result<(), String> {
        let mut cmd = match block.lang.as_str() {
            "sh" if block.mode == Mode::Background => return self.start(file, block).await,
            "sh" => {
                let mut cmd = self.command("bash");
                cmd.args(["-euo", "pipefail", "-c", &block.code]);
                cmd
            }
            "sql" => {
                let path = self.dir.path().join("snippet.sql");
                std::fs::write(&path, &block.code).expect("write the SQL");
                let mut cmd = self.command("psql");
                cmd.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &self.pg.url(), "-f"]);
                cmd.arg(&path);
                cmd
            }
            "toml" => {
                std::fs::write(self.dir.path().join("pgoutbox.toml"), &block.code)
                    .expect("write the config file");
                let mut cmd = self.command(env!("CARGO_BIN_EXE_pgoutbox"));
                cmd.args(["setup", "--config", "pgoutbox.toml"]);
                cmd
            }
            _ => return Ok(()),
        };
        let out = cmd.output().expect("run the block");
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "{file}:{}: the ```{} block failed ({}):\n{}\n--- stdout ---\n{}--- stderr ---\n{}",
            block.line,
            block.lang,
            out.status,
            block.code,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        ))
    }

    /// Starts a background block (one command, exec'd so that it is the process stopped)
    /// after stopping the one before, and waits until it streams.
    async fn start(&mut self, file: &str, block: &Block) -> Result<(), String> {
        self.stop_background();
        let command = block.code.trim();
        if command.contains('\n') {
            return Err(format!("{file}:{}: a background block is one command", block.line));
        }
        let mut cmd = self.command("bash");
        cmd.args(["-c", &format!("exec {command}")]);
        let app = Pgoutbox::spawn(cmd);
        wait_until_streaming(&self.pg, &app).await;
        self.background = Some(app);
        Ok(())
    }

    fn stop_background(&mut self) {
        if let Some(mut app) = self.background.take() {
            app.sigterm();
            app.wait_exit(std::time::Duration::from_secs(30));
        }
    }
}

/// Reads `path` (relative to the repository) and runs its blocks on fresh servers.
async fn run_doc(path: &str) -> Tally {
    let text = std::fs::read_to_string(Path::new(ROOT).join(path)).expect("read the doc");
    let blocks = blocks(path, &text);
    // No servers for a document with nothing to run.
    if !blocks.iter().any(|b| is_run(&b.lang) && !matches!(b.mode, Mode::Skip(_))) {
        let skipped = blocks.iter().filter(|b| is_run(&b.lang)).count();
        eprintln!("{path}: 0 blocks run, {skipped} not run");
        return Tally { run: 0, skipped };
    }
    run_blocks(path, &blocks, Sandbox::new()).await
}

/// The languages whose blocks run.
fn is_run(lang: &str) -> bool {
    matches!(lang, "sh" | "sql" | "toml")
}

#[derive(Default)]
struct Tally {
    run: usize,
    skipped: usize,
}

async fn run_blocks(file: &str, blocks: &[Block], mut sandbox: Sandbox) -> Tally {
    let mut tally = Tally::default();
    for block in blocks.iter().filter(|b| is_run(&b.lang)) {
        if let Mode::Skip(reason) = &block.mode {
            eprintln!("{file}:{}: not run: {reason}", block.line);
            tally.skipped += 1;
            continue;
        }
        if let Err(failure) = sandbox.run(file, block).await {
            let log = sandbox.background.as_ref().map(Pgoutbox::log).unwrap_or_default();
            panic!("{failure}\n--- the background pgoutbox's log ---\n{log}");
        }
        tally.run += 1;
    }
    sandbox.stop_background();
    eprintln!("{file}: {} blocks run, {} not run", tally.run, tally.skipped);
    tally
}

/// The markdown files of `dir` (relative to the repository), sorted.
fn docs_in(dir: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(Path::new(ROOT).join(dir))
        .expect("read the docs directory")
        .map(|e| e.expect("a directory entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("{dir}/{name}"))
        .collect();
    files.sort();
    files
}

#[test]
fn the_readme_s_first_screen_has_both_commands() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let first_screen: Vec<&str> = readme.lines().take(45).collect();
    for command in ["scripts/first-look.sh", "scripts/test.sh"] {
        assert!(first_screen.contains(&command), "{command} in the README's first screen");
    }
}

#[tokio::test]
async fn the_readme_runs_as_written() {
    let tally = run_doc("README.md").await;
    assert!(tally.run >= 6, "the README's blocks run: {}", tally.run);
}

/// The README's two-table recipe on a database pgoutbox never saw (the README itself runs
/// it where pgoutbox already streams): the section's blocks after the outbox table alone.
#[tokio::test]
async fn the_readme_s_two_tables_run_on_a_fresh_database() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let start = text.find("\n## Two modules' tables").expect("the section");
    let end = start + 1 + text[start + 1..].find("\n## ").expect("the next section");
    let offset = text[..start].lines().count();
    let mut section = blocks("README.md", &text[start..end]);
    section.iter_mut().for_each(|b| b.line += offset);
    assert!(section.len() >= 2, "the recipe's blocks");
    let sandbox = Sandbox::new();
    sandbox.pg.psql(include_str!("../../sql/outbox.sql"));
    run_blocks("README.md", &section, sandbox).await;
}

#[tokio::test]
async fn the_tutorial_runs_as_written() {
    run_doc("docs/tutorial.md").await;
}

/// The consumer's contract shows Rust: each block is code of one of `examples/consumer/`'s
/// files, line for line, which CI compiles and runs against real servers (`example_consumer`).
#[test]
fn the_consumer_contract_s_rust_is_the_example_s_running_code() {
    let read = |path: &Path| std::fs::read_to_string(path).expect("a readable file");
    let lines = |text: &str| text.lines().map(str::trim).collect::<Vec<_>>().join("\n");
    let dir = Path::new(ROOT).join("examples/consumer");
    let files = std::fs::read_dir(&dir).expect("examples/consumer/");
    let example: Vec<String> =
        files.map(|file| lines(&read(&file.expect("a file").path()))).collect();
    let doc = "docs/how-to/consume.md";
    let text = read(&Path::new(ROOT).join(doc));
    let rust: Vec<Block> = blocks(doc, &text).into_iter().filter(|b| b.lang == "rust").collect();
    assert!(!rust.is_empty(), "{doc} shows no Rust");
    for block in rust {
        let code = lines(&block.code);
        let found = example.iter().any(|file| file.contains(code.trim()));
        assert!(found, "{doc}:{}: in no file of examples/consumer/", block.line);
    }
}

#[tokio::test]
async fn the_how_to_guides_run_as_written() {
    for doc in docs_in("docs/how-to") {
        run_doc(&doc).await;
    }
}

#[tokio::test]
async fn the_reference_runs_as_written() {
    for doc in docs_in("docs/reference") {
        run_doc(&doc).await;
    }
}

/// The explanations and the runbooks (docs/runbooks/). Not docs/configuration.md (generated
/// from `--help`) nor the tutorial, which runs on its own above.
#[tokio::test]
async fn the_explanations_and_runbooks_run_as_written() {
    let skip = ["docs/configuration.md", "docs/tutorial.md"];
    let docs = docs_in("docs").into_iter().chain(docs_in("docs/runbooks"));
    for doc in docs.filter(|d| !skip.contains(&d.as_str())) {
        run_doc(&doc).await;
    }
}

/// The longest line of prose a reader is asked to read (a table's row is one line).
const LONGEST_LINE: usize = 400;

/// Every markdown file under `dir` (relative to the repository), recursively, sorted.
fn markdown_under(dir: &str) -> Vec<String> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(Path::new(ROOT).join(&dir)).expect("read a directory") {
            let entry = entry.expect("a directory entry");
            let path = format!("{dir}/{}", entry.file_name().to_string_lossy());
            if entry.file_type().expect("a file type").is_dir() {
                dirs.push(path);
            } else if path.ends_with(".md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The lines of a markdown text outside its fenced blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The anchor GitHub gives a heading: lowercase, every character but letters, digits, spaces,
/// `-` and `_` dropped, spaces made `-`.
fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown text's headings; a repeated one also as `-1`, `-2`, ... .
fn anchors(text: &str) -> Vec<String> {
    let mut bases: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let anchor = github_anchor(&line[hashes..]);
        let seen = bases.iter().filter(|a| **a == anchor).count();
        out.push(if seen == 0 { anchor.clone() } else { format!("{anchor}-{seen}") });
        bases.push(anchor);
    }
    out
}

/// Whether `target` (`path` or `path#anchor`, the path relative to the repository) names a
/// file that exists and, in a markdown file, a heading it has.
fn resolve(target: &str) -> Result<(), String> {
    let (path, anchor) = target.split_once('#').map_or((target, None), |(p, a)| (p, Some(a)));
    let file = Path::new(ROOT).join(path);
    if !file.exists() {
        return Err(format!("{target}: no such file"));
    }
    match anchor {
        Some(anchor) if path.ends_with(".md") => {
            let text = std::fs::read_to_string(&file).expect("read a markdown file");
            if anchors(&text).iter().any(|a| a == anchor) {
                Ok(())
            } else {
                Err(format!("{target}: no such heading in {path}"))
            }
        }
        _ => Ok(()),
    }
}

/// `dir/target` with `.` and `..` folded, as a path relative to the repository.
fn joined(dir: &str, target: &str) -> String {
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in target.split('/') {
        match part {
            "." | "" => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

/// The local targets of a markdown line's links (`[text](target)`), outside code spans.
fn link_targets(line: &str) -> Vec<String> {
    let mut prose = String::new();
    for (i, part) in line.split('`').enumerate() {
        prose.push_str(if i % 2 == 0 { part } else { "code" });
    }
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        let external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !external {
            out.push(target.to_owned());
        }
        rest = &rest[end..];
    }
    out
}

/// The `docs/….md` and `docs/….md#anchor` a source text names (in a string or a comment).
fn doc_references(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("docs/") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| {
                !(c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '-' | '_' | '#'))
            })
            .unwrap_or(tail.len());
        let reference = tail[..len].trim_end_matches('.');
        if reference.contains(".md") {
            out.push(reference.to_owned());
        }
        rest = &tail[len.max(1)..];
    }
    out
}

/// The files of `dir` (relative to the repository), recursively.
fn files_under(dir: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![Path::new(ROOT).join(dir)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).expect("read a directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() { dirs.push(path) } else { files.push(path) }
        }
    }
    files
}

/// Docs a reader reads in one pass, and a reference that leads somewhere: no line of prose in
/// docs/ longer than [`LONGEST_LINE`]; every local link of the README and docs/ to a file that
/// exists and a heading it has; and every `docs/….md#anchor` named under src/ and deploy/ (an
/// error's advice, a rule's runbook) too.
#[test]
fn the_docs_have_no_long_line_and_every_reference_resolves() {
    let mut problems = Vec::new();
    let docs = markdown_under("docs");
    assert!(docs.iter().any(|d| d.starts_with("docs/runbooks/")), "the runbooks are read");
    for doc in std::iter::once("README.md".to_owned()).chain(docs) {
        let text = std::fs::read_to_string(Path::new(ROOT).join(&doc)).expect("read a doc");
        let dir = doc.rsplit_once('/').map_or("", |(dir, _)| dir);
        for (number, line) in prose_lines(&text) {
            let chars = line.chars().count();
            if doc.starts_with("docs/") && chars > LONGEST_LINE {
                problems.push(format!("{doc}:{number}: a line of {chars} characters"));
            }
            for target in link_targets(line) {
                let target = match target.strip_prefix('#') {
                    Some(anchor) => format!("{doc}#{anchor}"),
                    None => joined(dir, &target),
                };
                if let Err(err) = resolve(&target) {
                    problems.push(format!("{doc}:{number}: a link to {err}"));
                }
            }
        }
    }
    for file in files_under("src").into_iter().chain(files_under("deploy")) {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let name = file.strip_prefix(ROOT).expect("under the repository").display().to_string();
        for reference in doc_references(&text) {
            if let Err(err) = resolve(&reference) {
                problems.push(format!("{name}: names {err}"));
            }
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn anchors_and_links_are_read_as_github_reads_them() {
    assert_eq!(
        github_anchor(" Large payloads (`--object-store`)"),
        "large-payloads---object-store"
    );
    assert_eq!(
        github_anchor(" Publishing rows again: `pgoutbox replay`"),
        "publishing-rows-again-pgoutbox-replay"
    );
    let text = "# A\n```sh\n# not a heading\n```\n## A\n#### A b\n## A\n";
    assert_eq!(anchors(text), ["a", "a-1", "a-b", "a-2"]);
    let line = "see [x](../a.md#b), `[y](c.md)` and [z](https://example.com)";
    assert_eq!(link_targets(line), ["../a.md#b"]);
    assert_eq!(joined("docs/how-to", "../runbooks/replay.md"), "docs/runbooks/replay.md");
    let source = "// see docs/operations.md#metrics.\n\"(docs/runbooks/slot-lost.md)\"";
    assert_eq!(
        doc_references(source),
        ["docs/operations.md#metrics", "docs/runbooks/slot-lost.md"]
    );
    assert!(resolve("docs/operations.md#no-such-heading").is_err());
}

#[test]
fn markers_need_a_reason_and_a_block() {
    let text = "<!-- not run: long -->\n```sh\nsleep 1d\n```\n\n```text\nx\n```\n";
    let found = blocks("t.md", text);
    assert_eq!(found[0].mode, Mode::Skip("long".into()));
    assert_eq!((found[1].line, found[1].lang.as_str()), (6, "text"));
    let no_reason = parse("t.md", "<!-- not run: -->\n```sh\n```");
    assert_eq!(no_reason.unwrap_err(), "t.md:1: `not run` needs a reason");
    let no_block = parse("t.md", "<!-- not run: long -->\ntext\n```sh\n```");
    assert_eq!(no_block.unwrap_err(), "t.md:1: a marker not followed by a block");
}
