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
# $OUT (default /tmp/measure-replay). CPU=1 samples the whole machine (`perf record -a`,
# no call graphs) during each phase and prints each process's CPU seconds beside the rows/s:
# what a phase costs beyond the drain, process by process (`perf report -i $OUT/cpu-<phase>.data
# --comm nats-server --sort sym` then compares a process's functions between phases), and
# with SYSCALLS=1 counts each thread's socket and futex syscalls into $OUT/sys-<phase>.txt
# (on some hosts that `perf stat` does not stop when told, and the script hangs).
# NATS_SERVER=<binary> runs another nats-server than /usr/sbin's (2.9, stripped), e.g. one
# from scripts/fetch-nats.sh. FRESH_NATS=1 runs each phase on a new nats-server (a new
# store), so that no phase works beside the streams and duplicate windows of the ones before.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-100000}
phases=${2:-drain,replay,backfill,recover}
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release/pgoutbox}
out=${OUT:-/tmp/measure-replay}
mkdir -p "$out"
[ -x "$bin" ] || { echo "no $bin: cargo build --release first" >&2; exit 1; }
source scripts/throwaway.sh measure-replay

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
# FRESH_NATS=1: each phase on a nats-server of its own (new store), started before it.
nats_runs=0
start_nats() {
  if [ -n "${nats_pid:-}" ]; then kill "$nats_pid"; wait "$nats_pid" 2>/dev/null || true; fi
  nats_runs=$((nats_runs + 1))
  "${NATS_SERVER:-/usr/sbin/nats-server}" -js -a 127.0.0.1 -p "$nats_port" -sd "$work/nats$nats_runs" \
    >>"$work/nats.log" 2>&1 &
  nats_pid=$!
  pids+=($nats_pid)
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && break; sleep 0.1; done
}
fresh_nats() { [ "${FRESH_NATS:-}" = 1 ] && start_nats || true; }
start_nats
export PGOUTBOX_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
export PGOUTBOX_NATS_URL="nats://127.0.0.1:$nats_port"
export PGOUTBOX_LOG=${PGOUTBOX_LOG:-warn}
psql() { command psql -X -q -t -A -v ON_ERROR_STOP=1 "$PGOUTBOX_DATABASE_URL" "$@"; }

# A slot and stream of their own per phase, as the benchmark does.
own() { local s=${1,,}; echo "--slot $s --stream $1 --subject-template $s.{aggregate_type}.x --dead-letter-subject $s.dead_letter"; }
now() { date +%s.%N; }
# Waits until slot $1 is active (a pgoutbox streams from it) and everything up to $2 is
# stored: the walsender's write_lsn, what JetStream acknowledged (the slot itself is
# confirmed a durability horizon later). One session polling inside the server every 10 ms
# (a psql started every 10 ms cost a second of CPU per phase, a fifth of the machine, and
# made every phase slower).
wait_confirmed() {
  psql >/dev/null <<SQL
DO \$\$ BEGIN
  WHILE NOT EXISTS (SELECT 1 FROM pg_replication_slots s
                    JOIN pg_stat_replication r ON r.pid = s.active_pid
                    WHERE s.slot_name = '$1' AND r.write_lsn >= '$2') LOOP
    -- pg_stat_replication's sessions are a snapshot taken once a transaction.
    PERFORM pg_stat_clear_snapshot();
    PERFORM pg_sleep(0.01);
  END LOOP;
END \$\$;
SQL
}
# Starts `pgoutbox <args> run <mode>` in the background, waits until slot $1 confirms the
# WAL's current end, and reports phase $4 timed from the start.
timed_run() { # slot stream mode phase
  local end t0
  end=$(psql -c "SELECT pg_current_wal_lsn()")
  cpu_start "${3#--}"
  t0=$(now)
  "$bin" $(own "$2") run "$3" >"$work/${3#--}.log" 2>&1 &
  pids+=($!)
  wait_confirmed "$1" "$end"
  report "$4" "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')" "$drain_rate"
  cpu_stop "${pids[-1]}"
}
report() { # phase seconds [drain rows/s]
  awk -v p="$1" -v t="$2" -v n="$rows" -v d="${3:-0}" 'BEGIN {
    r = n / t; printf "%-40s %8.2f s %10.0f rows/s", p, t, r
    if (d > 0) printf "  %.2f x drain", r / d
    printf "\n" }'
}

