#!/usr/bin/env python3
"""Measure NATS JetStream fast-ingest batches (2.14+) against pipelined single publishes.

Answers, for one nats-server binary (2.14+ for fast ingest):

  * semantics that matter to an outbox relay: the server's replies to a
    fast batch carrying a stored or repeated Nats-Msg-Id (first message or
    later), Nats-Expected-Last-Msg-Id and Nats-Expected-Last-Sequence
    chains (right and wrong), a message over the stream's max_msg_size, a
    gap in gap mode "fail" and "ok", a batch continued on a new connection
    after the first one was lost, and what is stored afterwards;
  * throughput (msgs/s) and nats-server CPU per message, measured
    interleaved (a, b, c, a, b, c, ...) over a raw-socket publisher:
      (a) pipelined single publishes, each with its own pub ack, up to
          --inflight acks outstanding (what pgoutbox does), and
      (b) fast-ingest batches of --batch-size messages (0: one batch for the
          whole run), at most --outstanding flow acks outstanding (ADR-50's
          recommended 2), ended by a commit message that gets the pub ack;
      (c) the same with --outstanding-wide (4) flow acks outstanding.

The script starts its own nats-server (-js, loopback, free port, temporary
store directory; NatsServer from measure-atomic-batch.py) and always kills
it and removes the directory at exit.

Protocol (ADR-50 "Fast-ingest Batch Publishing"; nats-server
server/stream.go getFastBatch, processJetStreamFastBatchMsg and
server/jetstream_batching.go): stream config "allow_batched": true; no
batch headers, everything is in the reply subject
  <prefix>.<batch id>.<max flow>.<gap: ok|fail>.<batch seq>.<op>.$FI
with op 0 start (seq 1), 1 append, 2 commit (store and end), 3 commit
without storing this message (EOB), 4 ping.  The server answers on the
reply subject of the message concerned with JSON
{"type":"ack","seq":S,"msgs":N} (flow control: S persisted, next ack after
N more), {"type":"gap","last_seq":..,"seq":..}, {"type":"err","seq":..,
"error":{..}}, and a plain pub ack {"stream","seq","batch","count"} (or
{"error":..}) at the end.

Usage:
  pip install nats-py
  python3 scripts/measure-fast-batch.py --server /var/tmp/pgoutbox-nats/2.14/nats-server
  python3 scripts/measure-fast-batch.py --server ... --n 20000 --runs 1   # quick run

Needs Linux (/proc/<pid>/stat for the server's CPU time).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib.util
import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Optional

try:
    import nats
except ImportError:  # pragma: no cover - message for humans
    sys.exit("nats-py is required: pip install nats-py")

_spec = importlib.util.spec_from_file_location(
    "measure_atomic_batch", os.path.join(os.path.dirname(os.path.abspath(__file__)), "measure-atomic-batch.py"))
_atomic = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _atomic  # dataclasses look their module up there
_spec.loader.exec_module(_atomic)
NatsServer = _atomic.NatsServer
make_payload = _atomic.make_payload

H_MSG_ID = "Nats-Msg-Id"
H_EXP_LAST_SEQ = "Nats-Expected-Last-Sequence"
H_EXP_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"

OP_START, OP_APPEND, OP_COMMIT, OP_COMMIT_EOB, OP_PING = range(5)


def describe(d: dict) -> str:
    """One reply, short: ack(seq,msgs) / gap / err / puback / error."""
    t = d.get("type")
    if t == "ack":
        return f"flow-ack seq={d['seq']} msgs={d['msgs']}"
    if t == "gap":
        return f"gap last_seq={d['last_seq']} seq={d['seq']}"
    if t == "err":
        e = d.get("error") or {}
        return f"err seq={d['seq']} {e.get('code')}/{e.get('err_code')} \"{e.get('description')}\""
    if "error" in d:
        e = d["error"]
        return f"error {e.get('code')}/{e.get('err_code')} \"{e.get('description')}\""
    extra = "".join(f" {k}={d[k]}" for k in ("batch", "count", "duplicate") if k in d)
    return f"pub-ack seq={d.get('seq')}{extra}"


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


async def drain_queue(q: asyncio.Queue, wait: float = 0.5) -> list[dict]:
    """Everything that arrives on q until `wait` s pass without a reply."""
    out = []
    while True:
        try:
            out.append(await asyncio.wait_for(q.get(), wait))
        except asyncio.TimeoutError:
            return out


# --------------------------------------------------------------------------
# Semantics
# --------------------------------------------------------------------------


class Semantics:
    def __init__(self, cl: Client, srv: NatsServer, payload: bytes) -> None:
        self.cl, self.srv, self.payload = cl, srv, payload
        self.lines: list[tuple[str, str]] = []
        self.n = 0

    def record(self, name: str, result: str) -> None:
        print(f"  {name}: {result}", file=sys.stderr, flush=True)
        self.lines.append((name, result))

    async def fresh(self, **cfg) -> str:
        self.n += 1
        name = f"SEM{self.n}"
        await self.cl.create_stream(name, **cfg)
        return name

    async def single(self, stream: str, mid: str) -> dict:
        return await asyncio.wait_for(await self.cl.request(f"{stream}.e", self.payload, {H_MSG_ID: mid}), 5)

    async def batch(self, stream: str, msgs: list[tuple[int, dict, bytes]], gap: str = "fail",
                    last_op: int = OP_COMMIT, cl: Optional[Client] = None, bid: Optional[str] = None
                    ) -> tuple[str, list[dict]]:
        """Send (batch seq, headers, payload) in order; the last one with last_op.

        Returns all replies seen until 0.5 s of silence, in arrival order.
        """
        cl = cl or self.cl
        bid = bid or uuid.uuid4().hex[:16]
        q = cl.open_batch(bid)
        replies = []
        for i, (seq, hdrs, body) in enumerate(msgs):
            op = OP_START if seq == 1 else OP_APPEND
            if i == len(msgs) - 1 and last_op is not None:
                op = last_op
            await cl.batch_publish(f"{stream}.e", body, hdrs, bid, seq, op, gap=gap)
            if seq == 1 and op == OP_START:
                # ADR-50: wait for the first reply before going on.
                try:
                    replies.append(await asyncio.wait_for(q.get(), 2))
                except asyncio.TimeoutError:
                    replies.append({"type": "none"})
        replies += await drain_queue(q)
        return bid, replies

    async def show(self, name: str, stream: str, replies: list[dict]) -> None:
        ids = await self.cl.stored_ids(stream)
        rs = "; ".join(describe(r) if r.get("type") != "none" else "no reply" for r in replies) or "no reply"
        self.record(name, f"replies [{rs}] -> stored {ids}")

    def rows(self, ids: list[str], extra: Optional[dict] = None) -> list[tuple[int, dict, bytes]]:
        return [(i, {H_MSG_ID: mid, **((extra or {}).get(mid, {}))}, self.payload)
                for i, mid in enumerate(ids, 1)]

    async def run(self) -> None:
        # 1. Flow control: what N the server starts at and how it ramps.
        s = await self.fresh()
        _, replies = await self.batch(s, self.rows([f"f{i}" for i in range(1, 3001)]))
        flows = [describe(r) for r in replies]
        self.record("flow control, 3,000 msgs asking for 500",
                    f"{len(replies)} replies: {flows[:4]} ... {flows[-2:]}; stored {await self.cl.stream_msgs(s)}")
        s = await self.fresh()
        _, replies = await self.batch(s, self.rows([f"g{i}" for i in range(1, 41)]), last_op=OP_COMMIT)
        self.record("flow control, 40 msgs asking for 500", "; ".join(describe(r) for r in replies))

        # 2. Duplicates.
        s = await self.fresh()
        await self.single(s, "d3")
        _, r = await self.batch(s, self.rows(["d1", "d2", "d3", "d4", "d5"]))
        await self.show("Nats-Msg-Id stored before, 3rd of 5", s, r)
        s = await self.fresh()
        _, r = await self.batch(s, self.rows(["e1", "e2", "e2", "e4", "e5"]))
        await self.show("Nats-Msg-Id repeated inside the batch (2nd and 3rd)", s, r)
        s = await self.fresh()
        await self.single(s, "r1")
        await self.single(s, "r2")
        _, r = await self.batch(s, self.rows(["r1", "r2", "r3", "r4"]))
        await self.show("replay: first 2 of 4 stored before (gap fail)", s, r)
        s = await self.fresh()
        await self.single(s, "q1")
        _, r = await self.batch(s, self.rows(["q1", "q2", "q3"]), gap="ok")
        await self.show("replay: first of 3 stored before (gap ok)", s, r)

        # 3. Expected-last headers on every message (pgoutbox's chain).
        s = await self.fresh()
        await self.single(s, "c0")
        chain = {f"c{i}": {H_EXP_LAST_MSG_ID: f"c{i-1}", H_EXP_LAST_SEQ: str(i)} for i in range(1, 6)}
        _, r = await self.batch(s, self.rows([f"c{i}" for i in range(1, 6)], chain))
        await self.show("Expected-Last-Msg-Id + Expected-Last-Sequence right on all 5", s, r)
        s = await self.fresh()
        await self.single(s, "m0")
        chain = {f"m{i}": {H_EXP_LAST_MSG_ID: f"m{i-1}"} for i in range(1, 6)}
        chain["m3"] = {H_EXP_LAST_MSG_ID: "wrong"}
        _, r = await self.batch(s, self.rows([f"m{i}" for i in range(1, 6)], chain))
        await self.show("Expected-Last-Msg-Id wrong on 3rd of 5 (gap fail)", s, r)
        s = await self.fresh()
        await self.single(s, "n0")
        chain = {f"n{i}": {H_EXP_LAST_SEQ: str(i)} for i in range(1, 6)}
        chain["n3"] = {H_EXP_LAST_SEQ: "99"}
        _, r = await self.batch(s, self.rows([f"n{i}" for i in range(1, 6)], chain))
        await self.show("Expected-Last-Sequence wrong on 3rd of 5 (gap fail)", s, r)

        # pgoutbox's chain: id and place of the predecessor on every message.
        for label, with_seq in (("id chain only", False), ("id + sequence chain (pgoutbox's)", True)):
            # h2 is stored before h1: a late write of an abandoned connection.
            s = await self.fresh()
            await self.single(s, "h0")
            await self.single(s, "h2")
            chain = {f"h{i}": {H_EXP_LAST_MSG_ID: f"h{i-1}", **({H_EXP_LAST_SEQ: str(i)} if with_seq else {})}
                     for i in range(1, 5)}
            bid, r = await self.batch(s, self.rows([f"h{i}" for i in range(1, 5)], chain))
            await self.cl.batch_publish(f"{s}.e", b"", None, bid, 4, OP_PING)
            r += [{"type": "none"}] + await drain_queue(self.cl.batches[bid])
            await self.show(f"{label}, h2 landed before h1 (a late write), batch h1..h4, then a ping", s, r)
            # A replay: h1 and h2 stored in place before, the batch resends h1..h4.
            s = await self.fresh()
            for mid in ("h0", "h1", "h2"):
                await self.single(s, mid)
            _, r = await self.batch(s, self.rows([f"h{i}" for i in range(1, 5)], chain))
            await self.show(f"{label}, h1 h2 stored in place before, batch h1..h4 (a replay)", s, r)

        # 4. Oversized message (stream max_msg_size).
        for gap in ("fail", "ok"):
            s = await self.fresh(max_msg_size=1024)
            rows = self.rows(["o1", "o2", "o3", "o4", "o5"])
            rows[2] = (3, rows[2][1], b"x" * 2000)
            _, r = await self.batch(s, rows, gap=gap)
            await self.show(f"3rd of 5 over max_msg_size (gap {gap})", s, r)

        # 5. A gap (seq 3 never sent).
        for gap in ("fail", "ok"):
            s = await self.fresh()
            rows = [x for x in self.rows(["p1", "p2", "p3", "p4", "p5"]) if x[0] != 3]
            _, r = await self.batch(s, rows, gap=gap)
            await self.show(f"seq 3 of 5 missing (gap {gap})", s, r)

        # 6. Lost connection mid-batch: 1..3 on one connection, 4..5 on a new one.
        s = await self.fresh()
        c1 = Client()
        await c1.connect(self.srv.url)
        bid = uuid.uuid4().hex[:16]
        _, r1 = await self.batch(s, self.rows(["l1", "l2", "l3"]), last_op=None, cl=c1, bid=bid)
        await c1.close()
        c2 = Client()
        await c2.connect(self.srv.url)
        _, r2 = await self.batch(s, self.rows(["l1", "l2", "l3", "l4", "l5"])[3:], cl=c2, bid=bid)
        await c2.close()
        await self.show("connection lost after 3 of 5, same batch id goes on from 4 on a new connection",
                        s, r1 + [{"type": "none"}] + r2)
        s = await self.fresh()
        c1 = Client()
        await c1.connect(self.srv.url)
        bid = uuid.uuid4().hex[:16]
        _, r1 = await self.batch(s, self.rows(["k1", "k2", "k3"]), last_op=None, cl=c1, bid=bid)
        await c1.close()
        _, r2 = await self.batch(s, self.rows(["k1", "k2", "k3", "k4", "k5"]))
        await self.show("connection lost after 3 of 5, new batch resends all 5", s, r1 + [{"type": "none"}] + r2)

        # 7. Commit without storing (EOB) after a refused message: is the end ack honest?
        s = await self.fresh()
        _, r = await self.batch(s, self.rows(["u1", "u2"]) + [(3, {}, b"")], last_op=OP_COMMIT_EOB)
        await self.show("EOB commit after 2 messages", s, r)


# --------------------------------------------------------------------------
# Throughput
# --------------------------------------------------------------------------


@dataclass
class RunResult:
    msgs_per_s: float
    server_us_per_msg: float
    client_us_per_msg: float


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


async def run_single(raw: RawPublisher, cl: Client, srv: NatsServer, stream: str, n: int, payload: bytes,
                     inflight: int) -> RunResult:
    """(a) one publish with its own reply per message, at most `inflight` acks outstanding."""
    subj = f"{stream}.e"

    def frame(i: int) -> bytes:
        return raw.hpub(subj, f"{raw.inbox}.{i}", {H_MSG_ID: f"{stream}-{i}"}, payload)

    cpu0, ccpu0, t0 = srv.cpu_seconds(), time.process_time(), time.perf_counter()
    errors = await publish_pipelined(raw, frame, n, inflight)
    t1, cpu1, ccpu1 = time.perf_counter(), srv.cpu_seconds(), time.process_time()
    stored = await cl.stream_msgs(stream)
    if errors or stored != n:
        raise RuntimeError(f"single run: {len(errors)} bad acks (first: {errors[:1]}), stored {stored}/{n}")
    return RunResult(n / (t1 - t0), (cpu1 - cpu0) * 1e6 / n, (ccpu1 - ccpu0) * 1e6 / n)


async def fast_batch(raw: RawPublisher, subj: str, stream: str, first: int, count: int, payload: bytes,
                     flow: int, outstanding: int) -> dict:
    """One gap-fail fast batch of `count` messages; returns the final pub ack.

    Flow control as ADR-50 asks: wait for the first reply, then keep at
    most `outstanding` flow acks (of the server's current N) unanswered.
    """
    bid = uuid.uuid4().hex[:16]
    state = {"acked": 0, "every": 0, "final": None, "error": None}

    def on_reply(_subject: str, body: bytes) -> None:
        d = json.loads(body)
        t = d.get("type")
        if t == "ack":
            state["acked"], state["every"] = max(state["acked"], d["seq"]), d["msgs"]
        elif t in ("gap", "err") or "error" in d:
            state["error"] = f"fast batch {bid}: {describe(d)}"
        else:
            state["final"] = d

    async def wait() -> None:
        await raw.wait()
        if state["error"]:
            raise RuntimeError(state["error"])

    def frame(seq: int, op: int) -> bytes:
        return raw.hpub(subj, f"{raw.inbox}.{bid}.{flow}.fail.{seq}.{op}.$FI",
                        {H_MSG_ID: f"{stream}-{first + seq - 1}"}, payload)

    raw.on_reply = on_reply
    raw.transport.write(frame(1, OP_COMMIT if count == 1 else OP_START))
    while state["every"] == 0 and state["final"] is None:
        await wait()  # ADR-50: the first reply says the batch exists and its N
    sent = 1
    while sent < count:
        room = min(outstanding * state["every"] - (sent - state["acked"]), count - sent)
        if room > 0:
            raw.transport.write(b"".join(frame(seq, OP_COMMIT if seq == count else OP_APPEND)
                                         for seq in range(sent + 1, sent + room + 1)))
            sent += room
        await wait()
    while state["final"] is None:
        await wait()
    return state["final"]


async def run_batched(raw: RawPublisher, cl: Client, srv: NatsServer, stream: str, n: int, payload: bytes,
                      batch_size: int, flow: int, outstanding: int) -> RunResult:
    """(b) fast-ingest batches one after another (gap mode fail)."""
    subj = f"{stream}.e"
    size = batch_size or n
    cpu0, ccpu0, t0 = srv.cpu_seconds(), time.process_time(), time.perf_counter()
    for first in range(0, n, size):
        count = min(size, n - first)
        ack = await fast_batch(raw, subj, stream, first, count, payload, flow, outstanding)
        if ack.get("count") != count:
            raise RuntimeError(f"batch at {first}: {describe(ack)}")
    t1, cpu1, ccpu1 = time.perf_counter(), srv.cpu_seconds(), time.process_time()
    stored = await cl.stream_msgs(stream)
    if stored != n:
        raise RuntimeError(f"batch run: stored {stored}/{n}")
    return RunResult(n / (t1 - t0), (cpu1 - cpu0) * 1e6 / n, (ccpu1 - ccpu0) * 1e6 / n)


async def measure(args, srv: NatsServer) -> None:
    cl = Client()
    await cl.connect(srv.url)
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    try:
        payload = make_payload(args.payload)
        version = cl.server_version
        log(f"server {version} ({srv.version_cli}) on {srv.url}, load {os.getloadavg()}")
        probe = await cl.create_stream("PROBE")
        batched = bool(probe.get("config", {}).get("allow_batched"))
        await cl.delete_stream("PROBE")
        if not batched:
            log("allow_batched not echoed back: fast ingest unsupported, measuring (a) only")

        sem = None
        if batched and not args.skip_semantics:
            sem = Semantics(cl, srv, payload)
            await sem.run()

        # (b) with ADR-50's recommended window, (c) with a wider one.
        window = {"b": args.outstanding, "c": args.outstanding_wide}
        results: dict[str, list[RunResult]] = {"a": [], "b": [], "c": []}
        modes = ["a", "b", "c"] if batched else ["a"]
        for run in range(1, args.runs + 1):
            for mode in modes:  # interleaved: a, b, c, a, b, c, ...
                name = f"TP{mode.upper()}{run}"
                await cl.create_stream(name)
                raw = await RawPublisher.open(srv.url)
                try:
                    if mode == "a":
                        r = await run_single(raw, cl, srv, name, args.n, payload, args.inflight)
                    else:
                        r = await run_batched(raw, cl, srv, name, args.n, payload, args.batch_size, args.flow,
                                              window[mode])
                finally:
                    raw.close()
                await cl.delete_stream(name)
                results[mode].append(r)
                log(f"  run {run} ({mode}): {r.msgs_per_s:,.0f} msgs/s, server {r.server_us_per_msg:.2f} µs "
                    f"CPU/msg, client {r.client_us_per_msg:.2f} µs CPU/msg, load {os.getloadavg()[0]:.2f}")

        label = {"a": f"(a) single publishes, <= {args.inflight:,} acks in flight"}
        for mode in ("b", "c"):
            label[mode] = (f"({mode}) fast batches of {args.batch_size or args.n:,} (gap fail, flow {args.flow}, "
                           f"<= {window[mode]} flow acks outstanding)")
        print(f"## nats-server {version}\n")
        print(f"`{srv.version_cli}`; N={args.n:,} msgs of {args.payload} B + Nats-Msg-Id per run, "
              f"{args.runs} runs interleaved (median), file storage, R1, one raw-socket publisher connection\n")
        print("| mode | msgs/s | server CPU µs/msg | client CPU µs/msg | runs (msgs/s) |")
        print("|---|---:|---:|---:|---|")
        for mode in modes:
            rs = results[mode]
            med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
            runs = ", ".join(f"{r.msgs_per_s:,.0f}" for r in rs)
            print(f"| {label[mode]} | {med(lambda r: r.msgs_per_s):,.0f} | "
                  f"{med(lambda r: r.server_us_per_msg):.2f} | {med(lambda r: r.client_us_per_msg):.2f} | {runs} |")
        if batched:
            print()
            for mode in ("b", "c"):
                # Ratios per interleaved run (each batch run against the single run just before it).
                tp = statistics.median(b.msgs_per_s / a.msgs_per_s for a, b in zip(results["a"], results[mode]))
                cpu = statistics.median(b.server_us_per_msg / a.server_us_per_msg
                                        for a, b in zip(results["a"], results[mode]))
                print(f"({mode})/(a), median of per-run ratios: {tp:.2f} x msgs/s, {cpu:.2f} x server CPU per message")
        print()
        if sem is not None:
            print("Semantics:\n")
            for name, res in sem.lines:
                print(f"- {name}: {res}")
    finally:
        await cl.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True, help="path to the nats-server binary")
    p.add_argument("--n", type=int, default=200_000, help="messages per throughput run (default 200000)")
    p.add_argument("--payload", type=int, default=300, help="payload bytes (default 300)")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs per mode; median is printed")
    p.add_argument("--inflight", type=int, default=1024, help="(a) max acks outstanding")
    p.add_argument("--batch-size", type=int, default=0, help="(b) messages per fast batch (0: the whole run)")
    p.add_argument("--flow", type=int, default=500, help="(b) max flow the client allows (server caps at 500)")
    p.add_argument("--outstanding", type=int, default=2, help="(b) max flow acks outstanding (ADR-50: 2)")
    p.add_argument("--outstanding-wide", type=int, default=4, help="(c) max flow acks outstanding")
    p.add_argument("--skip-semantics", action="store_true")
    args = p.parse_args()

    return _atomic.run_against_server(args.server, lambda srv: measure(args, srv))


if __name__ == "__main__":
    sys.exit(main())
