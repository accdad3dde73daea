#!/usr/bin/env bash
# A first look at pgoutbox on a fresh Debian machine, no Docker: a throwaway PostgreSQL
# (wal_level=logical) and nats-server -js, the outbox schema, pgoutbox itself, a few sample
# rows once pgoutbox streams, and the messages as JetStream stores them. Ctrl-C stops
# everything and cleans up. It stops at the first step that fails, saying which in one line.
# Ports: PG_PORT (54329), NATS_PORT (54229), HTTP_PORT (54317, pgoutbox's /readyz).
set -euo pipefail
cd "$(dirname "$0")/.."

step="starting"
fail() {
  echo "first-look: $*" >&2
  exit 1
}
trap 'fail "$step failed (line $LINENO: $BASH_COMMAND)"' ERR

step="installing PostgreSQL and nats-server (scripts/install-deps.sh --servers-only)"
scripts/install-deps.sh --servers-only

work=$(mktemp -d /tmp/pgoutbox-first-look.XXXXXX)
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$pgbin" ] || pgbin=$(dirname "$(command -v initdb)")
pg_port=${PG_PORT:-54329}
nats_port=${NATS_PORT:-54229}
http_port=${HTTP_PORT:-54317}

# PostgreSQL refuses to run as root: run it as the postgres user then.
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$work"
  as_pg=(runuser -u postgres --)
fi

pids=()
cleanup() {
  trap - EXIT INT TERM ERR
  # Piped (`first-look.sh | tee log`), Ctrl-C ends the reader too: a line written then would
  # end this script by SIGPIPE before PostgreSQL is stopped and its directory removed.
  trap '' PIPE
  set +e
  { echo; echo "stopping..."; } 2>/dev/null
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -m fast stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'cleanup; exit 0' INT TERM

# Whether something answers on 127.0.0.1:$1.
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The status line and body of GET $2 on 127.0.0.1:$1, or nothing.
http_get() {
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 0
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
    cat <&3
  ) 2>/dev/null | tr -d '\r' || true
}

for port in "$pg_port" "$nats_port" "$http_port"; do
  if answers "$port"; then
    fail "port $port is taken; choose others with PG_PORT, NATS_PORT and HTTP_PORT"
  fi
done

# The build first: it takes the longest, and everything else needs its binary. Cargo
# says where it puts it (CARGO_TARGET_DIR, build.target-dir, else ./target).
step="asking cargo for its target directory"
target_dir=$(cargo metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || fail "cargo metadata names no target_directory"
# The test profile (debug): `scripts/test.sh` then reuses every compiled dependency instead
# of building the tree a second time in release mode; a first look needs no release speed.
bin="$target_dir/debug/pgoutbox"
tail_bin="$target_dir/debug/examples/tail"
step="building pgoutbox (cargo build)"
echo "building pgoutbox into $target_dir: about 2 minutes on 2 cores the first time, seconds after"
cargo build --bin pgoutbox --example tail
[ -x "$bin" ] || fail "the build made no $bin"
[ -x "$tail_bin" ] || fail "the build made no $tail_bin"

step="starting PostgreSQL on 127.0.0.1:$pg_port"
echo "starting PostgreSQL on 127.0.0.1:$pg_port and nats-server on 127.0.0.1:$nats_port"
"${as_pg[@]}" "$pgbin/initdb" -D "$work/pg" -A trust -U postgres >/dev/null
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg/server.log" -w \
  -o "-p $pg_port -k $work -c listen_addresses=127.0.0.1 -c wal_level=logical" start >/dev/null
step="starting nats-server on 127.0.0.1:$nats_port"
nats_bin=$(command -v nats-server || echo /usr/sbin/nats-server)
"$nats_bin" -js -a 127.0.0.1 -p "$nats_port" -sd "$work/nats" >"$work/nats.log" 2>&1 &
nats_pid=$!
pids+=("$nats_pid")
for _ in $(seq 50); do
  answers "$nats_port" && break
  kill -0 "$nats_pid" 2>/dev/null || fail "nats-server exited: $(tail -n 1 "$work/nats.log")"
  sleep 0.1
done
answers "$nats_port" || fail "nats-server does not answer on 127.0.0.1:$nats_port after 5 s"

export PGOUTBOX_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
export PGOUTBOX_NATS_URL="nats://127.0.0.1:$nats_port"
export PGOUTBOX_HTTP_ADDR="127.0.0.1:$http_port"
export NATS_URL="$PGOUTBOX_NATS_URL"
psql() { command psql -X -q -v ON_ERROR_STOP=1 "$PGOUTBOX_DATABASE_URL" "$@"; }
step="creating the outbox table (sql/outbox.sql)"
psql -f sql/outbox.sql

step="starting pgoutbox"
"$bin" run &
app_pid=$!
pids+=("$app_pid")
# Rows go in only once pgoutbox streams: its /readyz answers 200 then.
ready=""
for _ in $(seq 300); do
  kill -0 "$app_pid" 2>/dev/null || fail "pgoutbox exited before it streamed (its log is above)"
  if http_get "$http_port" /readyz | head -n 1 | grep -q ' 200 '; then
    ready=yes
    break
  fi
  sleep 0.1
done
[ -n "$ready" ] || fail "pgoutbox is not streaming after 30 s; /readyz says: $(http_get "$http_port" /readyz | tail -n 1)"

step="inserting sample rows"
psql -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', '1001', 'created', '{\"total\": 42}'),
                ('order', '1001', 'paid', '{\"amount\": 42}'),
                ('customer', '7', 'registered', '{\"name\": \"Ada\"}')"
cat <<EOF

pgoutbox streams; 3 rows inserted.
  PostgreSQL  $PGOUTBOX_DATABASE_URL
  NATS        $PGOUTBOX_NATS_URL
  pgoutbox    http://$PGOUTBOX_HTTP_ADDR/metrics, /readyz
In another terminal:
  $bin status --database-url $PGOUTBOX_DATABASE_URL --nats-url $PGOUTBOX_NATS_URL --http-addr $PGOUTBOX_HTTP_ADDR
  psql $PGOUTBOX_DATABASE_URL -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'shipped', '{}')"
The messages as JetStream stores them:
EOF
step="reading the stream"
"$tail_bin" &
pids+=($!)
wait
