#!/usr/bin/env python3
"""nats-server's CPU per message for the headers of a drained, a replayed and a seeded row.

In scripts/measure-replay.sh (CPU=1) nats-server spent 23-43 % more CPU per message on a
replay's messages than on the drain's, and 28-60 % more on a backfill's, with the same
batching (about 50 messages per read). This isolates the headers: one raw-socket publisher
(RawPublisher of measure-fast-batch.py), pipelined single publishes with up to --inflight
acks outstanding as pgoutbox keeps them, the same payload, each run on a new stream that is
deleted afterwards, the shapes interleaved (drain, replay, seed, drain, ...):

  drain   Nats-Expected-Last-Sequence, Nats-Expected-Last-Msg-Id (the previous row's id),
          Pgoutbox-Position (an LSN), Pgoutbox-Source, Nats-Msg-Id (a UUID), Pgoutbox-Table
  replay  the same, both ids prefixed `replay:<replay id>/<index>:`, plus Pgoutbox-Replay
  seed    the drain's, at position `0/0:<index>`, plus Pgoutbox-Seed

Usage:
  pip install nats-py
  python3 scripts/measure-header-shapes.py --server /var/tmp/pgoutbox-nats/2.15/nats-server
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import time
import uuid


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(os.path.abspath(__file__)), file))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_fast = _load("measure_fast_batch", "measure-fast-batch.py")
_atomic = sys.modules["measure_atomic_batch"]

REPLAY_ID = "r1795820260-d70dd8322d510196"
SOURCE = "7712989518969731786/1/postgres/drain"


def headers(shape: str, i: int, ids: list[str]) -> dict:
    """The headers pgoutbox puts on the i-th message (0-based) of a new stream."""
    def msg_id(k: int) -> str:
        return f"replay:{REPLAY_ID}/{k + 1}:{ids[k]}" if shape == "replay" else ids[k]

    h = {"Nats-Expected-Last-Sequence": str(i)}
    if i == 0:
        h["Pgoutbox-Chain"] = "anchor"
    else:
        h["Nats-Expected-Last-Msg-Id"] = msg_id(i - 1)
    h["Pgoutbox-Position"] = f"0/0:{i}" if shape == "seed" else f"0/{0x1A2B0000 + i * 400:X}:0"
    h["Pgoutbox-Source"] = SOURCE
    if shape == "seed":
        h["Pgoutbox-Seed"] = "0/1A2B3C4D"
    if shape == "replay":
        h["Pgoutbox-Replay"] = REPLAY_ID
    h["Nats-Msg-Id"] = msg_id(i)
    h["Pgoutbox-Table"] = "public.outbox"
    return h


async def run(raw, cl, srv, stream: str, shape: str, n: int, payload: bytes, inflight: int):
    subject = f"{stream}.order.created"
    ids = [str(uuid.uuid4()) for _ in range(n)]
    frames = [raw.hpub(subject, f"{raw.inbox}.{i}", headers(shape, i, ids), payload) for i in range(n)]
    header_bytes = statistics.mean(len(f) - len(payload) for f in frames[1:])
    # Built before the clock starts: the server's CPU is what is compared, not Python's.
    cpu0, t0 = srv.cpu_seconds(), time.perf_counter()
    errors = await _fast.publish_pipelined(raw, frames.__getitem__, n, inflight)
    t1, cpu1 = time.perf_counter(), srv.cpu_seconds()
    stored = await cl.stream_msgs(stream)
    if errors or stored != n:
        raise RuntimeError(f"{shape}: {len(errors)} refused (first: {errors[:1]}), stored {stored}/{n}")
    return n / (t1 - t0), (cpu1 - cpu0) * 1e6 / n, header_bytes


async def measure(args, srv) -> None:
    cl = _fast.Client()
    await cl.connect(srv.url)
    payload = _atomic.make_payload(args.payload)
    shapes = ["drain", "replay", "seed"]
    results: dict[str, list[tuple[float, float, float]]] = {s: [] for s in shapes}
    try:
        print(f"server {cl.server_version} on {srv.url}, load {os.getloadavg()}", file=sys.stderr)
        for r in range(1, args.runs + 1):
            for shape in shapes:
                name = f"SHAPE{shape.upper()}{r}"
                await cl.create_stream(name, allow_batched=False, duplicate_window=120_000_000_000)
                raw = await _fast.RawPublisher.open(srv.url)
                try:
                    res = await run(raw, cl, srv, name, shape, args.n, payload, args.inflight)
                finally:
                    raw.close()
                await cl.delete_stream(name)
                results[shape].append(res)
                print(f"  run {r} {shape}: {res[0]:,.0f} msgs/s, server {res[1]:.2f} µs CPU/msg, "
                      f"{res[2]:.0f} B of headers", file=sys.stderr)
        print(f"\nnats-server {cl.server_version}: {args.n:,} messages of {args.payload} B per run, "
              f"{args.runs} runs interleaved (median), <= {args.inflight} acks in flight\n")
        print("| headers | bytes | msgs/s | server CPU µs/msg | × drain's CPU (median of per-run ratios) |")
        print("|---|---:|---:|---:|---:|")
        for shape in shapes:
            rs = results[shape]
            ratio = statistics.median(s[1] / d[1] for s, d in zip(rs, results["drain"]))
            print(f"| {shape} | {statistics.median(x[2] for x in rs):.0f} | "
                  f"{statistics.median(x[0] for x in rs):,.0f} | {statistics.median(x[1] for x in rs):.2f} | "
                  f"{ratio:.2f} |")
    finally:
        await cl.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True, help="path to the nats-server binary")
    p.add_argument("--n", type=int, default=100_000, help="messages per run (default 100000)")
    p.add_argument("--payload", type=int, default=300, help="payload bytes (default 300)")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs per shape (default 3)")
    p.add_argument("--inflight", type=int, default=1024, help="max acks outstanding (default 1024)")
    args = p.parse_args()
    return _atomic.run_against_server(args.server, lambda srv: measure(args, srv))


if __name__ == "__main__":
    sys.exit(main())
