#!/usr/bin/env bash
# Times `pgoutbox verify` over a table of N rows (10,000,000 unless given) that `run
# --backfill` published, on a throwaway PostgreSQL and nats-server (fsync off, loopback):
# first with the stream whole, then with one message deleted and one stored twice by hand.
# Prints the wall time and peak memory of each verify and what it found.
#
#   scripts/measure-verify.sh [rows]
#
# BIN=<pgoutbox binary> (default: the release build in CARGO_TARGET_DIR or ./target).
# NATS_SERVER=<binary> runs another nats-server than /usr/sbin's.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-10000000}
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release/pgoutbox}
[ -x "$bin" ] || { echo "no $bin: cargo build --release first" >&2; exit 1; }
source scripts/throwaway.sh measure-verify

"${as_pg[@]}" "$pgbin/initdb" -D "$work/pg" -A trust -U postgres --no-sync >/dev/null
cat >>"$work/pg/postgresql.conf" <<EOF
wal_level = logical
fsync = off
full_page_writes = off
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$work'
EOF
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w start >/dev/null
"${NATS_SERVER:-/usr/sbin/nats-server}" -js -a 127.0.0.1 -p "$nats_port" -sd "$work/nats" \
  >>"$work/nats.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && break; sleep 0.1; done
export PGOUTBOX_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
export PGOUTBOX_NATS_URL="nats://127.0.0.1:$nats_port"
psql() { command psql -X -q -t -A -v ON_ERROR_STOP=1 "$PGOUTBOX_DATABASE_URL" "$@"; }

# A JetStream API request or a message with headers, over the plain NATS protocol.
nats_tool() { # create | delete <seq> | copy <id> <payload>
  python3 - "$nats_port" "$@" <<'PY'
import json, socket, sys
port, what, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
s = socket.create_connection(("127.0.0.1", port)); f = s.makefile("rb")
f.readline()
s.sendall(b'CONNECT {"verbose":false,"headers":true}\r\nSUB _r 1\r\n')
def request(subject, body):
    body = json.dumps(body).encode()
    s.sendall(b"PUB %s _r %d\r\n%s\r\nPING\r\n" % (subject.encode(), len(body), body))
    while True:
        line = f.readline()
        if line.startswith(b"MSG"):
            reply = f.read(int(line.split()[-1]) + 2)
            print(reply.decode().strip()); return
if what == "create":
    request("$JS.API.STREAM.CREATE.OUTBOX", {"name": "OUTBOX", "subjects": ["outbox.*.*", "outbox.dead_letter"],
            "duplicate_window": 1_000_000_000, "storage": "file", "num_replicas": 1})
elif what == "delete":
    request("$JS.API.STREAM.MSG.DELETE.OUTBOX", {"seq": int(args[0]), "no_erase": True})
elif what == "copy":
    headers = ("NATS/1.0\r\nNats-Msg-Id: %s\r\nPgoutbox-Table: public.outbox\r\n\r\n" % args[0]).encode()
    payload = args[1].encode()
    s.sendall(b"HPUB outbox.order.created _r %d %d\r\n%s%s\r\n" % (len(headers), len(headers) + len(payload), headers, payload))
    request("$JS.API.INFO", {})
PY
}

psql -f sql/outbox.sql
nats_tool create >/dev/null
echo "inserting $rows rows"
psql -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'order', n::text, 'created', jsonb_build_object('n', n)
         FROM generate_series(1, $rows) AS n"
end=$(psql -c "SELECT pg_current_wal_lsn()")
t0=$(date +%s.%N)
PGOUTBOX_LOG=warn "$bin" run --backfill --http-addr 127.0.0.1:0 >"$work/run.log" 2>&1 &
run_pid=$!
pids+=($run_pid)
psql >/dev/null <<SQL
DO \$\$ BEGIN
  WHILE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = 'pgoutbox' AND active
                      AND confirmed_flush_lsn >= '$end') LOOP
    PERFORM pg_sleep(0.1);
  END LOOP;
END \$\$;
SQL
awk -v a="$t0" -v b="$(date +%s.%N)" -v n="$rows" 'BEGIN { printf "backfill: %.1f s (%.0f rows/s)\n", b - a, n / (b - a) }'
kill "$run_pid"; wait "$run_pid" 2>/dev/null || true

timed_verify() { # label
  local out
  out=$( { /usr/bin/time -f 'TIME %e s, peak RSS %M kB' "$bin" verify 2>&1; } || true)
  echo "$1: $(grep -v '^TIME' <<<"$out" | head -1)"
  echo "$1: $(grep '^TIME' <<<"$out")"
  grep -E '^(missing|held twice)' <<<"$out" | sed "s/^/$1: /" || true
}
timed_verify "whole stream"
id=$(psql -c "SELECT id FROM outbox WHERE aggregate_id = '7'")
nats_tool delete $((rows / 2)) >/dev/null
sleep 1.1 # the stream's 1 s duplicate window, so that the copy is stored
nats_tool copy "$id" '{"n": 7}' >/dev/null
timed_verify "one deleted, one copied"
