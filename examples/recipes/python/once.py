"""Recipe 1: each event once, by its event id.

The simplest consumer: every instance pulls from one durable consumer on the whole stream
(`<root>.>`), so they share its messages, in parallel, in no order between them. Each event
is applied in one transaction of the consumer's database with its id written beside it
(`once_applied`), then acknowledged: a redelivery, a replay or a seed of an event applied
before is nothing. No order between events, and no whole transactions: see ordered.py and
whole.py for those.

    PYTHONPATH=... DATABASE_URL=postgresql://... NATS_URL=nats://... python3 once.py
"""

import asyncio

from outbox import (AWAY, EVENTS, ROOT, apply_once, ack, connect_db, connect_nats, durable,
                    fetch, kind, say, schema, sequence)


async def main():
    js = (await connect_nats()).jetstream()
    db = await connect_db(schema("once"))
    sub = await durable(js, "once", f"{ROOT}.>")
    say("reading every event once")
    while True:
        for msg in await fetch(sub):
            what = kind(msg)
            if what in EVENTS:
                try:
                    async with db.transaction():
                        await apply_once(db, js, "once", msg)
                except AWAY as err:  # its object could not be fetched: it comes back
                    say(f"message {sequence(msg)} not applied ({err!r}): it comes back")
                    continue
            elif what is None:
                say(f"message {sequence(msg)} is not pgoutbox's: skipped")
            # The rest (transactions' ends, dead letters) are not events: acknowledged.
            await ack(msg)


if __name__ == "__main__":
    asyncio.run(main())
