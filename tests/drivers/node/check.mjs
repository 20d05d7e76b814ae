// Exercises the official MongoDB Node.js driver (npm `mongodb`) against a replica set the way a
// CDC client does: connect, write, read a collection change stream, resume it with resumeAfter and
// startAfter (also from the stream's post-batch resume token and after an invalidate), follow a
// transaction with fullDocument updateLookup, open a deployment-wide stream with
// startAtOperationTime, and print one JSON line with everything it saw.
// tests/drivers/test_official_drivers.py runs it and asserts on the output;
// tests/drivers/java/.../DriverCheck.java is the Java twin with the same scenario.
//
// Usage: node check.mjs <connection string> <database> [auto-resume]. Any failure exits 1 with
// the phase and the driver's own message on stderr.
import { createRequire } from 'node:module';
import { BSON, MongoClient } from 'mongodb';

const COLLECTION = 'driver_check';
// How long one phase waits for the change events it expects before it gives up.
const EVENT_DEADLINE_MS = 20_000;
// Server-side wait of each getMore; also the quiet period that proves no extra event follows.
const MAX_AWAIT_MS = 300;
// Scenario argument: the driver's own resume after network and resumable server errors.
const AUTO_RESUME = 'auto-resume';
// Fail points are scoped to this client's connections by appName.
const APP_NAME = 'mongocdc-driver-check';

const driverVersion = createRequire(import.meta.url)('mongodb/package.json').version;
let phase = 'connect';

/** The driver-independent summary of events that the pytest side compares across drivers. */
function describe(events) {
  return events.map((e) => {
    const d = {
      op: e.operationType,
      ns: e.ns === undefined ? null : `${e.ns.db}.${e.ns.coll}`,
      id: e.documentKey === undefined ? null : e.documentKey._id,
      token: typeof e._id._data === 'string' ? e._id._data : BSON.EJSON.stringify(e._id),
      doc: e.fullDocument === undefined ? null : e.fullDocument,
      txn: e.txnNumber === undefined ? null : e.txnNumber,
      lsid: e.lsid !== undefined,
    };
    if (e.updateDescription !== undefined) {
      d.updated = e.updateDescription.updatedFields;
      d.removed = e.updateDescription.removedFields;
    }
    return d;
  });
}

/**
 * Reads `count` events, then waits one more getMore so that an extra (duplicate or stray) event
 * shows up in the output instead of passing unnoticed.
 */
async function read(stream, count) {
  const events = [];
  const deadline = Date.now() + EVENT_DEADLINE_MS;
  while (events.length < count) {
    const event = await stream.tryNext();
    if (event !== null) {
      events.push(event);
    } else if (Date.now() > deadline) {
      throw new Error(`expected ${count} change events within ${EVENT_DEADLINE_MS} ms, got ` +
        `${events.length}: ${BSON.EJSON.stringify(describe(events))}`);
    }
  }
  const extra = await stream.tryNext();
  if (extra !== null) {
    events.push(extra);
  }
  return events;
}

async function readUntilInvalidate(stream) {
  const events = [];
  const deadline = Date.now() + EVENT_DEADLINE_MS;
  while (events.length === 0 || events[events.length - 1].operationType !== 'invalidate') {
    const event = await stream.tryNext();
    if (event !== null) {
      events.push(event);
    } else if (Date.now() > deadline) {
      throw new Error(`no invalidate event within ${EVENT_DEADLINE_MS} ms after dropping the ` +
        `collection, got: ${BSON.EJSON.stringify(describe(events))}`);
    }
  }
  return events;
}

/**
 * Opens a change stream and sends its aggregate right away (the driver is lazy otherwise), so
 * that writes made after this returns are inside the stream.
 */
async function watch(coll, options) {
  const stream = coll.watch([], { maxAwaitTimeMS: MAX_AWAIT_MS, ...options });
  const first = await stream.tryNext();
  return { stream, first };
}

async function readResumed(coll, options, count) {
  const { stream, first } = await watch(coll, options);
  try {
    const rest = await read(stream, first === null ? count : count - 1);
    return first === null ? rest : [first, ...rest];
  } finally {
    await stream.close();
  }
}

