#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests against throwaway PostgreSQL and
# nats-server processes that the tests start and stop themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo test --all-targets -- --test-threads=2
