// The client in protobuf mode and with deltas, in Node with the `ws`
// package, against a scripted server (a `ws` server that says what the
// test tells it): what the app sees of every form a `msg` can take, and what
// the client does when a delta does not apply (it subscribes again after the
// last seq it handed over, and ignores the topic's messages until the
// answer, rather than hand over wrong data or skip a seq). Against the real
// `herald` in Chromium: test/wire.test.mjs.

import assert from 'node:assert/strict';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import WebSocket, { WebSocketServer } from 'ws';

import { HeraldClient } from '../dist/index.js';
import { fossil } from '../dist/delta.js';
import { decodeMessage, encodeFrame, protobuf } from '../dist/protobuf.js';
import { Events, JS_ROOT, cleanups, test } from './harness.mjs';

const { vectors } = JSON.parse(readFileSync(join(JS_ROOT, 'test/fixtures/fossil.json'), 'utf8'));
const unhex = (text) => new Uint8Array(Buffer.from(text, 'hex'));
/** The scoreboard's updates: states[0] .. states[n], deltas[i] from states[i] to states[i + 1] (made by the fossil-delta crate). */
const chain = vectors.filter((v) => v.name.startsWith('scoreboard update'));
const states = [unhex(chain[0].source), ...chain.map((v) => unhex(v.target))];
const deltas = chain.map((v) => unhex(v.delta));
const text = (bytes) => new TextDecoder().decode(bytes);
const latin1 = (bytes) => String.fromCharCode(...bytes);

/**
 * A server on a loopback port that welcomes every `hello`, selects
 * `herald.v1.protobuf` where offered (`protobuf`), pushes each command it
 * gets to `events` (`server-got`), and calls `behave(send, command)`;
 * `send(frame)` writes a frame in the connection's protocol.
 */
async function scripted(cleanup, events, behave) {
  const server = new WebSocketServer({
    host: '127.0.0.1',
    port: 0,
    handleProtocols: (offered) => (offered.has('herald.v1.protobuf') ? 'herald.v1.protobuf' : false),
  });
  await once(server, 'listening');
  cleanup.push(() => new Promise((r) => server.close(r)));
  server.on('connection', (socket) => {
    cleanup.push(() => socket.terminate());
    const binary = socket.protocol === 'herald.v1.protobuf';
    const send = (frame) => socket.send(binary ? encodeFrame(frame) : JSON.stringify(frame));
    socket.on('message', (data, isBinary) => {
      let m;
      if (isBinary) {
        const decoded = decodeMessage('ClientCommand', new Uint8Array(data));
        const op = Object.keys(decoded)[0];
        m = { op, ...decoded[op], binary: true };
      } else m = { ...JSON.parse(String(data)), binary: false };
      events.push({ t: 'server-got', ...m });
      if (m.op === 'hello') send({ op: 'welcome', session: 's1', ping_ms: 25_000, resumed: false });
      else behave(send, m);
    });
  });
  return `ws://127.0.0.1:${server.address().port}/ws`;
}

function follow(c, topic, events, options) {
  const sub = c.subscribe(topic, options);
  sub.on('message', (m) => events.push({ t: 'msg', seq: m.seq, data: m.data }));
  sub.on('subscribed', (s) => events.push({ t: 'subscribed', ...s }));
  sub.on('reset', (r) => events.push({ t: 'reset', ...r }));
  return sub;
}

/** console.warn's lines while the test runs. */
function warnings(cleanup) {
  const lines = [];
  const warn = console.warn;
  console.warn = (...args) => lines.push(args.join(' '));
  cleanup.push(() => (console.warn = warn));
  return lines;
}