# CPU=1: the whole machine sampled during a phase; PostgreSQL's processes are told apart by
# what pg_stat_activity said of their pid while the phase ran.
cpu_start() { # phase
  [ "${CPU:-}" = 1 ] || return 0
  cpu_phase=$1
  perf record -a -F 997 -o "$out/cpu-$1.data" >/dev/null 2>&1 &
  cpu_perf=$!
  sys_perf=
  if [ "${SYSCALLS:-}" = 1 ]; then
    perf stat -a --per-thread -e syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex \
      -o "$out/sys-$1.txt" >/dev/null 2>&1 &
    sys_perf=$!
  fi
  echo "SELECT pid, coalesce(nullif(application_name, ''), backend_type) FROM pg_stat_activity \\watch 0.2" |
    psql >"$out/cpu-$1.pids" 2>/dev/null &
  cpu_watch=$!
}
cpu_stop() { # [pid of the pgoutbox that runs]
  [ "${CPU:-}" = 1 ] || return 0
  kill "$cpu_watch" 2>/dev/null; wait "$cpu_watch" 2>/dev/null || true
  kill -INT "$cpu_perf" $sys_perf; wait "$cpu_perf" $sys_perf 2>/dev/null || true
  perf report -i "$out/cpu-$cpu_phase.data" --sort comm,pid -n --stdio -q 2>/dev/null |
    awk -v pids="$out/cpu-$cpu_phase.pids" -v phase="$cpu_phase" -v run="${1:-0}" '
      BEGIN { while ((getline line < pids) > 0) { split(line, f, "|"); role[f[1]] = f[2] } }
      NF >= 4 { n = $2; comm = $3; split($NF, cp, ":"); pid = cp[1] + 0
        if (comm == "postgres") comm = "pg " (pid in role ? role[pid] : "other")
        else if (comm == "pgoutbox") comm = (pid == run ? "pgoutbox run" : "pgoutbox other")
        if (comm == "swapper") comm = "idle"
        cpu[comm] += n / 997; total += n / 997 }
      END { printf "  CPU s during %s:", phase
        n = asorti(cpu, names)
        for (i = 1; i <= n; i++) if (cpu[names[i]] >= 0.01) printf " %s %.2f;", names[i], cpu[names[i]]
        printf " (all %.2f)\n", total }'
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

cpu_start drain
t0=$(now)
"$bin" $(own DRAIN) run >"$work/drain.log" 2>&1 &
drain_pid=$!
pids+=($drain_pid)
wait_confirmed drain "$end"
drain_s=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
cpu_stop "$drain_pid"
drain_rate=$(awk -v t="$drain_s" -v n="$rows" 'BEGIN { print n / t }')
report "drain (start -> all stored)" "$drain_s"
# As in the benchmark, nothing else streams while the replay runs.
kill "$drain_pid"; wait "$drain_pid" 2>/dev/null || true
cp "$work/drain.log" "$out/"

if [[ $phases == *replay* ]]; then
  fresh_nats
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
  cpu_start replay
  t0=$(now)
  # Each line of the command's stderr with the seconds since it started: the phases.
  "${replay[@]}" 2>&1 >"$out/replay.out" |
    while IFS= read -r line; do echo "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%6.2f", b - a }') $line"; done >"$out/replay.err"
  report "replay through the live pgoutbox" "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')" "$drain_rate"
  cpu_stop "$live_pid"
  tail -n 1 "$out/replay.out"
  cat "$out/replay.err"
  if [ ${#perf_live[@]} -gt 0 ]; then kill -INT "${perf_live[0]}"; wait "${perf_live[0]}" || true; fi
  kill "$live_pid"; wait "$live_pid" 2>/dev/null || true
fi

if [[ $phases == *backfill* ]]; then
  fresh_nats
  timed_run backfill BACKFILL --backfill "run --backfill (start -> streaming)"
  kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
fi

if [[ $phases == *recover* ]]; then
  # The drain's slot lost: the rows committed meanwhile are published from the table.
  until [ "$(psql -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'drain' AND active")" = 0 ]; do sleep 0.05; done
  psql -c "SELECT pg_drop_replication_slot('drain')" >/dev/null
  insert_rows "$rows"
  fresh_nats
  timed_run drain DRAIN --recover "run --recover of $rows new rows"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
