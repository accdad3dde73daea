#!/usr/bin/env bash
# A first look at pgoutbox on a fresh Debian machine, no Docker: a throwaway PostgreSQL
# (wal_level=logical) and nats-server -js, the outbox schema, pgoutbox itself, a few sample
# rows, and the messages as JetStream stores them. Ctrl-C stops everything and cleans up.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

work=$(mktemp -d /tmp/pgoutbox-first-look.XXXXXX)
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$pgbin" ] || pgbin=$(dirname "$(command -v initdb)")
pg_port=${PG_PORT:-54329}
nats_port=${NATS_PORT:-54229}

# PostgreSQL refuses to run as root: run it as the postgres user then.
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$work"
  as_pg=(runuser -u postgres --)
fi

pids=()
cleanup() {
  trap - EXIT INT TERM
  echo; echo "stopping..."
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -m fast stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

echo "starting PostgreSQL on 127.0.0.1:$pg_port and nats-server on 127.0.0.1:$nats_port"
"${as_pg[@]}" "$pgbin/initdb" -D "$work/pg" -A trust -U postgres >/dev/null
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg/server.log" -w \
  -o "-p $pg_port -k $work -c listen_addresses=127.0.0.1 -c wal_level=logical" start >/dev/null
nats_bin=$(command -v nats-server || echo /usr/sbin/nats-server)
"$nats_bin" -js -a 127.0.0.1 -p "$nats_port" -sd "$work/nats" >"$work/nats.log" 2>&1 &
pids+=($!)

export PGOUTBOX_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
export PGOUTBOX_NATS_URL="nats://127.0.0.1:$nats_port"
export NATS_URL="$PGOUTBOX_NATS_URL"
psql() { command psql -X -q -v ON_ERROR_STOP=1 "$PGOUTBOX_DATABASE_URL" "$@"; }
psql -f sql/outbox.sql

echo "building pgoutbox (release)..."
cargo build --release --quiet --bin pgoutbox --example tail
target/release/pgoutbox run &
pids+=($!)

for _ in $(seq 100); do
  [ "$(psql -Atc "SELECT active FROM pg_replication_slots WHERE slot_name = 'pgoutbox'")" = t ] && break
  sleep 0.2
done
psql -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', '1001', 'created', '{\"total\": 42}'),
                ('order', '1001', 'paid', '{\"amount\": 42}'),
                ('customer', '7', 'registered', '{\"name\": \"Ada\"}')"
echo "inserted 3 rows; try more with:"
echo "  psql $PGOUTBOX_DATABASE_URL -c \"INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'shipped', '{}')\""
target/release/examples/tail &
pids+=($!)
wait
