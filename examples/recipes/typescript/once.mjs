// @ts-check
// Recipe 1: each event once, by its event id.
//
// The simplest consumer: every instance pulls from one durable consumer on the whole stream
// (`<root>.>`), so they share its messages, in parallel, in no order between them. Each
// event is applied in one transaction of the consumer's database with its id written
// beside it (`once_applied`), then acknowledged: a redelivery, a replay or a seed of an
// event applied before is nothing. No order between events, and no whole transactions:
// see ordered.mjs and whole.mjs for those.
//
//   DATABASE_URL=postgresql://... NATS_URL=nats://... node once.mjs

import { EVENTS, ROOT, ack, applyOnce, connectDb, connectNats, durable, fetch, kind, say, schema,
  transaction } from "./outbox.mjs";

const nats = await connectNats();
const db = await connectDb(schema("once"));
const consumer = await durable(nats, "once", `${ROOT}.>`);
say("reading every event once");
for (;;) {
  for (const msg of await fetch(consumer)) {
    const what = kind(msg);
    if (what !== undefined && EVENTS.has(what)) {
      try {
        await transaction(db, () => applyOnce(db, "once", msg));
      } catch (err) {
        say(`message ${msg.seq} not applied (${err}): it comes back`);
        continue;
      }
    } else if (what === undefined) {
      say(`message ${msg.seq} is not pgoutbox's: skipped`);
    }
    // The rest (transactions' ends, dead letters) are not events: acknowledged.
    await ack(msg);
  }
}
