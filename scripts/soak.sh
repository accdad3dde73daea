#!/usr/bin/env bash
# The nemesis soak (issue 28): a writer reusing ids after truncates, and tenants created
# (their first rows adopted), written and dropped under 'tenant_*.outbox', some rows
# scheduled, while a seeded schedule kills pgoutbox, pauses and restarts nats-server,
# restarts Postgres, drops the slot and recovers, replays rows into the live stream, and
# makes nats-server lose what every stream stored in its last seconds (a power loss, within
# pgoutbox's default durability horizon); one event in 37 is large and goes to an object
# (--object-store), its object read back and checked; then every event is checked. See
# docs/evidence.md#the-soak.
#
#   scripts/soak.sh [--minutes N] [--seed S] [--off KIND,...] [--duplicate-window SECONDS] [--debug] [--consumer]
#
# --consumer  the consumer soak instead (issue 57): the same faults, and kill -9 of the
#             example consumer, over partitioned transactions with their ends, large and
#             scheduled events; what the consumer applied to its database is checked
#             (tests/cases/consumer_soak.rs)
# --minutes   how long faults are injected (default 3; fractions allowed)
# --seed      the schedule's seed (default: random, printed first: pass it to replay a run)
# --off       turn off fault kinds: kill, pause, nats-restart, pg-fast, pg-immediate,
#             recover, replay, tail-loss; the writer's truncate; its large events (large);
#             tenants, or their scheduled rows (schedules, which run only on nats-server
#             2.12+ and are skipped before)
# --duplicate-window  the stream's duplicate window in seconds (default 5)
# --debug     the debug build (CI: the suite's build, no release build of the tests; the
#             release build, the default, gives the real binary's timing)
# PGOUTBOX_TEST_NATS=2.12 picks a nats-server from scripts/fetch-nats.sh, as for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=3
seed=""
off=""
window=5
profile=--release
test=cases::nemesis_soak::every_committed_event_once_in_order_under_a_seeded_nemesis
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="${2:?--minutes needs a number}"; shift 2 ;;
    --seed) seed="${2:?--seed needs a number}"; shift 2 ;;
    --off) off="${2:?--off needs a list of kinds}"; shift 2 ;;
    --duplicate-window) window="${2:?--duplicate-window needs seconds}"; shift 2 ;;
    --debug) profile=""; shift ;;
    --consumer) test=cases::consumer_soak::the_example_consumer_applies_every_event_once_whole_and_in_order_under_a_seeded_nemesis; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$seed" ]; then
  seed=$(( (RANDOM << 15 | RANDOM) % 1000000 ))
fi
echo "soak: seed $seed, $minutes min${off:+, off: $off}" >&2

cargo build $profile --example consumer
PGOUTBOX_SOAK_MINUTES="$minutes" PGOUTBOX_SOAK_SEED="$seed" PGOUTBOX_SOAK_OFF="$off" \
PGOUTBOX_SOAK_DUPLICATE_WINDOW="$window" \
  cargo test $profile --test main -- --ignored --exact "$test" --nocapture
