// @ts-check
// Recipe 3: whole transactions.
//
// pgoutbox runs with `--transaction-subject <root>.transactions`: each transaction ends with
// a message that counts its events. One durable consumer (`whole`) reads the whole stream
// (`<root>.>`: every partition, the ends), one instance at a time (the others wait on a
// Postgres advisory lock, and take over when it stops). As consume.md's steps say:
//
// 1. Classify first: a delivery, a seeded row, a replayed row without marks is an event of
//    its own, applied alone; never added to a transaction (a delivery's marks are copies).
// 2. Hold rows and emitted events (and replayed rows with marks) by their commit LSN, with
//    in-progress acks.
// 3. At the end of commit LSN C, its part is the messages of C held with a lower stream
//    sequence. When it has `events` of them, apply them and record C in one transaction.
// 4. Fewer: one may still come back (delivered before, unacknowledged). Wait until
//    num_ack_pending equals what is held; then the part is short of messages removed before
//    they were read: apply it as it is, and say so.
// 5. A message of a transaction recorded before is a redelivery: acknowledged, nothing.
//
// Ends are applied in stream order, and only once num_ack_pending says nothing delivered
// before is still to come back, so each key's events are applied in commit order too.
//
//   ... node whole.mjs     # a second instance waits, and takes over

import { EVENTS, Held, ROOT, ack, ackPending, applyOnce, commitLsn, connectDb, connectNats,
  durable, fetch, header, inPlace, kind, say, schema, transaction } from "./outbox.mjs";

const SCHEMA = schema("whole") + `
  CREATE TABLE IF NOT EXISTS whole_transactions (commit_lsn text PRIMARY KEY);`;

const nats = await connectNats();
const db = await connectDb(SCHEMA);
await db.query("SELECT pg_advisory_lock(7103)"); // one instance reads at a time
const consumer = await durable(nats, "whole", `${ROOT}.>`);
say("reading whole transactions");
const held = new Held();
/** @type {Map<number, string>} the ends held: stream sequence -> commit LSN */
const ends = new Map();
/** @type {Set<string>} the commit LSNs of what is held */
const waiting = new Set();

/** @param {string} commit */
async function recorded(commit) {
  const found = await db.query("SELECT FROM whole_transactions WHERE commit_lsn = $1", [commit]);
  return found.rowCount !== 0;
}

for (;;) {
  for (const msg of await fetch(consumer)) {
    const what = kind(msg);
    if (what === "end" || (what !== undefined && EVENTS.has(what) && inPlace(msg))) {
      const end = what === "end";
      const commit = end ? String(header(msg, "Pgoutbox-Transaction-End")) : commitLsn(msg);
      if (!waiting.has(commit) && (await recorded(commit))) {
        await ack(msg); // step 5
        continue;
      }
      held.add(msg);
      waiting.add(commit);
      if (end) ends.set(msg.seq, commit);
    } else if (what !== undefined && EVENTS.has(what)) {
      // Step 1: an event of its own.
      try {
        await transaction(db, () => applyOnce(db, "whole", msg));
      } catch (err) {
        say(`message ${msg.seq} not applied (${err}): it comes back`);
        continue;
      }
      await ack(msg);
    } else {
      // Dead letters: counted by the end, not events (a reader of the dead-letter subject
      // handles them); anything else is not pgoutbox's.
      await ack(msg);
    }
  }
  held.keep();
  if (ends.size === 0) continue;
  // In stream order: apply nothing while a message delivered before (to an instance since
  // killed, or lost on its way) may still come back: num_ack_pending counts it.
  const pending = await ackPending(consumer);
  if (pending === undefined || pending > held.messages.size) continue;
  for (const at of [...ends.keys()].sort((a, b) => a - b)) {
    const commit = String(ends.get(at));
    const end = /** @type {import("@nats-io/jetstream").JsMsg} */ (held.messages.get(at));
    const part = held.sorted()
      .filter((m) => m.seq < at && kind(m) !== "end" && commitLsn(m) === commit);
    const counted = JSON.parse(new TextDecoder().decode(end.data)).events;
    if (part.length < counted) {
      // Step 4: nothing is to come back.
      say(`transaction ${commit}: ${part.length} of ${counted} events (removed before they `
        + "were read): applied as it is");
    }
    try {
      await transaction(db, async () => {
        for (const msg of part) await applyOnce(db, "whole", msg);
        await db.query("INSERT INTO whole_transactions VALUES ($1) ON CONFLICT DO NOTHING", [commit]);
      });
    } catch (err) {
      say(`transaction ${commit} not applied (${err}): again`);
      break;
    }
    for (const msg of [...part, end]) {
      held.messages.delete(msg.seq);
      await ack(msg);
    }
    ends.delete(at);
    waiting.delete(commit);
  }
}
