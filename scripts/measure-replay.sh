#!/usr/bin/env bash
# Times `pgoutbox replay` through a running pgoutbox beside the drain of the same rows, and
# `run --backfill` / `run --recover`, on a throwaway PostgreSQL and nats-server started the
# way the tests start them (fsync off, loopback). Prints one line per phase: seconds and
# rows/s, and each rate over the drain's. Run it under the shared lock:
#
#   flock /tmp/cargo.lock scripts/measure-replay.sh [rows] [phases]
#
# rows: 100000 unless given. phases: any of drain,replay,backfill,recover (comma-separated;
# drain always runs first). BIN=<pgoutbox binary> (default: the release build in
# CARGO_TARGET_DIR or ./target). PERF=1 records `perf record -g` of the replay command and
# of the pgoutbox it hands over to, PERF=all of the whole machine during the replay, into
# $OUT (default /tmp/measure-replay).
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-100000}
phases=${2:-drain,replay,backfill,recover}
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release/pgoutbox}
out=${OUT:-/tmp/measure-replay}
mkdir -p "$out"
[ -x "$bin" ] || { echo "no $bin: cargo build --release first" >&2; exit 1; }
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
work=$(mktemp -d /tmp/measure-replay.XXXXXX)
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$work"
  as_pg=(runuser -u postgres --)
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pg_port=$(free_port)
nats_port=$(free_port)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"${as_pg[@]}" "$pgbin/initdb" -D "$work/pg" -A trust -U postgres --no-sync >/dev/null
cat >>"$work/pg/postgresql.conf" <<EOF
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
fsync = off
full_page_writes = off
shared_buffers = 32MB
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$work'
EOF
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w start >/dev/null
/usr/sbin/nats-server -js -a 127.0.0.1 -p "$nats_port" -sd "$work/nats" >"$work/nats.log" 2>&1 &
pids+=($!)
export PGOUTBOX_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
export PGOUTBOX_NATS_URL="nats://127.0.0.1:$nats_port"
export PGOUTBOX_LOG=${PGOUTBOX_LOG:-warn}
psql() { command psql -X -q -t -A -v ON_ERROR_STOP=1 "$PGOUTBOX_DATABASE_URL" "$@"; }
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && break; sleep 0.1; done

# A slot and stream of their own per phase, as the benchmark does.
own() { local s=${1,,}; echo "--slot $s --stream $1 --subject-template $s.{aggregate_type}.x --dead-letter-subject $s.dead_letter"; }
now() { date +%s.%N; }
# Waits until slot $1 is active (a pgoutbox streams from it) and has confirmed $2.
wait_confirmed() {
  until [ "$(psql -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$1' AND active AND confirmed_flush_lsn >= '$2'")" = 1 ]; do
    sleep 0.01
  done
}
# Starts `pgoutbox <args> run <mode>` in the background, waits until slot $1 confirms the
# WAL's current end, and reports phase $4 timed from the start.
timed_run() { # slot stream mode phase
  local end t0
  end=$(psql -c "SELECT pg_current_wal_lsn()")
  t0=$(now)
  "$bin" $(own "$2") run "$3" >"$work/${3#--}.log" 2>&1 &
  pids+=($!)
  wait_confirmed "$1" "$end"
  report "$4" "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')" "$drain_rate"
}
report() { # phase seconds [drain rows/s]
  awk -v p="$1" -v t="$2" -v n="$rows" -v d="${3:-0}" 'BEGIN {
    r = n / t; printf "%-40s %8.2f s %10.0f rows/s", p, t, r
    if (d > 0) printf "  %.2f x drain", r / d
    printf "\n" }'
}

psql -f sql/outbox.sql >/dev/null
"$bin" $(own DRAIN) setup >/dev/null 2>"$work/setup.err"
# SQL to run after setup (an experiment's change to the schema), when given.
[ -n "${PRE_SQL:-}" ] && psql -c "$PRE_SQL" >/dev/null
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $rows rows; $("$bin" --version 2>/dev/null || true); $bin; worktree at $(git rev-parse --short HEAD)"
# In transactions of 100 rows, as the benchmark inserts them: a drain of one huge
# transaction is slower (the walsender decodes it whole at its commit, spilling to disk)
# and made every ratio below look better than the benchmark's (until 2026-11-27).
insert_rows() {
  psql >/dev/null <<SQL
SELECT format('INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
  SELECT ''order'', n::text, ''created'',
    jsonb_build_object(''n'', n, ''t'', 0, ''pad'', repeat(''x'', 220))
  FROM generate_series(%s, %s) n', s, least(s + 99, $1))
FROM generate_series(1, $1, 100) s
\gexec
SQL
}
insert_rows "$rows"
end=$(psql -c "SELECT pg_current_wal_lsn()")

t0=$(now)
"$bin" $(own DRAIN) run >"$work/drain.log" 2>&1 &
drain_pid=$!
pids+=($drain_pid)
wait_confirmed drain "$end"
drain_s=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
drain_rate=$(awk -v t="$drain_s" -v n="$rows" 'BEGIN { print n / t }')
report "drain (start -> slot confirmed)" "$drain_s"
# As in the benchmark, nothing else streams while the replay runs.
kill "$drain_pid"; wait "$drain_pid" 2>/dev/null || true

if [[ $phases == *replay* ]]; then
  "$bin" $(own LIVE) run >"$work/live.log" 2>&1 &
  live_pid=$!
  pids+=($live_pid)
  until [ "$(psql -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'live' AND active")" = 1 ]; do sleep 0.05; done
  perf_live=()
  if [ "${PERF:-}" = 1 ]; then
    perf record -g -F 499 -p "$live_pid" -o "$out/live.perf.data" >/dev/null 2>&1 &
    perf_live=($!)
  fi
  if [ "${PERF:-}" = all ]; then
    perf record -a -g -F 499 -o "$out/all.perf.data" >/dev/null 2>&1 &
    perf_live=($!)
  fi
  replay=("$bin" $(own LIVE) replay --created-from -infinity)
  [ "${PERF:-}" = 1 ] && replay=(perf record -g -F 499 -o "$out/replay.perf.data" -- "${replay[@]}")
  t0=$(now)
  # Each line of the command's stderr with the seconds since it started: the phases.
  "${replay[@]}" 2>&1 >"$out/replay.out" |
    while IFS= read -r line; do echo "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%6.2f", b - a }') $line"; done >"$out/replay.err"
  report "replay through the live pgoutbox" "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')" "$drain_rate"
  tail -n 1 "$out/replay.out"
  cat "$out/replay.err"
  if [ ${#perf_live[@]} -gt 0 ]; then kill -INT "${perf_live[0]}"; wait "${perf_live[0]}" || true; fi
  kill "$live_pid"; wait "$live_pid" 2>/dev/null || true
fi

if [[ $phases == *backfill* ]]; then
  timed_run backfill BACKFILL --backfill "run --backfill (start -> streaming)"
  kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
fi

if [[ $phases == *recover* ]]; then
  # The drain's slot lost: the rows committed meanwhile are published from the table.
  until [ "$(psql -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'drain' AND active")" = 0 ]; do sleep 0.05; done
  psql -c "SELECT pg_drop_replication_slot('drain')" >/dev/null
  insert_rows "$rows"
  timed_run drain DRAIN --recover "run --recover of $rows new rows"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
