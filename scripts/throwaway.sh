# Sourced by the measure-*.sh scripts: a work directory, two free loopback ports, and a
# cleanup on exit that kills the processes in `pids` and stops the PostgreSQL in
# "$work/pg". PostgreSQL refuses to run as root: `as_pg` runs its tools as postgres then.
# Sets pgbin, work, as_pg, pg_port, nats_port, pids. $1 names the work directory.
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
work=$(mktemp -d "/tmp/$1.XXXXXX")
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
