#!/usr/bin/env python3
"""nats-server's CPU per message for the headers of a drained, a replayed and a seeded row.

In scripts/measure-replay.sh (CPU=1) nats-server spent 23-43 % more CPU per message on a
replay's messages than on the drain's, and 28-60 % more on a backfill's, with the same
batching (about 50 messages per read). This isolates the headers: one raw-socket publisher
(RawPublisher below), pipelined single publishes with up to --inflight
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
import atexit
import base64
import ctypes
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Optional

try:
    import nats
except ImportError:  # pragma: no cover - message for humans
    sys.exit("nats-py is required: pip install nats-py")

CLK_TCK = os.sysconf("SC_CLK_TCK")


# nats-server, the client and the raw publisher (from the atomic- and fast-batch scripts,
# removed with the features they measured; git has them).

def _free_loopback_port() -> int:
    # Bind to port 0 and let the kernel choose; the tiny race until
    # nats-server binds it is acceptable for a measurement script.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child before exec: ask the kernel to SIGKILL nats-server if
    # this script dies without running its cleanup (e.g. SIGKILL), so no
    # server is ever left behind.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class NatsServer:
    """One nats-server -js process on a free loopback port with its own store."""

    def __init__(self, binary: str):
        self.binary = os.path.abspath(binary)
        self.proc: Optional[subprocess.Popen] = None
        self.tmpdir: Optional[str] = None
        self.port = 0
        self.version_cli = ""

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=10)
        self.version_cli = (out.stdout or out.stderr).strip()
        self.tmpdir = tempfile.mkdtemp(prefix="measure-header-shapes-")
        self.port = _free_loopback_port()
        log = open(os.path.join(self.tmpdir, "server.log"), "wb")
        self.proc = subprocess.Popen(
            [self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port),
             "-sd", os.path.join(self.tmpdir, "store"), "-n", "measure-header-shapes"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        log.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited early, log:\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"nats-server did not listen on {self.port}, log:\n{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(os.path.join(self.tmpdir or "", "server.log"), errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def cpu_seconds(self) -> float:
        # utime + stime of the server process (fields 14 and 15 of
        # /proc/<pid>/stat; split after the ')' of the command name, which
        # may itself contain spaces).
        with open(f"/proc/{self.proc.pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / CLK_TCK

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


# --------------------------------------------------------------------------
# Client: raw publishes with our own reply inbox
# --------------------------------------------------------------------------


def make_payload(size: int) -> bytes:
    # Incompressible-looking ASCII, like a JSON outbox row.
    return os.urandom(size // 2 + 1).hex()[:size].encode()




def run_against_server(server: str, measure) -> int:
    """Starts nats-server, runs `measure(srv)` (a coroutine) against it, and stops the
    server whatever happens: an exception, SIGTERM or SIGHUP."""
    srv = NatsServer(server)
    atexit.register(srv.stop)  # also on uncaught exceptions

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)  # unwinds through finally/atexit

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        srv.start()
        asyncio.run(measure(srv))
    finally:
        srv.stop()
    return 0



class Client:
    """nats-py connection with one wildcard reply subscription (prefix.>).

    Replies to single publishes resolve futures by token; replies to fast
    batches (subject prefix.<bid>....$FI) go to that batch's queue.
    """

    def __init__(self) -> None:
        self.nc = None
        self.prefix = ""
        self.futs: dict[str, asyncio.Future] = {}
        self.batches: dict[str, asyncio.Queue] = {}
        self.counter = 0

    async def connect(self, url: str, prefix: Optional[str] = None) -> None:
        async def quiet(_e):  # connection errors at shutdown are expected
            pass

        self.nc = await nats.connect(url, allow_reconnect=False, error_cb=quiet,
                                     pending_size=64 * 1024 * 1024)
        self.prefix = prefix or f"_INBOX.{uuid.uuid4().hex[:12]}"
        await self.nc.subscribe(self.prefix + ".>", cb=self._on_reply, pending_msgs_limit=1_000_000,
                                pending_bytes_limit=256 * 1024 * 1024)

    @property
    def server_version(self) -> str:
        return self.nc._server_info.get("version", "?")

    async def _on_reply(self, msg) -> None:
        rest = msg.subject[len(self.prefix) + 1:]
        body = json.loads(msg.data) if msg.data else {}
        if rest.endswith(".$FI"):
            q = self.batches.get(rest.split(".", 1)[0])
            if q is not None:
                q.put_nowait(body)
            return
        fut = self.futs.pop(rest, None)
        if fut is not None and not fut.done():
            fut.set_result(body)

    async def request(self, subject: str, payload: bytes, headers: dict) -> asyncio.Future:
        self.counter += 1
        token = str(self.counter)
        fut = asyncio.get_running_loop().create_future()
        self.futs[token] = fut
        await self.nc.publish(subject, payload, reply=f"{self.prefix}.{token}", headers=headers)
        return fut

    def open_batch(self, bid: str) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.batches[bid] = q
        return q

    async def batch_publish(self, subject: str, payload: bytes, headers: Optional[dict], bid: str,
                            seq: int, op: int, flow: int = 500, gap: str = "fail") -> None:
        reply = f"{self.prefix}.{bid}.{flow}.{gap}.{seq}.{op}.$FI"
        await self.nc.publish(subject, payload, reply=reply, headers=headers)

    async def api(self, subject: str, body: Optional[dict] = None) -> dict:
        data = json.dumps(body).encode() if body is not None else b""
        msg = await self.nc.request(subject, data, timeout=10)
        return json.loads(msg.data)

    async def create_stream(self, name: str, **cfg) -> dict:
        config = {"name": name, "subjects": [f"{name}.>"], "storage": "file",
                  "allow_batched": True, **cfg}
        resp = await self.api(f"$JS.API.STREAM.CREATE.{name}", config)
        if "error" in resp:
            raise RuntimeError(f"stream create {name}: {resp['error']}")
        return resp

    async def stored_ids(self, name: str) -> list[str]:
        """Nats-Msg-Id (or '-') of every stored message, in stream order."""
        info = await self.api(f"$JS.API.STREAM.INFO.{name}")
        st = info["state"]
        ids = []
        for seq in range(st["first_seq"], st["last_seq"] + 1) if st["messages"] else []:
            r = await self.api(f"$JS.API.STREAM.MSG.GET.{name}", {"seq": seq})
            if "error" in r:
                continue
            hdrs = r["message"].get("hdrs")
            mid = "-"
            if hdrs:
                for line in base64.b64decode(hdrs).decode(errors="replace").split("\r\n"):
                    if line.lower().startswith("nats-msg-id:"):
                        mid = line.split(":", 1)[1].strip()
            ids.append(mid)
        return ids

    async def stream_msgs(self, name: str) -> int:
        return (await self.api(f"$JS.API.STREAM.INFO.{name}"))["state"]["messages"]

    async def delete_stream(self, name: str) -> None:
        await self.api(f"$JS.API.STREAM.DELETE.{name}")

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()




class RawPublisher(asyncio.Protocol):
    """The NATS protocol over a plain socket, for the throughput runs.

    nats-py spends ~20 µs of client CPU per request (a future, a callback),
    which would bound the single-publish mode well below what pgoutbox's
    Rust client reaches; this writes HPUB frames in bulk and only counts
    and classifies the replies (MSG on one wildcard inbox).
    """

    def __init__(self) -> None:
        self.transport = None
        self.buf = bytearray()
        self.inbox = f"_INBOX.{uuid.uuid4().hex[:12]}"
        self.on_reply = lambda subject, body: None
        self.ready = asyncio.get_running_loop().create_future()
        self.wake = asyncio.Event()

    @classmethod
    async def open(cls, url: str) -> "RawPublisher":
        host, port = url.rsplit("/", 1)[1].split(":")
        _, proto = await asyncio.get_running_loop().create_connection(cls, host, int(port))
        await asyncio.wait_for(proto.ready, 5)
        return proto

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        buf = self.buf
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            line = bytes(buf[pos:eol])
            if line.startswith(b"MSG "):
                parts = line.split()
                size = int(parts[-1])
                if len(buf) < eol + 2 + size + 2:
                    break
                self.on_reply(parts[1].decode(), bytes(buf[eol + 2:eol + 2 + size]))
                pos = eol + 2 + size + 2
                continue
            pos = eol + 2
            if line.startswith(b"INFO"):
                self.transport.write(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,'
                                     b'"no_responders":true,"protocol":1}\r\n'
                                     + f"SUB {self.inbox}.> 1\r\nPING\r\n".encode())
            elif line == b"PING":
                self.transport.write(b"PONG\r\n")
            elif line == b"PONG" and not self.ready.done():
                self.ready.set_result(None)
            elif line.startswith(b"-ERR"):
                raise RuntimeError(line.decode())
        del buf[:pos]
        self.wake.set()

    def hpub(self, subject: str, reply: str, headers: dict, payload: bytes) -> bytes:
        hdr = ("NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
        return (f"HPUB {subject} {reply} {len(hdr)} {len(hdr) + len(payload)}\r\n".encode()
                + hdr + payload + b"\r\n")

    async def wait(self) -> None:
        await asyncio.wait_for(self.wake.wait(), 30)
        self.wake.clear()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def publish_pipelined(raw: RawPublisher, frame, n: int, inflight: int) -> list[bytes]:
    """Sends `frame(0)` .. `frame(n - 1)`, each an HPUB with its own reply, keeping at most
    `inflight` acks outstanding, and waits for every ack; returns the refusals and duplicates."""
    acked, errors = 0, []

    def on_reply(_subject: str, body: bytes) -> None:
        nonlocal acked
        acked += 1
        if b'"error"' in body or b"duplicate" in body:
            errors.append(body)

    raw.on_reply = on_reply
    sent = 0
    while sent < n:
        room = min(inflight - (sent - acked), n - sent)
        if room > 0:
            raw.transport.write(b"".join(frame(sent + i) for i in range(room)))
            sent += room
        await raw.wait()
    while acked < n:
        await raw.wait()
    return errors




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
    errors = await publish_pipelined(raw, frames.__getitem__, n, inflight)
    t1, cpu1 = time.perf_counter(), srv.cpu_seconds()
    stored = await cl.stream_msgs(stream)
    if errors or stored != n:
        raise RuntimeError(f"{shape}: {len(errors)} refused (first: {errors[:1]}), stored {stored}/{n}")
    return n / (t1 - t0), (cpu1 - cpu0) * 1e6 / n, header_bytes


async def measure(args, srv) -> None:
    cl = Client()
    await cl.connect(srv.url)
    payload = make_payload(args.payload)
    shapes = ["drain", "replay", "seed"]
    results: dict[str, list[tuple[float, float, float]]] = {s: [] for s in shapes}
    try:
        print(f"server {cl.server_version} on {srv.url}, load {os.getloadavg()}", file=sys.stderr)
        for r in range(1, args.runs + 1):
            for shape in shapes:
                name = f"SHAPE{shape.upper()}{r}"
                await cl.create_stream(name, allow_batched=False, duplicate_window=120_000_000_000)
                raw = await RawPublisher.open(srv.url)
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
    return run_against_server(args.server, lambda srv: measure(args, srv))


if __name__ == "__main__":
    sys.exit(main())
