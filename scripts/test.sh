#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests against throwaway PostgreSQL and
# nats-server processes that the tests start and stop themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The previous release, for the upgrade test (tests/cases/upgrade.rs): built once, cached.
PGOUTBOX_PREVIOUS_BIN=$(scripts/fetch-previous.sh)
export PGOUTBOX_PREVIOUS_BIN
# `--all-targets` builds examples as test harnesses; the example consumer's test runs the
# program itself (tests/cases/example_consumer.rs).
cargo build --example consumer
cargo test --all-targets -- --test-threads=2
