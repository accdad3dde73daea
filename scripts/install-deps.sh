#!/usr/bin/env bash
# Installs what pgoutbox's tests and first look need, from Debian's packages, when missing:
# PostgreSQL (server binaries) and nats-server; a C++ compiler for the libFuzzer that CI's
# check of the fuzz targets builds; the CloudEvents SDK (Python) for the CloudEvents test.
set -euo pipefail

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
if ! command -v c++ >/dev/null 2>&1; then
  need+=(g++)
fi
if ((${#need[@]})); then
  echo "installing ${need[*]} from Debian's packages" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The CloudEvents SDK the CloudEvents test reads pgoutbox's messages with
# (tests/fixtures/cloudevents_consumer.py), from PyPI as scripts/fetch-nats.sh fetches.
if ! python3 -c "import cloudevents.core.bindings.http" >/dev/null 2>&1; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "installing pip from Debian's packages" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip >/dev/null
  fi
  echo "installing the CloudEvents SDK (cloudevents 2.x) from PyPI" >&2
  # Debian's Python refuses to install into the system without this flag (PEP 668).
  python3 -m pip install --quiet --user 'cloudevents>=2,<3' 2>/dev/null ||
    python3 -m pip install --quiet --user --break-system-packages 'cloudevents>=2,<3'
fi
