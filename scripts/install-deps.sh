#!/usr/bin/env bash
# Installs what pgoutbox's tests and first look need, from Debian's packages, when missing:
# PostgreSQL (server binaries) and nats-server; a C++ compiler for the libFuzzer that CI's
# check of the fuzz targets builds.
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
