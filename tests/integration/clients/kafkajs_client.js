#!/usr/bin/env node
// kafkajs driver for tests/integration: one JSON request as argv[2], one JSON answer on stdout.
// Bytes travel as base64.  Logs go to stderr.  Exit code 1 with {"error": ...} on failure.
//
//   {"op": "produce",  "brokers": [...], "topic": T, "records": [{"key": b64|null, "value": b64,
//                      "headers": [[name, b64], ...]}], "idempotent": bool}
//   {"op": "consume",  "brokers": [...], "topic": T, "groupId": G, "count": N, "timeoutMs": ms,
//                      "sessionTimeout": ms, "heartbeatInterval": ms, "maxWaitTimeInMs": ms}
//                      -> {"records": [{"partition", "offset", "key", "value", "headers"}]}
//   {"op": "metadata", "brokers": [...]} -> {"topics": {name: partitionCount}}
'use strict';

const { Kafka, logLevel } = require('kafkajs');

const toStderr = () => ({ namespace, level, label, log }) => {
  const { message, ...extra } = log;
  process.stderr.write(`[kafkajs ${label}] ${namespace}: ${message} ${JSON.stringify(extra)}\n`);
};

const b64 = (buf) => (buf === null || buf === undefined ? null : Buffer.from(buf).toString('base64'));
const unb64 = (text) => (text === null || text === undefined ? null : Buffer.from(text, 'base64'));

function kafkaFor(req) {
  return new Kafka({
    clientId: 'ksi-matrix-kafkajs',
    brokers: req.brokers,
    connectionTimeout: 5000,
    requestTimeout: 15000,
    retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000 },
    logLevel: logLevel.WARN,
    logCreator: toStderr,
  });
}

async function produce(req) {
  const producer = kafkaFor(req).producer({
    idempotent: !!req.idempotent,
    maxInFlightRequests: req.idempotent ? 1 : undefined,
    allowAutoTopicCreation: false,
  });
  await producer.connect();
  try {
    const messages = req.records.map((r) => {
      const headers = {};
      for (const [name, value] of r.headers) headers[name] = unb64(value);
      return { key: unb64(r.key), value: unb64(r.value), headers };
    });
    await producer.send({ topic: req.topic, messages, acks: -1 });
  } finally {
    await producer.disconnect();
  }
  return { produced: req.records.length };
}

async function consume(req) {
  const consumer = kafkaFor(req).consumer({
    groupId: req.groupId,
    sessionTimeout: req.sessionTimeout,
    rebalanceTimeout: req.sessionTimeout,
    heartbeatInterval: req.heartbeatInterval,
    maxWaitTimeInMs: req.maxWaitTimeInMs,
    allowAutoTopicCreation: false,
  });
  const records = [];
  const next = new Map(); // partition -> offset after the last record read
  let finish;
  const done = new Promise((resolve) => { finish = resolve; });
  await consumer.connect();
  try {
    await consumer.subscribe({ topics: [req.topic], fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        if (records.length >= req.count) return;
        const headers = Object.entries(message.headers || {}).flatMap(([name, value]) =>
          (Array.isArray(value) ? value : [value]).map((v) => [name, b64(v)]));
        records.push({
          partition,
          offset: Number(message.offset),
          key: b64(message.key),
          value: b64(message.value),
          headers,
        });
        next.set(partition, BigInt(message.offset) + 1n);
        if (records.length >= req.count) finish();
      },
    });
    const timer = setTimeout(() => finish(), req.timeoutMs);
    await done;
    clearTimeout(timer);
    if (records.length < req.count) {
      throw new Error(`consumed ${records.length} of ${req.count} records in ${req.timeoutMs} ms`);
    }
    await consumer.commitOffsets([...next].map(([partition, offset]) => (
      { topic: req.topic, partition, offset: offset.toString() })));
  } finally {
    await consumer.disconnect();
  }
  return { records };
}

async function metadata(req) {
  const admin = kafkaFor(req).admin();
  await admin.connect();
  try {
    const names = await admin.listTopics();
    const { topics } = await admin.fetchTopicMetadata({ topics: names });
    const out = {};
    for (const t of topics) out[t.name] = t.partitions.length;
    return { topics: out };
  } finally {
    await admin.disconnect();
  }
}

const ops = { produce, consume, metadata };

(async () => {
  const req = JSON.parse(process.argv[2]);
  const op = ops[req.op];
  if (!op) throw new Error(`unknown op ${req.op}`);
  process.stdout.write(JSON.stringify(await op(req)) + '\n');
})().catch((err) => {
  process.stdout.write(JSON.stringify({ error: String(err && err.stack ? err.stack : err) }) + '\n');
  process.exit(1);
});
