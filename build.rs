//! Stamps the commit the binary was built from into `--version` (`PGOUTBOX_COMMIT`): the
//! upgrade guide is keyed to commits, and `0.1.0` alone does not say which. A tree without
//! git (the Dockerfile's build stage, a source archive) says `unknown`.

// Cargo reads a build script's stdout: println! is how it speaks to cargo (clippy.toml
// forbids it in src/).
#![allow(clippy::disallowed_macros)]

use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|changes| !changes.is_empty());
    let suffix = if dirty { "-modified" } else { "" };
    println!("cargo:rustc-env=PGOUTBOX_COMMIT={commit}{suffix}");
    for path in [".git/HEAD", ".git/refs/heads", ".git/packed-refs", ".git/index"] {
        println!("cargo:rerun-if-changed={path}");
    }
}
