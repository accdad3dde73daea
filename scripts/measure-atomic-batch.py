#!/usr/bin/env python3
"""Measure NATS JetStream atomic batch publish against pipelined single publishes.

Answers, for one nats-server binary (2.12+ for atomic batches):

  * throughput (msgs/s) and nats-server CPU seconds per 1,000 messages for
      (a) pipelined single publishes, each with its own pub ack, up to
          --inflight acks outstanding, and
      (b) atomic batches of --batch-size messages (only the commit message
          asks for an ack), up to --batch-inflight commits outstanding;
  * latency of one 100-message unit (first publish -> all acks received);
  * semantics of atomic batches that matter to an outbox relay (duplicate
    Nats-Msg-Id, Nats-Expected-Last-* headers, max_msg_size, abandoned
    batches, batch size / in-flight limits).

The script starts its own nats-server (-js, loopback, free port, temporary
store directory) and always kills it and removes the directory at exit.

Protocol (ADR-50, nats-server server/stream.go processJetStreamBatchMsg):
  stream config "allow_atomic": true; every message of a batch carries
  Nats-Batch-Id (<= 64 chars) and Nats-Batch-Sequence (1..n, no gaps); the
  last one also Nats-Batch-Commit: 1 and gets a pub ack with "batch" and
  "count".  Earlier messages are answered (empty body) only if they carry a
  reply subject, so a fast publisher sends them without one.

Usage:
  pip install nats-py
  python3 scripts/measure-atomic-batch.py --server /var/tmp/pgoutbox-nats/2.12/nats-server
  python3 scripts/measure-atomic-batch.py --server ... --n 2000   # quick run

Needs Linux (/proc/<pid>/stat for the server's CPU time).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
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
from dataclasses import dataclass, field
from typing import Optional

try:
    import nats
except ImportError:  # pragma: no cover - message for humans
    sys.exit("nats-py is required: pip install nats-py")

CLK_TCK = os.sysconf("SC_CLK_TCK")

H_MSG_ID = "Nats-Msg-Id"
H_BATCH_ID = "Nats-Batch-Id"
H_BATCH_SEQ = "Nats-Batch-Sequence"
H_BATCH_COMMIT = "Nats-Batch-Commit"
H_EXP_LAST_SEQ = "Nats-Expected-Last-Sequence"
H_EXP_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
ADVISORY_ABANDONED = "$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED"


# --------------------------------------------------------------------------
# nats-server process
# --------------------------------------------------------------------------


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
        self.tmpdir = tempfile.mkdtemp(prefix="measure-atomic-batch-")
        self.port = _free_loopback_port()
        log = open(os.path.join(self.tmpdir, "server.log"), "wb")
        self.proc = subprocess.Popen(
            [self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port),
             "-sd", os.path.join(self.tmpdir, "store"), "-n", "measure-atomic-batch"],
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


@dataclass
class Reply:
    """What came back on a reply subject (or didn't)."""

    kind: str  # "ack", "error", "empty", "status", "none"
    data: dict = field(default_factory=dict)

    def __str__(self) -> str:
        if self.kind == "ack":
            d = self.data
            extra = "".join(f" {k}={d[k]}" for k in ("batch", "count", "duplicate") if k in d)
            return f"ack seq={d.get('seq')}{extra}"
        if self.kind == "error":
            e = self.data
            return f"error {e.get('code')}/{e.get('err_code')} \"{e.get('description')}\""
        if self.kind == "empty":
            return "empty reply"
        if self.kind == "status":
            return f"status {self.data.get('status')}"
        return "no reply"


def parse_reply(msg) -> Reply:
    if msg.headers and msg.headers.get("Status"):
        return Reply("status", {"status": msg.headers.get("Status")})
    if not msg.data:
        return Reply("empty")
    resp = json.loads(msg.data)
    if "error" in resp:
        return Reply("error", resp["error"])
    return Reply("ack", resp)


class Client:
    """nats-py connection plus one wildcard reply subscription.

    nats-py's JetStream publish_async also uses one wildcard inbox, but it
    raises on empty (non-JSON) replies and hides error details; batches need
    both, so both modes use this same minimal mechanism (same client cost).
    """

    def __init__(self, storage: str = "file") -> None:
        self.storage = storage
        self.nc = None
        self.prefix = ""
        self.futs: dict[str, asyncio.Future] = {}
        self.counter = 0

    async def connect(self, url: str) -> None:
        async def quiet(_e):  # connection errors at shutdown are expected
            pass

        self.nc = await nats.connect(url, allow_reconnect=False, error_cb=quiet,
                                     pending_size=8 * 1024 * 1024)
        self.prefix = self.nc.new_inbox()
        await self.nc.subscribe(self.prefix + ".*", cb=self._on_reply)

    @property
    def server_version(self) -> str:
        return self.nc._server_info.get("version", "?")  # from the INFO line

    async def _on_reply(self, msg) -> None:
        fut = self.futs.pop(msg.subject[len(self.prefix) + 1:], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    async def publish(self, subject: str, payload: bytes, headers: dict,
                      reply: bool) -> Optional[asyncio.Future]:
        """Publish; if reply, return a future resolved with the raw reply Msg."""
        if not reply:
            await self.nc.publish(subject, payload, headers=headers)
            return None
        self.counter += 1
        token = str(self.counter)
        fut = asyncio.get_running_loop().create_future()
        self.futs[token] = fut
        await self.nc.publish(subject, payload, reply=f"{self.prefix}.{token}", headers=headers)
        return fut

    async def wait_reply(self, fut: Optional[asyncio.Future], timeout: float = 2.0) -> Reply:
        if fut is None:
            return Reply("none")
        try:
            return parse_reply(await asyncio.wait_for(fut, timeout))
        except asyncio.TimeoutError:
            return Reply("none")

    async def api(self, subject: str, body: Optional[dict] = None) -> dict:
        data = json.dumps(body).encode() if body is not None else b""
        msg = await self.nc.request(subject, data, timeout=10)
        return json.loads(msg.data)

    async def create_stream(self, name: str, **cfg) -> dict:
        config = {"name": name, "subjects": [f"{name}.>"], "storage": self.storage,
                  "allow_atomic": True, **cfg}
        resp = await self.api(f"$JS.API.STREAM.CREATE.{name}", config)
        if "error" in resp:
            raise RuntimeError(f"stream create {name}: {resp['error']}")
        return resp

    async def stream_msgs(self, name: str) -> int:
        resp = await self.api(f"$JS.API.STREAM.INFO.{name}")
        return resp["state"]["messages"]

    async def last_seq(self, name: str) -> int:
        resp = await self.api(f"$JS.API.STREAM.INFO.{name}")
        return resp["state"]["last_seq"]

    async def delete_stream(self, name: str) -> None:
        await self.api(f"$JS.API.STREAM.DELETE.{name}")

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()


# --------------------------------------------------------------------------
# Throughput
# --------------------------------------------------------------------------


@dataclass
class RunResult:
    msgs_per_s: float
    server_cpu_per_k: float
    client_cpu_per_k: float


def make_payload(size: int) -> bytes:
    # Incompressible-looking ASCII, like a JSON outbox row.
    return os.urandom(size // 2 + 1).hex()[:size].encode()


async def run_single(cl: Client, srv: NatsServer, stream: str, n: int, payload: bytes,
                     inflight: int) -> RunResult:
    """(a) one request per message, at most `inflight` acks outstanding."""
    subj = f"{stream}.e"
    sem = asyncio.Semaphore(inflight)
    errors: list[str] = []
    done = asyncio.get_running_loop().create_future()
    remaining = n

    def on_done(fut: asyncio.Future) -> None:
        nonlocal remaining
        sem.release()
        r = parse_reply(fut.result())
        if r.kind != "ack" or r.data.get("duplicate"):
            errors.append(str(r))
        remaining -= 1
        if remaining == 0 and not done.done():
            done.set_result(None)

    cpu0, ccpu0, t0 = srv.cpu_seconds(), time.process_time(), time.perf_counter()
    for i in range(n):
        await sem.acquire()
        fut = await cl.publish(subj, payload, {H_MSG_ID: f"{stream}-{i}"}, reply=True)
        fut.add_done_callback(on_done)
    await asyncio.wait_for(done, 120)
    t1, cpu1, ccpu1 = time.perf_counter(), srv.cpu_seconds(), time.process_time()

    stored = await cl.stream_msgs(stream)
    if errors or stored != n:
        raise RuntimeError(f"single run: {len(errors)} bad acks (first: {errors[:1]}), stored {stored}/{n}")
    return RunResult(n / (t1 - t0), (cpu1 - cpu0) * 1000 / n, (ccpu1 - ccpu0) * 1000 / n)


async def publish_batch(cl: Client, subj: str, msgs: list[tuple[dict, bytes]],
                        reply_all: bool = False, commit: bool = True,
                        batch_id: Optional[str] = None) -> list[Optional[asyncio.Future]]:
    """Publish msgs as one atomic batch; returns one future (or None) per message.

    Only the commit message asks for a reply unless reply_all is set.
    """
    bid = batch_id or uuid.uuid4().hex
    futs = []
    last = len(msgs)
    for i, (extra, payload) in enumerate(msgs, 1):
        hdrs = {H_BATCH_ID: bid, H_BATCH_SEQ: str(i), **extra}
        is_commit = commit and i == last
        if is_commit:
            hdrs[H_BATCH_COMMIT] = "1"
        futs.append(await cl.publish(subj, payload, hdrs, reply=reply_all or is_commit))
    return futs


async def run_batched(cl: Client, srv: NatsServer, stream: str, n: int, payload: bytes,
                      batch_size: int, batch_inflight: int) -> RunResult:
    """(b) atomic batches; at most `batch_inflight` commit acks outstanding."""
    subj = f"{stream}.e"
    sem = asyncio.Semaphore(batch_inflight)
    errors: list[str] = []
    done = asyncio.get_running_loop().create_future()
    starts = list(range(0, n, batch_size))
    remaining = len(starts)

    def on_done(fut: asyncio.Future, expect: int) -> None:
        nonlocal remaining
        sem.release()
        r = parse_reply(fut.result())
        if r.kind != "ack" or r.data.get("count") != expect:
            errors.append(str(r))
        remaining -= 1
        if remaining == 0 and not done.done():
            done.set_result(None)

    cpu0, ccpu0, t0 = srv.cpu_seconds(), time.process_time(), time.perf_counter()
    for start in starts:
        await sem.acquire()
        msgs = [({H_MSG_ID: f"{stream}-{i}"}, payload) for i in range(start, min(start + batch_size, n))]
        fut = (await publish_batch(cl, subj, msgs))[-1]
        fut.add_done_callback(lambda f, k=len(msgs): on_done(f, k))
    await asyncio.wait_for(done, 120)
    t1, cpu1, ccpu1 = time.perf_counter(), srv.cpu_seconds(), time.process_time()

    stored = await cl.stream_msgs(stream)
    if errors or stored != n:
        raise RuntimeError(f"batch run: {len(errors)} bad acks (first: {errors[:1]}), stored {stored}/{n}")
    return RunResult(n / (t1 - t0), (cpu1 - cpu0) * 1000 / n, (ccpu1 - ccpu0) * 1000 / n)


# --------------------------------------------------------------------------
# Latency
# --------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    # Nearest-rank percentile; enough for 200 samples.
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


async def latency(cl: Client, stream: str, units: int, unit: int, payload: bytes,
                  batched: bool) -> tuple[float, float]:
    """One unit of `unit` messages at a time; time first publish -> last ack."""
    subj = f"{stream}.e"
    samples = []
    for u in range(units):
        msgs = [({H_MSG_ID: f"{stream}-{u}-{i}"}, payload) for i in range(unit)]
        t0 = time.perf_counter()
        if batched:
            futs = [f for f in await publish_batch(cl, subj, msgs) if f is not None]
        else:
            futs = [await cl.publish(subj, p, h, reply=True) for h, p in msgs]
        replies = [parse_reply(m) for m in await asyncio.wait_for(asyncio.gather(*futs), 30)]
        samples.append(time.perf_counter() - t0)
        bad = [r for r in replies if r.kind != "ack"]
        if bad:
            raise RuntimeError(f"latency unit {u}: {bad[0]}")
    return percentile(samples, 50) * 1000, percentile(samples, 99) * 1000


# --------------------------------------------------------------------------
# Semantics
# --------------------------------------------------------------------------


class Semantics:
    """Each check prints 'name: result'. Streams are created per check."""

    def __init__(self, cl: Client, payload: bytes, abandon_wait: float):
        self.cl = cl
        self.payload = payload
        self.abandon_wait = abandon_wait
        self.lines: list[tuple[str, str]] = []
        self.n = 0

    def out(self, name: str, result: str) -> None:
        self.lines.append((name, result))
        print(f"  {name}: {result}", file=sys.stderr, flush=True)

    async def fresh(self, **cfg) -> str:
        self.n += 1
        name = f"SEM{self.n}"
        await self.cl.create_stream(name, **cfg)
        return name

    def msgs(self, tag: str, k: int) -> list[tuple[dict, bytes]]:
        return [({H_MSG_ID: f"{tag}-{i}"}, self.payload) for i in range(1, k + 1)]

    async def single(self, stream: str, msg_id: str) -> Reply:
        fut = await self.cl.publish(f"{stream}.e", self.payload, {H_MSG_ID: msg_id}, reply=True)
        return await self.cl.wait_reply(fut)

    async def batch_outcome(self, stream: str, msgs, reply_all=False) -> tuple[Reply, int, list[Reply]]:
        """Publish a batch; return (commit reply, messages stored by it, all replies)."""
        before = await self.cl.stream_msgs(stream)
        futs = await publish_batch(self.cl, f"{stream}.e", msgs, reply_all=reply_all)
        replies = [await self.cl.wait_reply(f) for f in futs]
        return replies[-1], await self.cl.stream_msgs(stream) - before, replies

    async def run(self) -> None:
        await self.replies_to_non_commit()
        await self.duplicate_ids()
        await self.expected_last_seq()
        await self.expected_last_msg_id()
        await self.max_msg_size()
        await self.size_limit()
        await self.inflight_limit()
        await self.abandoned()

    async def replies_to_non_commit(self) -> None:
        s = await self.fresh()
        commit, stored, replies = await self.batch_outcome(s, self.msgs("r", 5), reply_all=True)
        kinds = sorted({str(r) for r in replies[:-1]})
        self.out("non-commit batch msgs published WITH a reply subject",
                 f"each answered with: {', '.join(kinds)}; commit: {commit}; stored {stored}/5")
        commit, stored, replies = await self.batch_outcome(s, self.msgs("r2", 5), reply_all=False)
        self.out("non-commit batch msgs published WITHOUT a reply subject",
                 f"nothing can come back for them; commit: {commit}; stored {stored}/5")

    async def duplicate_ids(self) -> None:
        s = await self.fresh()
        await self.single(s, "already-stored")
        msgs = self.msgs("d", 5)
        msgs[2] = ({H_MSG_ID: "already-stored"}, self.payload)
        commit, stored, _ = await self.batch_outcome(s, msgs)
        self.out("duplicate Nats-Msg-Id (stored before) as msg 3 of 5",
                 f"commit: {commit}; stored {stored}/5")

        msgs = self.msgs("d2", 5)
        msgs[3] = ({H_MSG_ID: "d2-2"}, self.payload)
        commit, stored, _ = await self.batch_outcome(s, msgs)
        self.out("duplicate Nats-Msg-Id within the same batch (msgs 2 and 4)",
                 f"commit: {commit}; stored {stored}/5")

        # The relay's retry case: a batch that was committed but whose ack was
        # lost is re-sent verbatim.
        msgs = self.msgs("d3", 5)
        first, stored1, _ = await self.batch_outcome(s, msgs)
        commit, stored, _ = await self.batch_outcome(s, msgs)
        self.out("identical batch re-sent after it was committed (all ids duplicate)",
                 f"first commit: {first} (stored {stored1}); re-send commit: {commit}; stored {stored}/5")

        # Contrast: plain single publish of a duplicate id.
        self.out("plain (non-batch) publish of a duplicate Nats-Msg-Id",
                 str(await self.single(s, "already-stored")))

    async def expected_last_seq(self) -> None:
        s = await self.fresh()
        for i in range(3):
            await self.single(s, f"pre-{i}")

        async def case(pos: int, value_fn) -> tuple[str, int]:
            last = await self.cl.last_seq(s)
            msgs = self.msgs(f"els-{uuid.uuid4().hex[:6]}", 5)
            value = value_fn(last)
            msgs[pos - 1][0][H_EXP_LAST_SEQ] = str(value)
            commit, stored, _ = await self.batch_outcome(s, msgs)
            return f"value={value} (stream last_seq={last}) -> commit: {commit}; stored {stored}/5", stored

        self.out("Nats-Expected-Last-Sequence on msg 1, correct value", (await case(1, lambda l: l))[0])
        self.out("Nats-Expected-Last-Sequence on msg 1, wrong value", (await case(1, lambda l: l + 7))[0])
        self.out("Nats-Expected-Last-Sequence on msg 3, = stream last_seq before batch",
                 (await case(3, lambda l: l))[0])
        self.out("Nats-Expected-Last-Sequence on msg 3, = seq msg 2 of the batch will get",
                 (await case(3, lambda l: l + 2))[0])

    async def expected_last_msg_id(self) -> None:
        s = await self.fresh()
        await self.single(s, "last-id")
        msgs = self.msgs("elm1", 5)
        msgs[0][0][H_EXP_LAST_MSG_ID] = "last-id"
        commit, stored, _ = await self.batch_outcome(s, msgs)
        self.out("Nats-Expected-Last-Msg-Id on msg 1 (correct id)", f"commit: {commit}; stored {stored}/5")

        # For a later message, name the id of the message just before it in
        # the batch; the server refuses the header anywhere in a batch anyway.
        msgs = self.msgs("elm2", 5)
        msgs[2][0][H_EXP_LAST_MSG_ID] = "elm2-2"
        commit, stored, _ = await self.batch_outcome(s, msgs)
        self.out("Nats-Expected-Last-Msg-Id on msg 3 (= id of msg 2)", f"commit: {commit}; stored {stored}/5")

        # Control: the same header (correct id) on a plain publish.
        await self.single(s, "ctl-1")
        fut = await self.cl.publish(f"{s}.e", self.payload,
                                    {H_MSG_ID: "ctl-2", H_EXP_LAST_MSG_ID: "ctl-1"}, reply=True)
        self.out("Nats-Expected-Last-Msg-Id on a plain publish (control)", str(await self.cl.wait_reply(fut)))

    async def max_msg_size(self) -> None:
        s = await self.fresh(max_msg_size=1024)
        big = make_payload(2000)

        msgs = self.msgs("mx", 10)
        msgs[4] = (msgs[4][0], big)
        commit, stored, _ = await self.batch_outcome(s, msgs)
        self.out("2,000-byte msg 5 of 10 (max_msg_size 1024), only commit has reply",
                 f"commit: {commit}; stored {stored}/10")

        msgs = self.msgs("my", 10)
        msgs[4] = (msgs[4][0], big)
        commit, stored, replies = await self.batch_outcome(s, msgs, reply_all=True)
        per = "; ".join(f"{i}: {r}" for i, r in enumerate(replies, 1))
        self.out("same, every msg with a reply subject (per-msg replies)", f"{per}; stored {stored}/10")

    async def size_limit(self) -> None:
        s = await self.fresh()
        small = b"x"
        for k in (1000, 1001):
            msgs = [({H_MSG_ID: f"sz{k}-{i}"}, small) for i in range(1, k + 1)]
            commit, stored, _ = await self.batch_outcome(s, msgs)
            self.out(f"batch of {k:,} messages", f"commit: {commit}; stored {stored}/{k}")

    async def inflight_limit(self) -> None:
        # Open batches (first message only, no commit) on one stream until the
        # server refuses one.
        s = await self.fresh()
        first_refused = None
        for i in range(1, 61):
            futs = await publish_batch(self.cl, f"{s}.e", [({}, self.payload)], reply_all=True, commit=False)
            r = await self.cl.wait_reply(futs[0])
            if r.kind != "empty":
                first_refused = (i, r)
                break
        if first_refused:
            self.out("open (uncommitted) batches per stream", f"batch #{first_refused[0]} refused: {first_refused[1]}")
        else:
            self.out("open (uncommitted) batches per stream", "60 opened, none refused")
        await self.cl.delete_stream(s)  # frees the open batches

    async def abandoned(self) -> None:
        """10 batch msgs, 0.5 s apart, no commit: when is the batch dropped?

        The spacing tells whether the timeout counts from the first message
        or from the last one (idle time).
        """
        s = await self.fresh()
        adv: list[tuple[float, dict]] = []

        async def on_adv(msg):
            adv.append((time.monotonic(), json.loads(msg.data)))

        sub = await self.cl.nc.subscribe(f"{ADVISORY_ABANDONED}.{s}", cb=on_adv)
        bid = uuid.uuid4().hex
        t_first = t_last = 0.0
        acks = []
        for i in range(1, 11):
            fut = await self.cl.publish(f"{s}.e", self.payload,
                                        {H_BATCH_ID: bid, H_BATCH_SEQ: str(i), H_MSG_ID: f"ab-{i}"}, reply=True)
            acks.append(await self.cl.wait_reply(fut))
            t_last = time.monotonic()
            if i == 1:
                t_first = t_last
            if i < 10:
                await asyncio.sleep(0.5)
        deadline = time.monotonic() + self.abandon_wait
        while not adv and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await sub.unsubscribe()
        stored = await self.cl.stream_msgs(s)
        kinds = ", ".join(sorted({str(a) for a in acks}))
        if adv:
            t, body = adv[0]
            res = (f"advisory reason={body.get('reason')!r} {t - t_first:.1f}s after msg 1, "
                   f"{t - t_last:.1f}s after msg 10; stored {stored}/10")
        else:
            res = f"no advisory within {self.abandon_wait:.0f}s after msg 10; stored {stored}/10"
        self.out("batch without commit (10 msgs 0.5s apart)", f"{res}; replies to the 10 msgs: {kinds}")
        fut = await self.cl.publish(f"{s}.e", self.payload,
                                    {H_BATCH_ID: bid, H_BATCH_SEQ: "11", H_BATCH_COMMIT: "1",
                                     H_MSG_ID: "ab-11"}, reply=True)
        r = await self.cl.wait_reply(fut)
        self.out("late commit (msg 11) after that", f"{r}; stored {await self.cl.stream_msgs(s)}")


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


async def measure(args, srv: NatsServer) -> None:
    cl = Client(args.storage)
    await cl.connect(srv.url)
    try:
        payload = make_payload(args.payload)
        version = cl.server_version
        log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
        log(f"server {version} ({srv.version_cli}) on {srv.url}")

        # Does this server know allow_atomic? Older servers silently drop
        # unknown config fields, and would then store batch headers as plain
        # headers, so check the echoed config instead of trusting the request.
        probe = await cl.create_stream("PROBE")
        atomic = bool(probe.get("config", {}).get("allow_atomic"))
        await cl.delete_stream("PROBE")
        if not atomic:
            log("allow_atomic not echoed back: atomic batch publish unsupported, measuring (a) only")

        results: dict[str, list[RunResult]] = {"a": [], "b": []}
        modes = ["a", "b"] if atomic else ["a"]
        for run in range(1, args.runs + 1):
            for mode in modes:
                name = f"TP{mode.upper()}{run}"
                await cl.create_stream(name)
                if mode == "a":
                    r = await run_single(cl, srv, name, args.n, payload, args.inflight)
                else:
                    r = await run_batched(cl, srv, name, args.n, payload, args.batch_size, args.batch_inflight)
                await cl.delete_stream(name)
                results[mode].append(r)
                log(f"  run {run} ({mode}): {r.msgs_per_s:,.0f} msgs/s, server {r.server_cpu_per_k*1000:.1f} ms "
                    f"CPU/1k msgs, client {r.client_cpu_per_k*1000:.1f} ms CPU/1k msgs")

        lat = {}
        for mode in modes:
            name = f"LAT{mode.upper()}"
            await cl.create_stream(name)
            lat[mode] = await latency(cl, name, args.lat_units, args.batch_size, payload, mode == "b")
            await cl.delete_stream(name)
            log(f"  latency ({mode}): p50 {lat[mode][0]:.2f} ms, p99 {lat[mode][1]:.2f} ms")

        sem = None
        if atomic and not args.skip_semantics:
            sem = Semantics(cl, payload, args.abandon_wait)
            await sem.run()

        # ---- report (stdout) ----
        label = {
            "a": f"(a) single publishes, <= {args.inflight:,} acks in flight",
            "b": f"(b) atomic batches of {args.batch_size}, <= {args.batch_inflight} commits in flight",
        }
        print(f"## nats-server {version}\n")
        print(f"`{srv.version_cli}`; N={args.n:,} msgs of {args.payload} B + Nats-Msg-Id, "
              f"{args.runs} runs (median), {args.storage} storage, R1, one connection, nats-py client\n")
        print("| mode | msgs/s | server CPU s / 1k msgs | client CPU s / 1k msgs | "
              f"latency p50 ms ({args.batch_size}-msg unit) | p99 ms |")
        print("|---|---:|---:|---:|---:|---:|")
        for mode in modes:
            rs = results[mode]
            med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
            print(f"| {label[mode]} | {med(lambda r: r.msgs_per_s):,.0f} | "
                  f"{med(lambda r: r.server_cpu_per_k):.4f} | {med(lambda r: r.client_cpu_per_k):.4f} | "
                  f"{lat[mode][0]:.2f} | {lat[mode][1]:.2f} |")
        print()
        if sem is not None:
            print("Semantics:\n")
            for name, res in sem.lines:
                print(f"- {name}: {res}")
        elif not atomic:
            print("- atomic batch publish: not supported by this server (allow_atomic not accepted)")
    finally:
        await cl.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True, help="path to the nats-server binary")
    p.add_argument("--n", type=int, default=50_000, help="messages per throughput run (default 50000)")
    p.add_argument("--payload", type=int, default=250, help="payload bytes (default 250)")
    p.add_argument("--runs", type=int, default=3, help="throughput runs per mode; median is printed")
    p.add_argument("--inflight", type=int, default=1024, help="(a) max acks outstanding")
    p.add_argument("--batch-size", type=int, default=100, help="(b) messages per atomic batch")
    p.add_argument("--batch-inflight", type=int, default=10,
                   help="(b) max commits outstanding (server limit: 50 open batches per stream)")
    p.add_argument("--lat-units", type=int, default=200, help="latency samples per mode")
    p.add_argument("--abandon-wait", type=float, default=30.0,
                   help="seconds to wait for the abandoned-batch advisory")
    p.add_argument("--storage", choices=("file", "memory"), default="file",
                   help="stream storage (default file; R1 file streams also stage batches on disk)")
    p.add_argument("--skip-semantics", action="store_true")
    args = p.parse_args()

    return run_against_server(args.server, lambda srv: measure(args, srv))


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


if __name__ == "__main__":
    sys.exit(main())