async function run(client, db) {
  const out = {};
  const coll = db.collection(COLLECTION);
  phase = 'hello';
  const hello = await db.command({ hello: 1 });
  const buildInfo = await db.command({ buildInfo: 1 });
  out.server = { setName: hello.setName, isWritablePrimary: hello.isWritablePrimary, version: buildInfo.version };

  phase = 'drop';
  await coll.drop().catch((e) => {
    if (e.codeName !== 'NamespaceNotFound') throw e;
  });
  await db.createCollection(COLLECTION);

  phase = 'open change stream';
  const opened = await watch(coll, {});
  if (opened.first !== null) {
    throw new Error(`fresh change stream returned an event before any write: ${BSON.EJSON.stringify(opened.first)}`);
  }
  const stream = opened.stream;
  let tokenAfterUpdate;
  let latestToken;
  try {
    phase = 'writes';
    const i1 = await coll.insertOne({ _id: 1, v: 1 });
    const i2 = await coll.insertOne({ _id: 2, v: 1 });
    const u1 = await coll.updateOne({ _id: 1 }, { $set: { v: 2 } });
    const r2 = await coll.replaceOne({ _id: 2 }, { _id: 2, v: 3 });
    const d1 = await coll.deleteOne({ _id: 1 });
    out.writes = {
      inserted: [i1.insertedId, i2.insertedId],
      matched: [u1.matchedCount, r2.matchedCount],
      modified: [u1.modifiedCount, r2.modifiedCount],
      deleted: d1.deletedCount,
    };

    phase = 'find';
    out.documents = await coll.find().sort({ _id: 1 }).toArray();

    phase = 'read change stream';
    const events = await read(stream, 5);
    out.events = describe(events);
    tokenAfterUpdate = events[2]._id;
    latestToken = stream.resumeToken;
  } finally {
    await stream.close();
  }

  phase = 'writes while closed';
  await coll.insertOne({ _id: 3, v: 1, tmp: true });
  await coll.updateOne({ _id: 3 }, { $set: { v: 4 }, $unset: { tmp: '' } });

  phase = 'resumeAfter';
  out.resumeAfter = describe(await readResumed(coll, { resumeAfter: tokenAfterUpdate }, 4));
  phase = 'startAfter';
  out.startAfter = describe(await readResumed(coll, { startAfter: tokenAfterUpdate }, 4));

  phase = 'resumeAfter post-batch resume token';
  const latest = await readResumed(coll, { resumeAfter: latestToken }, 2);
  out.resumeLatest = describe(latest);
  const lastUpdateToken = latest[latest.length - 1]._id;

  phase = 'invalidate';
  const inv = await watch(coll, { resumeAfter: lastUpdateToken });
  let invalidateToken;
  try {
    if (inv.first !== null) {
      throw new Error(`stream resumed after the last event returned an event: ${BSON.EJSON.stringify(inv.first)}`);
    }
    await coll.drop();
    const events = await readUntilInvalidate(inv.stream);
    out.invalidate = describe(events);
    invalidateToken = events[events.length - 1]._id;
  } finally {
    await inv.stream.close();
  }

  phase = 'startAfter invalidate';
  await coll.insertOne({ _id: 10, v: 1 });
  out.afterInvalidate = describe(await readResumed(coll, { startAfter: invalidateToken }, 1));

  phase = 'transaction';
  const txn = await watch(coll, { fullDocument: 'updateLookup' });
  const session = client.startSession();
  try {
    if (txn.first !== null) {
      throw new Error(`fresh change stream returned an event before any write: ${BSON.EJSON.stringify(txn.first)}`);
    }
    await session.withTransaction(async () => {
      await coll.insertOne({ _id: 20, v: 1 }, { session });
      await coll.updateOne({ _id: 10 }, { $set: { v: 2 } }, { session });
    });
    out.transaction = describe(await read(txn.stream, 2));
  } finally {
    await session.endSession();
    await txn.stream.close();
  }

  // What a CDC connector does after its snapshot: a deployment-wide stream from the operationTime
  // of a write, filtered to its databases.
  phase = 'deployment stream startAtOperationTime';
  const writer = client.startSession();
  let start;
  try {
    await coll.insertOne({ _id: 30 }, { session: writer });
    start = writer.operationTime;
  } finally {
    await writer.endSession();
  }
  await coll.deleteOne({ _id: 30 });
  const deployment = client.watch([{ $match: { 'ns.db': db.databaseName } }], {
    startAtOperationTime: start,
    maxAwaitTimeMS: MAX_AWAIT_MS,
  });
  try {
    out.deployment = describe(await read(deployment, 2));
  } finally {
    await deployment.close();
  }
  await coll.drop();
  return out;
}

