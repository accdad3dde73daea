#!/usr/bin/env bash
# The steady-state soak (issue 68): single-row transactions at a constant rate for several
# durability horizons; every 2 s the WAL the slot holds, pgoutbox's memory, descriptors and
# connections, and the commit-to-stored p99. Fails when the slot does not move within a
# horizon, holds more WAL than the horizon needs, or anything grows from the middle third
# of the run to the last (tests/cases/steady_writer.rs).
#
#   scripts/steady.sh [--minutes N] [--rate ROWS_PER_S] [--horizon DURATION] [--debug]
#
# --minutes  how long the writer writes (default 2; fractions allowed)
# --rate     single-row transactions a second (default 200)
# --horizon  pgoutbox's --durability-horizon (default: pgoutbox's own default, 150s)
# --debug    the debug build (CI: the suite's build); the release build is the default
# PGOUTBOX_TEST_NATS=2.15 picks a nats-server from scripts/fetch-nats.sh, as for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=2
rate=200
horizon=""
profile=--release
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="${2:?--minutes needs a number}"; shift 2 ;;
    --rate) rate="${2:?--rate needs rows per second}"; shift 2 ;;
    --horizon) horizon="${2:?--horizon needs a duration, like 10s}"; shift 2 ;;
    --debug) profile=""; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "steady.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
PGOUTBOX_STEADY_MINUTES="$minutes" PGOUTBOX_STEADY_RATE="$rate" PGOUTBOX_STEADY_HORIZON="$horizon" \
  cargo test $profile --test main -- --ignored --exact \
  cases::steady_writer::a_writer_that_never_pauses_keeps_the_slot_moving_and_every_resource_flat \
  --nocapture
