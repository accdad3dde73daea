"""What every recipe shares: what a message of pgoutbox's stream is, its event id and its
payload, and the durable consumer with acks that docs/how-to/consume.md describes.

Copy this file with the recipe you use. Settings, from the environment: NATS_URL,
DATABASE_URL (the consumer's own PostgreSQL database), PGOUTBOX_STREAM (OUTBOX), SUBJECT_ROOT
(outbox: the subject template's first token), ACK_WAIT (30, seconds).
"""

import asyncio
import hashlib
import os
import sys

import nats
import psycopg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

NATS_URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")
DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
STREAM = os.environ.get("PGOUTBOX_STREAM", "OUTBOX")
ROOT = os.environ.get("SUBJECT_ROOT", "outbox")
ACK_WAIT = float(os.environ.get("ACK_WAIT", "30"))

# docs/reference/message.md, "What a message is": the first of these headers a message has
# says what it is, in this order. A delivery carries copies of its row's headers (its
# transaction's marks and position included), so it must be told by Nats-Scheduler first.
KINDS = [
    ("Pgoutbox-Transaction-End", "end"),  # a transaction's end: not an event
    ("Nats-Schedule", "schedule"),  # a schedule not yet delivered: not an event
    ("Nats-Scheduler", "delivery"),  # a scheduled row's delivery: an event of its own
    ("Pgoutbox-Dead-Letter-Reason", "dead_letter"),  # not the event
    ("Pgoutbox-Seed", "seeded"),  # a seeded row: a transaction of its own
    ("Pgoutbox-Replay", "replayed"),  # the event of its row's id again
    ("Pgoutbox-Emitted", "emitted"),  # an emitted event, in its transaction's place
    ("Pgoutbox-Table", "row"),  # a row, in its transaction's place
]
EVENTS = {"delivery", "seeded", "replayed", "emitted", "row"}
# What a call to a server that is away (restarting, unreachable) raises: try again later.
AWAY = (nats.errors.Error, asyncio.TimeoutError)


def say(what):
    print(f"{os.path.basename(sys.argv[0])}: {what}", file=sys.stderr, flush=True)


def kind(msg):
    """What the message is (one of KINDS' names), or None: not pgoutbox's."""
    headers = msg.headers or {}
    return next((name for header, name in KINDS if header in headers), None)


def in_place(msg):
    """Whether the event is collected into its transaction by its commit LSN: a row, an
    emitted event, a replayed row with marks. Never a delivery: its marks are copies."""
    what = kind(msg)
    replayed = what == "replayed" and "Pgoutbox-Transaction-Last" in msg.headers
    return what in ("row", "emitted") or replayed


def commit_lsn(msg):
    """The commit LSN of the message's transaction (Pgoutbox-Position is <commit LSN>:<index>)."""
    return msg.headers["Pgoutbox-Position"].split(":")[0]


def event_id(msg):
    """The key to apply the event once by: Pgoutbox-Event-Id, else Nats-Msg-Id without a
    replay's replay:<replay id>/<n>: prefix."""
    headers = msg.headers or {}
    if "Pgoutbox-Event-Id" in headers:
        return headers["Pgoutbox-Event-Id"]  # a delivery has no Nats-Msg-Id
    msg_id = headers["Nats-Msg-Id"]
    if msg_id.startswith("replay:") and ":" in msg_id[len("replay:") :]:
        return msg_id[len("replay:") :].split(":", 1)[1]
    return msg_id


def sequence(msg):
    """Where the stream stored the message: order by it, never by arrival."""
    return msg.metadata.sequence.stream


async def payload(js, msg):
    """The event's payload: the body, or for a pointer (--object-store) the object it names,
    checked against its size and SHA-256. Fetch it only for an event not applied before."""
    headers = msg.headers
    bucket = headers.get("Pgoutbox-Object-Bucket")
    if bucket is None:
        return msg.data
    name = headers["Pgoutbox-Object-Name"]
    data = (await (await js.object_store(bucket)).get(name)).data
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != int(headers["Pgoutbox-Object-Size"]) or digest != headers["Pgoutbox-Object-Sha256"]:
        raise RuntimeError(f"object {name} of bucket {bucket} is not its pointer's")
    return data