/**
 * The driver resumes a change stream by itself when a getMore fails with a network error or a
 * resumable server error (mongod's failCommand fail point, as in the drivers' own spec tests): the
 * events keep coming, each exactly once.
 */
async function runAutoResume(client, db) {
  const out = {};
  const coll = db.collection(COLLECTION);
  const admin = client.db('admin');
  const failGetMore = (data) => admin.command({
    configureFailPoint: 'failCommand',
    mode: { times: 1 },
    data: { ...data, failCommands: ['getMore'], appName: APP_NAME },
  });
  // Turns the fail point off; mongod replies with how often it triggered.
  const failPointOff = async () => (await admin.command({ configureFailPoint: 'failCommand', mode: 'off' })).count;

  phase = 'drop';
  await coll.drop().catch((e) => {
    if (e.codeName !== 'NamespaceNotFound') throw e;
  });
  await db.createCollection(COLLECTION);
  const { stream, first } = await watch(coll, {});
  const triggered = [];
  try {
    if (first !== null) {
      throw new Error(`fresh change stream returned an event before any write: ${BSON.EJSON.stringify(first)}`);
    }
    phase = 'first event';
    await coll.insertOne({ _id: 1 });
    const events = await read(stream, 1);

    phase = 'resume after the connection closes during getMore';
    await failGetMore({ closeConnection: true });
    await coll.insertMany([{ _id: 2 }, { _id: 3 }]);
    events.push(...await read(stream, 2));
    triggered.push(await failPointOff());

    // failCommand does not add mongod's ResumableChangeStreamError label by itself (the drivers'
    // spec tests rely on that), so the fail point names it, as those tests do.
    phase = 'resume after a getMore error labelled ResumableChangeStreamError';
    await failGetMore({ errorCode: 11602, errorLabels: ['ResumableChangeStreamError'] });
    await coll.insertOne({ _id: 4 });
    events.push(...await read(stream, 1));
    triggered.push(await failPointOff());
    out.events = describe(events);
  } finally {
    await failPointOff();
    await stream.close();
  }
  out.faultsTriggered = triggered;
  await coll.drop();
  return out;
}

async function main() {
  const args = process.argv.slice(2);
  if (args.length < 2 || args.length > 3 || (args.length === 3 && args[2] !== AUTO_RESUME)) {
    process.stderr.write(`usage: node check.mjs <mongodb connection string> <database name> [${AUTO_RESUME}]\n`);
    process.exit(2);
  }
  const client = new MongoClient(args[0], { serverSelectionTimeoutMS: 15_000, appName: APP_NAME });
  try {
    await client.connect();
    const db = client.db(args[1]);
    const out = args.length === 3 ? await runAutoResume(client, db) : await run(client, db);
    out.driver = `node ${driverVersion}`;
    await new Promise((resolve) => {
      process.stdout.write(`${BSON.EJSON.stringify(out, { relaxed: true })}\n`, resolve);
    });
  } finally {
    await client.close();
  }
}

// Exit explicitly once done: after a change stream resumed by itself, driver 6.x leaves its
// server-selection timer running (Topology.selectServer without a timeout context never clears
// it), which would keep the process alive for serverSelectionTimeoutMS after client.close().
main().then(() => process.exit(0), (e) => {
  process.stderr.write(`check.mjs (Node.js driver) failed in phase '${phase}': ${e?.stack ?? e}\n`);
  if (e?.errorResponse !== undefined) {
    process.stderr.write(`server reply: ${BSON.EJSON.stringify(e.errorResponse)}\n`);
  }
  process.exit(1);
});
