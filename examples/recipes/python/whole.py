"""Recipe 3: whole transactions.

pgoutbox runs with `--transaction-subject <root>.transactions`: each transaction ends with a
message that counts its events. One durable consumer (`whole`) reads the whole stream
(`<root>.>`: every partition, the ends), one instance at a time (the others wait on a
Postgres advisory lock, and take over when it stops). As consume.md's steps say:

1. Classify first: a delivery, a seeded row, a replayed row without marks is an event of its
   own, applied alone; never added to a transaction (a delivery's marks are copies).
2. Hold rows and emitted events (and replayed rows with marks) by their commit LSN, with
   in-progress acks.
3. At the end of commit LSN C, its part is the messages of C held with a lower stream
   sequence. When it has `events` of them, apply them and record C in one transaction.
4. Fewer: one may still come back (delivered before, unacknowledged). Wait until
   num_ack_pending equals what is held; then the part is short of messages removed before
   they were read: apply it as it is, and say so.
5. A message of a transaction recorded before is a redelivery: acknowledged, nothing.

Ends are applied in stream order, and only once num_ack_pending says nothing delivered
before is still to come back, so each key's events are applied in commit order too.

    ... python3 whole.py     # a second instance waits, and takes over
"""

import asyncio
import json

from outbox import (AWAY, EVENTS, ROOT, Held, ack, apply_once, commit_lsn, connect_db,
                    connect_nats, durable, fetch, in_place, kind, say, schema, sequence)

SCHEMA = schema("whole") + """
    CREATE TABLE IF NOT EXISTS whole_transactions (commit_lsn text PRIMARY KEY);"""


async def recorded(db, commit):
    found = await db.execute("SELECT FROM whole_transactions WHERE commit_lsn = %s", [commit])
    return await found.fetchone() is not None


async def main():
    js = (await connect_nats()).jetstream()
    db = await connect_db(SCHEMA)
    await db.execute("SELECT pg_advisory_lock(7103)")  # one instance reads at a time
    sub = await durable(js, "whole", f"{ROOT}.>")
    say("reading whole transactions")
    held = Held()
    ends = {}  # the ends held: stream sequence -> commit LSN
    waiting = set()  # the commit LSNs of what is held
    while True:
        for msg in await fetch(sub):
            what = kind(msg)
            if what == "end" or (what in EVENTS and in_place(msg)):
                end = what == "end"
                commit = msg.headers["Pgoutbox-Transaction-End"] if end else commit_lsn(msg)
                if commit not in waiting and await recorded(db, commit):
                    await ack(msg)  # step 5
                    continue
                held.add(msg)
                waiting.add(commit)
                if end:
                    ends[sequence(msg)] = commit
            elif what in EVENTS:  # step 1: an event of its own
                try:
                    async with db.transaction():
                        await apply_once(db, js, "whole", msg)
                except AWAY:
                    continue  # its object could not be fetched: it comes back
                await ack(msg)
            else:
                # Dead letters: counted by the end, not events (a reader of the dead-letter
                # subject handles them); anything else is not pgoutbox's.
                await ack(msg)
        await held.keep()
        if not ends:
            continue
        # In stream order: apply nothing while a message delivered before (to an instance
        # since killed, or lost on its way) may still come back: num_ack_pending counts it.
        try:
            if (await sub.consumer_info()).num_ack_pending > len(held.messages):
                continue
        except AWAY:
            continue
        for at in sorted(ends):
            commit = ends[at]
            part = [m for s, m in sorted(held.messages.items())
                    if s < at and kind(m) != "end" and commit_lsn(m) == commit]
            counted = json.loads(held.messages[at].data)["events"]
            if len(part) < counted:  # step 4: nothing is to come back
                say(f"transaction {commit}: {len(part)} of {counted} events (removed before "
                    "they were read): applied as it is")
            try:
                async with db.transaction():
                    for msg in part:
                        await apply_once(db, js, "whole", msg)
                    await db.execute("INSERT INTO whole_transactions VALUES (%s) "
                                     "ON CONFLICT DO NOTHING", [commit])
            except AWAY:
                break  # an object could not be fetched: held, tried again
            for msg in part + [held.messages[at]]:
                del held.messages[sequence(msg)]
                await ack(msg)
            del ends[at]
            waiting.discard(commit)

if __name__ == "__main__":
    asyncio.run(main())
