// @ts-check
// Recipe 2: each key's events in commit order, with instances in parallel.
//
// pgoutbox runs with `--partitions N` and `{$partition}` first in its subject template
// (`<root>.{$partition}.{aggregate_type}.{event_type}`): every event of an aggregate is on
// one partition, in commit order. Each partition has a durable consumer of its own
// (`ordered-<p>`, filter `<root>.<p>.*.*`), read by one instance at a time: an instance takes
// each partition whose Postgres advisory lock it gets, and the others take it over when it
// stops.
//
// With acks, delivery order is not stream order: a message not acknowledged in time comes
// again after later ones. So the partition's messages are held, and applied by stream
// sequence, once the consumer's `num_ack_pending` says nothing delivered before is still to
// come back; the sequence applied through is written with the effects, and a message at or
// below it is nothing. Each event is also applied once by its id (a replay, a seed).
//
//   PARTITIONS=4 ... node ordered.mjs     # as many instances as you like

import pg from "pg";
import { DATABASE_URL, EVENTS, Held, ROOT, ack, ackPending, applyOnce, connectDb, connectNats,
  durable, fetch, kind, say, schema, sleep, transaction } from "./outbox.mjs";

const PARTITIONS = Number(process.env.PARTITIONS ?? "4");
const SCHEMA = schema("ordered") + `
  CREATE TABLE IF NOT EXISTS ordered_cursor (
    partition int PRIMARY KEY, applied_through bigint NOT NULL);`;

/**
 * Reads partition `p` while this instance holds its lock (on the connection that applies).
 * @param {Awaited<ReturnType<typeof connectNats>>} nats @param {number} p
 */
async function partition(nats, p) {
  const db = new pg.Client({ connectionString: DATABASE_URL });
  db.on("error", (err) => say(`partition ${p}: the database connection ended: ${err}`));
  await db.connect();
  try {
    const locked = await db.query("SELECT pg_try_advisory_lock(7102, $1) AS mine", [p]);
    if (locked.rows[0].mine) {
      say(`partition ${p}: mine`);
      await consume(nats, db, p);
    }
  } finally {
    await db.end();
  }
}

/** @param {Awaited<ReturnType<typeof connectNats>>} nats @param {pg.Client} db @param {number} p */
async function consume(nats, db, p) {
  const consumer = await durable(nats, `ordered-${p}`, `${ROOT}.${p}.*.*`);
  const row = await db.query("SELECT applied_through FROM ordered_cursor WHERE partition = $1", [p]);
  let through = Number(row.rows[0]?.applied_through ?? 0);
  const held = new Held();
  for (;;) {
    for (const msg of await fetch(consumer)) {
      if (msg.seq <= through) await ack(msg); // applied: its ack was lost, or it was held past ack_wait
      else held.add(msg);
    }
    held.keep();
    if (held.messages.size === 0) continue;
    // More delivered and unacknowledged than held: a message delivered before (to an
    // instance since killed, or lost on its way) comes back within ack_wait, and goes
    // before what is held. Equal: what is held is next, in stream order.
    const pending = await ackPending(consumer);
    if (pending === undefined || pending > held.messages.size) continue;
    const batch = held.sorted();
    const last = batch[batch.length - 1].seq;
    try {
      await transaction(db, async () => {
        for (const msg of batch) {
          const what = kind(msg);
          if (what !== undefined && EVENTS.has(what)) await applyOnce(db, "ordered", msg);
          else say(`message ${msg.seq} is not an event: skipped`);
        }
        await db.query(
          `INSERT INTO ordered_cursor VALUES ($1, $2) ON CONFLICT (partition)
           DO UPDATE SET applied_through = excluded.applied_through`, [p, last]);
      });
    } catch (err) {
      say(`partition ${p}: not applied (${err}): again`);
      continue;
    }
    through = last;
    held.messages.clear();
    for (const msg of batch) await ack(msg);
  }
}

const nats = await connectNats();
await (await connectDb(SCHEMA)).end();
/** @type {Map<number, Promise<void>>} */
const readers = new Map();
for (;;) {
  for (let p = 0; p < PARTITIONS; p++) {
    if (readers.has(p)) continue;
    const reader = partition(nats, p)
      .catch((err) => say(`partition ${p}: ${err}: let go`))
      .finally(() => readers.delete(p));
    readers.set(p, reader);
  }
  await sleep(2000);
}