test('JSON: a `full` then deltas (one char per byte) reach the app as the full data; a delta that does not apply: subscribed again from the last seq, nothing wrong, nothing skipped', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  const warned = warnings(cleanup);
  const url = await scripted(cleanup, events, (send, m) => {
    if (m.op !== 'sub') return;
    if (m.since === undefined) {
      send({ op: 'ok', id: m.id, topic: 'scores', seq: 0, epoch: 'e1', delta: true });
      send({ op: 'msg', topic: 'scores', seq: 1, full: text(states[0]) });
      for (let i = 0; i < 4; i++) send({ op: 'msg', topic: 'scores', seq: 2 + i, delta: latin1(deltas[i]) });
      // Seq 6 made against another base than seq 5 (a server's bug): it copies past the end of this base.
      send({ op: 'msg', topic: 'scores', seq: 6, delta: latin1(unhex(vectors.find((v) => v.name.startsWith('binary, a byte')).delta)) });
      // In flight before the server reads the unsub: ignored, replayed after the new `ok`.
      send({ op: 'msg', topic: 'scores', seq: 7, delta: latin1(deltas[5]) });
      send({ op: 'msg', topic: 'scores', seq: 8, full: text(states[0]) });
    } else {
      // The new subscription: replayed in the plain form from `since`, then live (full, then deltas).
      send({ op: 'ok', id: m.id, topic: 'scores', seq: 8, epoch: 'e1', recovered: true, delta: true });
      send({ op: 'msg', topic: 'scores', seq: 6, data: JSON.parse(text(states[5])) });
      send({ op: 'msg', topic: 'scores', seq: 7, data: JSON.parse(text(states[6])) });
      send({ op: 'msg', topic: 'scores', seq: 8, data: JSON.parse(text(states[0])) });
      send({ op: 'msg', topic: 'scores', seq: 9, full: text(states[0]) });
      send({ op: 'msg', topic: 'scores', seq: 10, delta: latin1(deltas[0]) });
    }
  });
  const c = new HeraldClient({ urls: url, WebSocket, delta: fossil });
  cleanup.push(() => c.close());
  follow(c, 'scores', events, { delta: true });
  await c.connect();
  await events.until('seq 10', () => events.list.some((e) => e.t === 'msg' && e.seq === 10));
  const msgs = events.filter((e) => e.t === 'msg');
  assert.deepEqual(msgs.map((m) => m.seq), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 'each seq once, in order');
  const want = [0, 1, 2, 3, 4, 5, 6, 0, 0, 1].map((i) => JSON.parse(text(states[i])));
  assert.deepEqual(msgs.map((m) => m.data), want, 'the full data of each');
  const subs = events.filter((e) => e.t === 'server-got' && e.op === 'sub');
  assert.deepEqual(subs.map((s) => [s.since, s.delta]), [[undefined, true], [5, true]], 'subscribed again after seq 5, deltas asked again');
  const unsub = events.list.findIndex((e) => e.t === 'server-got' && e.op === 'unsub');
  assert.ok(unsub >= 0 && unsub < events.list.indexOf(subs[1]), 'unsubscribed first');
  assert.equal(warned.length, 1, warned.join('\n'));
  assert.match(warned[0], /scores.*bad delta.*subscribing again/);
  assert.deepEqual(events.filter((e) => e.t === 'subscribed').map((s) => [s.recovered, s.delta]), [[undefined, true], [true, true]]);
});

