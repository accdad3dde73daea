// @ts-check
// What every recipe shares: what a message of pgoutbox's stream is, its event id and its
// payload, and the durable consumer with acks that docs/how-to/consume.md describes.
//
// Copy this file with the recipe you use. Settings, from the environment: NATS_URL,
// DATABASE_URL (the consumer's own PostgreSQL database), PGOUTBOX_STREAM (OUTBOX),
// SUBJECT_ROOT (outbox: the subject template's first token), ACK_WAIT (30, seconds).
// Plain JavaScript with JSDoc types: Node 20 runs it as it is, and `tsc --checkJs` checks it.

import { createHash } from "node:crypto";
import { basename } from "node:path";
import { AckPolicy, DeliverPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";
import { connect } from "@nats-io/transport-node";
import pg from "pg";

/** @typedef {import("@nats-io/jetstream").JsMsg} JsMsg */
/** @typedef {import("@nats-io/jetstream").JetStreamClient} JetStreamClient */
/** @typedef {import("@nats-io/jetstream").Consumer} Consumer */

const env = process.env;
export const NATS_URL = env.NATS_URL ?? "nats://127.0.0.1:4222";
export const DATABASE_URL = env.DATABASE_URL ?? "postgresql://postgres@127.0.0.1/postgres";
export const STREAM = env.PGOUTBOX_STREAM ?? "OUTBOX";
export const ROOT = env.SUBJECT_ROOT ?? "outbox";
export const ACK_WAIT = Number(env.ACK_WAIT ?? "30");

// docs/reference/message.md, "What a message is": the first of these headers a message has
// says what it is, in this order. A delivery carries copies of its row's headers (its
// transaction's marks and position included), so it must be told by Nats-Scheduler first.
const KINDS = [
  ["Pgoutbox-Transaction-End", "end"], // a transaction's end: not an event
  ["Nats-Schedule", "schedule"], // a schedule not yet delivered: not an event
  ["Nats-Scheduler", "delivery"], // a scheduled row's delivery: an event of its own
  ["Pgoutbox-Dead-Letter-Reason", "dead_letter"], // not the event
  ["Pgoutbox-Seed", "seeded"], // a seeded row: a transaction of its own
  ["Pgoutbox-Replay", "replayed"], // the event of its row's id again
  ["Pgoutbox-Emitted", "emitted"], // an emitted event, in its transaction's place
  ["Pgoutbox-Table", "row"], // a row, in its transaction's place
];
export const EVENTS = new Set(["delivery", "seeded", "replayed", "emitted", "row"]);

/** @param {string} what */
export function say(what) {
  console.error(`${basename(process.argv[1])}: ${what}`);
}

/** @param {number} ms */
export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** @param {JsMsg} msg @param {string} name @returns {string | undefined} */
export function header(msg, name) {
  return msg.headers?.has(name) ? msg.headers.get(name) : undefined;
}

/** What the message is (one of KINDS' names), or undefined: not pgoutbox's. @param {JsMsg} msg */
export function kind(msg) {
  return KINDS.find(([name]) => msg.headers?.has(name))?.[1];
}

/**
 * Whether the event is collected into its transaction by its commit LSN: a row, an emitted
 * event, a replayed row with marks. Never a delivery: its marks are copies.
 * @param {JsMsg} msg
 */
export function inPlace(msg) {
  const what = kind(msg);
  const replayed = what === "replayed" && msg.headers?.has("Pgoutbox-Transaction-Last");
  return what === "row" || what === "emitted" || replayed;
}

/** The commit LSN of the message's transaction (Pgoutbox-Position is <commit LSN>:<index>). @param {JsMsg} msg */
export function commitLsn(msg) {
  return String(header(msg, "Pgoutbox-Position")).split(":")[0];
}

/**
 * The key to apply the event once by: Pgoutbox-Event-Id, else Nats-Msg-Id without a
 * replay's replay:<replay id>/<n>: prefix.
 * @param {JsMsg} msg
 */
export function eventId(msg) {
  const id = header(msg, "Pgoutbox-Event-Id"); // a delivery has no Nats-Msg-Id
  if (id !== undefined) return id;
  const msgId = String(header(msg, "Nats-Msg-Id"));
  const rest = msgId.startsWith("replay:") ? msgId.slice("replay:".length) : undefined;
  return rest?.includes(":") ? rest.slice(rest.indexOf(":") + 1) : msgId;
}

/**
 * The event's payload: the body, or for a pointer (--object-store) the object it names,
 * checked against its size and SHA-256. Fetch it only for an event not applied before.
 * @param {JsMsg} msg @returns {Promise<Uint8Array>}
 */
export async function payload(msg) {
  const bucket = header(msg, "Pgoutbox-Object-Bucket");
  if (bucket === undefined) return msg.data;
  const name = String(header(msg, "Pgoutbox-Object-Name"));
  const data = await (await objects.open(bucket)).getBlob(name);
  const digest = data && createHash("sha256").update(data).digest("hex");
  if (!data || data.length !== Number(header(msg, "Pgoutbox-Object-Size"))
    || digest !== header(msg, "Pgoutbox-Object-Sha256")) {
    throw new Error(`object ${name} of bucket ${bucket} is not its pointer's`);
  }
  return data;
}

/** @type {Objm} */
let objects;

/** A connection that reconnects for good (a nats-server restart is a pause), and its JetStream. */
export async function connectNats() {
  const nc = await connect({
    servers: NATS_URL, maxReconnectAttempts: -1, reconnectTimeWait: 500, waitOnFirstConnect: true,
  });
  objects = new Objm(nc);
  return { nc, js: jetstream(nc), jsm: await jetstreamManager(nc) };
}

/** The consumer's own database, with `schema` made (one process at a time). @param {string} schema */
export async function connectDb(schema) {
  const db = new pg.Client({ connectionString: DATABASE_URL });
  db.on("error", (err) => {
    say(`the database connection ended: ${err}`);
    process.exit(1); // nothing unapplied was acknowledged: a restart reads it again
  });
  await db.connect();
  await transaction(db, async () => {
    await db.query("SELECT pg_advisory_xact_lock(7100)");
    await db.query(schema);
  });
  return db;
}

/** Runs `body` in one transaction of `db`. @template T @param {pg.Client} db @param {() => Promise<T>} body */
export async function transaction(db, body) {
  await db.query("BEGIN");
  try {
    const result = await body();
    await db.query("COMMIT");
    return result;
  } catch (err) {
    await db.query("ROLLBACK");
    throw err;
  }
}

/**
 * A recipe's tables: the event ids applied, and its effects. Yours are your own tables;
 * keep the ids applied beside them, written in the same transaction.
 * @param {string} recipe
 */
export function schema(recipe) {
  return `
    CREATE TABLE IF NOT EXISTS ${recipe}_applied (event_id text PRIMARY KEY);
    CREATE TABLE IF NOT EXISTS ${recipe}_effects (
      event_id text NOT NULL, kind text NOT NULL, aggregate_id text,
      payload bytea NOT NULL, stream_sequence bigint NOT NULL,
      applied_in bigint NOT NULL DEFAULT txid_current(), applied_order bigserial);`;
}

/**
 * Applies the message's event once, by its event id, in the transaction `db` is in: an
 * event applied before (redelivered, replayed, seeded again) is nothing.
 * @param {pg.Client} db @param {string} recipe @param {JsMsg} msg
 */
export async function applyOnce(db, recipe, msg) {
  const id = eventId(msg);
  const insert = `INSERT INTO ${recipe}_applied VALUES ($1) ON CONFLICT DO NOTHING`;
  if ((await db.query(insert, [id])).rowCount === 0) return;
  // The effect: yours goes here. This one writes the event down.
  await db.query(
    `INSERT INTO ${recipe}_effects (event_id, kind, aggregate_id, payload, stream_sequence)
     VALUES ($1, $2, $3, $4, $5)`,
    [id, kind(msg), header(msg, "Outbox-Aggregate-Id"), Buffer.from(await payload(msg)), msg.seq],
  );
}

/**
 * A durable pull consumer with the settings consume.md gives: explicit acks (after the
 * effects are committed), ack_wait, many messages pending, never giving up on one.
 * @param {{ js: JetStreamClient, jsm: import("@nats-io/jetstream").JetStreamManager }} nats
 * @param {string} name @param {string} filter
 */
export async function durable({ js, jsm }, name, filter) {
  await jsm.consumers.add(STREAM, {
    durable_name: name,
    filter_subject: filter,
    ack_policy: AckPolicy.Explicit,
    ack_wait: ACK_WAIT * 1e9, // nanoseconds
    max_ack_pending: 10000,
    max_deliver: -1,
    deliver_policy: DeliverPolicy.All,
  });
  return js.consumers.get(STREAM, name);
}

/** The next messages: none after a second without any, or while the server is away. @param {Consumer} consumer */
export async function fetch(consumer) {
  /** @type {JsMsg[]} */
  const messages = [];
  try {
    for await (const msg of await consumer.fetch({ max_messages: 100, expires: 1000 })) {
      messages.push(msg);
    }
  } catch (err) {
    say(`fetch: ${err}; again`);
    await sleep(500);
  }
  return messages;
}

/** num_ack_pending, or undefined while the server is away. @param {Consumer} consumer */
export async function ackPending(consumer) {
  try {
    return (await consumer.info()).num_ack_pending;
  } catch {
    return undefined;
  }
}

/**
 * A double ack: the server has counted it when this returns, so the num_ack_pending read
 * next counts it. Lost (the server away), the message comes back: applied, it is nothing.
 * @param {JsMsg} msg
 */
export async function ack(msg) {
  try {
    await msg.ackAck();
  } catch (err) {
    say(`ack of ${msg.seq} lost (${err}): it comes back, and is nothing`);
  }
}

/**
 * Messages held unacknowledged, by stream sequence, kept from ack_wait's redelivery by an
 * in-progress ack every third of it.
 */
export class Held {
  /** @type {Map<number, JsMsg>} */
  messages = new Map();
  touched = Date.now();

  /** A redelivery of a message held replaces it: ack the newest delivery. @param {JsMsg} msg */
  add(msg) {
    this.messages.set(msg.seq, msg);
  }

  /** The messages held, by stream sequence. */
  sorted() {
    return [...this.messages.entries()].sort(([a], [b]) => a - b).map(([, msg]) => msg);
  }

  keep() {
    if (Date.now() - this.touched < (ACK_WAIT * 1000) / 3) return;
    this.touched = Date.now();
    for (const msg of this.messages.values()) {
      try {
        msg.working();
      } catch {
        // the server is away: the message may come back, and is held again
      }
    }
  }
}
