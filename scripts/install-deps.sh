#!/usr/bin/env bash
# Installs what pgoutbox's tests and first look need, from Debian's packages, when missing:
# PostgreSQL (server binaries) and nats-server. For the tests, also a C++ compiler for the
# libFuzzer that CI's check of the fuzz targets builds, fuse3 (fusermount3: the power-loss
# tests mount a lazy filesystem, tests/support/lazyfs.rs, and need /dev/fuse), and the
# CloudEvents SDK and nats-py (Python) for the CloudEvents and Object Store tests, into a
# directory of its own (never into the user's Python).
#   scripts/install-deps.sh                  what the tests need
#   scripts/install-deps.sh --servers-only   PostgreSQL, psql and nats-server (first look)
set -euo pipefail

servers_only=""
case "${1:-}" in
  --servers-only) servers_only=yes ;;
  "") ;;
  *) echo "install-deps.sh: unknown argument $1 (--servers-only, or nothing)" >&2; exit 2 ;;
esac

need=()
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  need+=(postgresql)
fi
if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
  need+=(nats-server)
fi
if ! command -v psql >/dev/null 2>&1; then
  need+=(postgresql-client)
fi
if [ -z "$servers_only" ] && ! command -v c++ >/dev/null 2>&1; then
  need+=(g++)
fi
if [ -z "$servers_only" ] && ! command -v fusermount3 >/dev/null 2>&1; then
  need+=(fuse3)
fi
if ((${#need[@]})); then
  echo "installing ${need[*]} from Debian's packages" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

[ -z "$servers_only" ] || exit 0

# The CloudEvents SDK the CloudEvents test reads pgoutbox's messages with
# (tests/fixtures/cloudevents_consumer.py), nats-py, the second client library that
# reads large payloads' objects (tests/fixtures/object_pointers.py), and psycopg, which the
# Python recipes (examples/recipes/python/) apply into PostgreSQL with, from PyPI as
# scripts/fetch-nats.sh fetches, into its own directory: the tests put it on PYTHONPATH.
packages="${PGOUTBOX_PYTHON_PACKAGES:-/var/tmp/pgoutbox-python}"
if ! PYTHONPATH="$packages" python3 -c "import cloudevents.core.bindings.http, nats.js.object_store, psycopg" >/dev/null 2>&1; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "installing pip from Debian's packages" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip >/dev/null
  fi
  echo "installing the CloudEvents SDK (cloudevents 2.x), nats-py and psycopg from PyPI into $packages" >&2
  # --target leaves the user's and the system's Python as they are (PEP 668 allows it).
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts \
    --root-user-action=ignore --target "$packages" \
    'cloudevents>=2,<3' 'nats-py>=2.9,<3' 'psycopg[binary]>=3.2,<4'
fi

# The TypeScript recipes (examples/recipes/typescript/): Node (20 or later) and their npm
# packages, from package-lock.json, into their own node_modules.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "installing Node.js and npm from Debian's packages" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null
fi
recipes="$(dirname "$0")/../examples/recipes/typescript"
if [ ! -f "$recipes/node_modules/.package-lock.json" ] ||
  [ "$recipes/package-lock.json" -nt "$recipes/node_modules/.package-lock.json" ]; then
  echo "installing the TypeScript recipes' packages (npm ci in $recipes)" >&2
  (cd "$recipes" && npm ci --omit=dev --no-audit --no-fund --loglevel=error)
fi