test('protobuf: offered and selected, commands and frames binary; JSON, binary and delta data reach the app whole, history reads bytes', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  const json = (value) => new TextEncoder().encode(JSON.stringify(value));
  const url = await scripted(cleanup, events, (send, m) => {
    if (m.op === 'sub' && m.topic === 'news') {
      send({ op: 'ok', id: m.id, topic: 'news', seq: 0, epoch: 'e1' });
      send({ op: 'msg', topic: 'news', seq: 1, bytes: json({ headline: 'ü ✓' }) });
      send({ op: 'msg', topic: 'news', seq: 2, bytes: Uint8Array.of(0, 0xff, 0xc3, 0x28), binary: true });
    }
    if (m.op === 'sub' && m.topic === 'scores') {
      send({ op: 'ok', id: m.id, topic: 'scores', seq: 0, epoch: 'e1', delta: true });
      send({ op: 'msg', topic: 'scores', seq: 1, bytes: states[0] });
      for (let i = 0; i < deltas.length; i++) send({ op: 'msg', topic: 'scores', seq: 2 + i, bytes: deltas[i], delta: true });
    }
    if (m.op === 'history') {
      send({
        op: 'ok', id: m.id, topic: 'news', epoch: 'e1', seq: 2,
        publications: [{ seq: 1, data: { headline: 'ü ✓' } }, { seq: 2, data: Uint8Array.of(0, 0xff, 0xc3, 0x28), binary: true }],
      });
    }
    if (m.op === 'pub') send({ op: 'ok', id: m.id, topic: m.topic, seq: 3, epoch: 'e1' });
  });
  const c = new HeraldClient({ urls: url, WebSocket, protocol: 'protobuf', protobuf, delta: fossil });
  cleanup.push(() => c.close());
  follow(c, 'news', events);
  follow(c, 'scores', events, { delta: true });
  await c.connect();
  await events.until('every message', () => events.filter((e) => e.t === 'msg').length === 2 + states.length);
  const msgs = events.filter((e) => e.t === 'msg');
  const news = msgs.filter((m) => m.seq <= 2 && !(m.data && m.data.players));
  assert.deepEqual(news.map((m) => m.data), [{ headline: 'ü ✓' }, Uint8Array.of(0, 0xff, 0xc3, 0x28)]);
  const scores = msgs.filter((m) => m.data && m.data.players);
  assert.deepEqual(scores.map((m) => m.seq), states.map((_, i) => i + 1));
  assert.deepEqual(scores.map((m) => m.data), states.map((s) => JSON.parse(text(s))));
  const page = await c.history('news');
  assert.deepEqual(page.publications, [{ seq: 1, data: { headline: 'ü ✓' } }, { seq: 2, data: Uint8Array.of(0, 0xff, 0xc3, 0x28), binary: true }]);
  assert.deepEqual(await c.publish('chat:1', { text: 'hi' }), { seq: 3, epoch: 'e1' });
  const got2 = events.filter((e) => e.t === 'server-got');
  assert.ok(got2.every((e) => e.binary), 'every command a binary message');
  assert.deepEqual(got2.find((e) => e.op === 'sub' && e.topic === 'scores').delta, true);
  assert.deepEqual(got2.find((e) => e.op === 'pub').data, { text: 'hi' });
});

test('JSON: binary data comes in base64 and reaches the app as bytes, in messages and in history', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  const url = await scripted(cleanup, events, (send, m) => {
    if (m.op === 'sub') {
      send({ op: 'ok', id: m.id, topic: 'frames', seq: 0, epoch: 'e1' });
      send({ op: 'msg', topic: 'frames', seq: 1, data: 'AP/DKA==', binary: true });
      send({ op: 'msg', topic: 'frames', seq: 2, data: 'AP/DKA==' }); // a JSON string, not bytes
    }
    if (m.op === 'history') send({ op: 'ok', id: m.id, topic: 'frames', epoch: 'e1', seq: 1, publications: [{ seq: 1, data: 'AP/DKA==', binary: true }] });
  });
  const c = new HeraldClient({ urls: url, WebSocket });
  cleanup.push(() => c.close());
  follow(c, 'frames', events);
  await c.connect();
  await events.until('two messages', () => events.filter((e) => e.t === 'msg').length === 2);
  assert.deepEqual(events.filter((e) => e.t === 'msg').map((m) => m.data), [Uint8Array.of(0, 0xff, 0xc3, 0x28), 'AP/DKA==']);
  assert.deepEqual((await c.history('frames')).publications, [{ seq: 1, data: Uint8Array.of(0, 0xff, 0xc3, 0x28), binary: true }]);
});

test('the options: protobuf without its codec, and deltas without a decoder, are refused at once', () => {
  assert.throws(() => new HeraldClient({ urls: 'ws://x/ws', WebSocket, protocol: 'protobuf' }), /protobuf/);
  const c = new HeraldClient({ urls: 'ws://x/ws', WebSocket });
  assert.throws(() => c.subscribe('scores', { delta: true }), /delta/);
  c.subscribe('news'); // without deltas: fine
});
