#!/usr/bin/env python3
"""Samples how long each process of a latency run ran and waited for a core.

Every 100 ms, for each process of interest (pgoutbox, the walsenders, nats-server,
pg_recvlogical, pgbench and its backends, the benchmark's hog), sums its threads'
/proc/<pid>/task/<tid>/schedstat: nanoseconds on a core and nanoseconds runnable but
waiting for one (run-queue delay). Writes CSV lines `unix time,role,pid,run ns,wait ns`
to stdout until killed. Lined up with the benchmark's per-transaction dumps
(PGOUTBOX_BENCH_DUMP, commit time in Unix seconds), it says which process lost the
scheduler's share when a step's latency rose:

    python3 scripts/sched-sample.py > /tmp/sched.csv &
    PGOUTBOX_BENCH_DUMP=/tmp/dump target/release/deps/pgoutbox-<hash> --bench --small-transactions
"""
import os
import sys
import time


def role(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if comm == "postgres":
        if "walsender" in cmdline:
            return "walsender"
        auxiliary = ("checkpointer", "background writer", "walwriter", "autovacuum",
                     "logical replication", "stats", "archiver", "startup", "io worker")
        if cmdline.startswith("postgres: ") and not any(a in cmdline for a in auxiliary):
            return "backend"
        return None
    if comm in ("pgoutbox", "nats-server", "pg_recvlogical", "pgbench", "sha256sum"):
        return comm
    return None


def schedstat(pid):
    run = wait = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            run += int(fields[0])
            wait += int(fields[1])
    except (OSError, IndexError, ValueError):
        return None
    return run, wait


def main():
    roles = {}
    out = sys.stdout
    while True:
        now = time.time()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if pid not in roles:
                roles[pid] = role(pid)
            if roles[pid] is None:
                continue
            stat = schedstat(pid)
            if stat is not None:
                out.write(f"{now:.3f},{roles[pid]},{pid},{stat[0]},{stat[1]}\n")
        out.flush()
        time.sleep(max(0.0, 0.1 - (time.time() - now)))


if __name__ == "__main__":
    try:
        main()
    except (KeyboardInterrupt, BrokenPipeError):
        pass
