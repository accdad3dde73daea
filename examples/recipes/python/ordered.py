"""Recipe 2: each key's events in commit order, with instances in parallel.

pgoutbox runs with `--partitions N` and `{$partition}` first in its subject template
(`<root>.{$partition}.{aggregate_type}.{event_type}`): every event of an aggregate is on one
partition, in commit order. Each partition has a durable consumer of its own (`ordered-<p>`,
filter `<root>.<p>.*.*`), read by one instance at a time: an instance takes each partition
whose Postgres advisory lock it gets, and the others take it over when it stops.

With acks, delivery order is not stream order: a message not acknowledged in time comes
again after later ones. So the partition's messages are held, and applied by stream
sequence, once the consumer's `num_ack_pending` says nothing delivered before is still to
come back; the sequence applied through is written with the effects, and a message at or
below it is nothing. Each event is also applied once by its id (a replay, a seed).

    PARTITIONS=4 ... python3 ordered.py     # as many instances as you like
"""

import asyncio
import os

import psycopg

from outbox import (AWAY, DATABASE_URL, EVENTS, ROOT, Held, ack, apply_once, connect_db,
                    connect_nats, durable, fetch, kind, say, schema, sequence)

PARTITIONS = int(os.environ.get("PARTITIONS", "4"))
SCHEMA = schema("ordered") + """
    CREATE TABLE IF NOT EXISTS ordered_cursor (
        partition int PRIMARY KEY, applied_through bigint NOT NULL);"""


async def partition(js, p):
    """Reads partition `p` while this instance holds its lock (on the connection that applies)."""
    db = await psycopg.AsyncConnection.connect(DATABASE_URL, autocommit=True)
    try:
        locked = await db.execute("SELECT pg_try_advisory_lock(7102, %s)", [p])
        if (await locked.fetchone())[0]:
            say(f"partition {p}: mine")
            await consume(js, db, p)
    finally:
        await db.close()


async def consume(js, db, p):
    sub = await durable(js, f"ordered-{p}", f"{ROOT}.{p}.*.*")
    row = await db.execute("SELECT applied_through FROM ordered_cursor WHERE partition = %s", [p])
    through = ((await row.fetchone()) or [0])[0]
    held = Held()
    while True:
        for msg in await fetch(sub):
            if sequence(msg) <= through:
                await ack(msg)  # applied: its ack was lost, or it was held past ack_wait
            else:
                held.add(msg)
        await held.keep()
        if not held.messages:
            continue
        # More delivered and unacknowledged than held: a message delivered before (to an
        # instance since killed, or lost on its way) comes back within ack_wait, and goes
        # before what is held. Equal: what is held is next, in stream order.
        try:
            pending = (await sub.consumer_info()).num_ack_pending
        except AWAY:
            continue
        if pending > len(held.messages):
            continue
        batch = [held.messages[s] for s in sorted(held.messages)]
        try:
            async with db.transaction():
                for msg in batch:
                    if kind(msg) in EVENTS:
                        await apply_once(db, js, "ordered", msg)
                    else:
                        say(f"message {sequence(msg)} is not an event: skipped")
                await db.execute(
                    "INSERT INTO ordered_cursor VALUES (%s, %s) ON CONFLICT (partition) "
                    "DO UPDATE SET applied_through = excluded.applied_through",
                    [p, sequence(batch[-1])],
                )
        except AWAY as err:  # an object could not be fetched: held, tried again
            say(f"partition {p}: not applied ({err!r}): again")
            continue
        through = sequence(batch[-1])
        held.messages.clear()
        for msg in batch:
            await ack(msg)


async def main():
    js = (await connect_nats()).jetstream()
    await (await connect_db(SCHEMA)).close()
    readers = {}
    while True:
        for p in range(PARTITIONS):
            reader = readers.get(p)
            if reader is not None and reader.done() and reader.exception():
                say(f"partition {p}: {reader.exception()!r}: let go")
            if reader is None or reader.done():
                readers[p] = asyncio.create_task(partition(js, p))
        await asyncio.sleep(2)


if __name__ == "__main__":
    asyncio.run(main())
