#!/usr/bin/env bash
# The previous release of pgoutbox, for the upgrade test (tests/cases/upgrade.rs): the commit
# pinned below (or PGOUTBOX_PREVIOUS_COMMIT), built once and kept in
# /var/tmp/pgoutbox-previous/<commit>/pgoutbox; prints that path. Built in this checkout's
# target directory under the name pgoutbox-previous, so that it shares the dependencies
# already compiled there and never replaces this version's binary.
#
#   scripts/fetch-previous.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# 559d3cf (2026-11-29): the main the issues of 2026-11-30 were measured on.
commit=${PGOUTBOX_PREVIOUS_COMMIT:-559d3cf087f976cb27c03550ba9b05857b8bc932}
cache=/var/tmp/pgoutbox-previous/$commit
if [ -x "$cache/pgoutbox" ]; then
  echo "$cache/pgoutbox"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "fetch-previous.sh: commit $commit is not in this clone; clone with its history (not --depth)" >&2
  exit 1
fi
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git archive "$commit" | tar -x -C "$src"
# Its binary under another name (autobins off, one [[bin]]), its crate and lock unchanged.
sed -i 's/^edition = "2024"$/&\nautobins = false/' "$src/Cargo.toml"
printf '\n[[bin]]\nname = "pgoutbox-previous"\npath = "src/main.rs"\n' >> "$src/Cargo.toml"
target=${CARGO_TARGET_DIR:-$PWD/target}
echo "fetch-previous.sh: building pgoutbox at ${commit:0:7} (once; kept in $cache)" >&2
(cd "$src" && CARGO_TARGET_DIR="$target" cargo build --quiet --locked --bin pgoutbox-previous) >&2
mkdir -p "$cache"
cp "$target/debug/pgoutbox-previous" "$cache/pgoutbox.partial"
mv "$cache/pgoutbox.partial" "$cache/pgoutbox"
echo "$cache/pgoutbox"