async def connect_nats():
    """A connection that reconnects for good: a nats-server restart is a pause."""

    async def quietly(*_):
        pass  # the calls that failed meanwhile say what they lost

    return await nats.connect(
        NATS_URL, max_reconnect_attempts=-1, reconnect_time_wait=0.5, error_cb=quietly
    )


async def connect_db(schema):
    """The consumer's own database, with `schema` made (one process at a time)."""
    db = await psycopg.AsyncConnection.connect(DATABASE_URL, autocommit=True)
    async with db.transaction():
        await db.execute("SELECT pg_advisory_xact_lock(7100)")
        await db.execute(schema)
    return db


def schema(recipe):
    """A recipe's tables: the event ids applied, and its effects. Yours are your own tables;
    keep the ids applied beside them, written in the same transaction."""
    return f"""
        CREATE TABLE IF NOT EXISTS {recipe}_applied (event_id text PRIMARY KEY);
        CREATE TABLE IF NOT EXISTS {recipe}_effects (
            event_id text NOT NULL, kind text NOT NULL, aggregate_id text,
            payload bytea NOT NULL, stream_sequence bigint NOT NULL,
            applied_in bigint NOT NULL DEFAULT txid_current(), applied_order bigserial);"""


async def apply_once(db, js, recipe, msg):
    """Applies the message's event once, by its event id, in the transaction `db` is in:
    an event applied before (redelivered, replayed, seeded again) is nothing."""
    new = await db.execute(
        f"INSERT INTO {recipe}_applied VALUES (%s) ON CONFLICT DO NOTHING", [event_id(msg)]
    )
    if new.rowcount == 0:
        return
    # The effect: yours goes here. This one writes the event down.
    await db.execute(
        f"INSERT INTO {recipe}_effects (event_id, kind, aggregate_id, payload, stream_sequence) "
        "VALUES (%s, %s, %s, %s, %s)",
        [event_id(msg), kind(msg), msg.headers.get("Outbox-Aggregate-Id"),
         await payload(js, msg), sequence(msg)],
    )


async def durable(js, name, filter_subject):
    """A durable pull consumer with the settings consume.md gives: explicit acks (after the
    effects are committed), ack_wait, many messages pending, never giving up on one."""
    config = ConsumerConfig(
        durable_name=name,
        filter_subject=filter_subject,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ACK_WAIT,
        max_ack_pending=10000,
        max_deliver=-1,
        deliver_policy=DeliverPolicy.ALL,
    )
    await js.add_consumer(STREAM, config)
    return await js.pull_subscribe_bind(durable=name, stream=STREAM)


async def fetch(sub):
    """The next messages: none after a second without any, or while the server is away."""
    try:
        return await sub.fetch(100, timeout=1)
    except (nats.errors.TimeoutError, asyncio.TimeoutError):
        return []
    except AWAY as err:
        say(f"fetch: {err!r}; again")
        await asyncio.sleep(0.5)
        return []


async def ack(msg):
    """A double ack: the server has counted it when this returns, so the num_ack_pending read
    next counts it. Lost (the server away), the message comes back: applied, it is nothing."""
    try:
        await msg.ack_sync()
    except AWAY as err:
        say(f"ack of {sequence(msg)} lost ({err!r}): it comes back, and is nothing")


class Held:
    """Messages held unacknowledged, by stream sequence, kept from ack_wait's redelivery by
    an in-progress ack every third of it."""

    def __init__(self):
        self.messages = {}
        self.touched = asyncio.get_running_loop().time()

    def add(self, msg):
        # A redelivery of a message held replaces it: ack the newest delivery.
        self.messages[sequence(msg)] = msg

    async def keep(self):
        now = asyncio.get_running_loop().time()
        if now - self.touched < ACK_WAIT / 3:
            return
        self.touched = now
        for msg in self.messages.values():
            try:
                await msg.in_progress()
            except AWAY:
                pass  # the server is away: the message may come back, and is held again
