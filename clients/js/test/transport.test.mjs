// The transports without a herald: the NDJSON splitter fed a byte at a time,
// the stream's URL, batches and refusals, the fallback rule over its
// outcomes, and the client over HTTP-streaming and falling back to it
// against a scripted node:http server that speaks just enough Herald (a
// stream of NDJSON frames, command posts, and a WebSocket upgrade it refuses
// or lets through as told). test/streams.test.mjs has the same stories
// against the real `herald`.

import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer } from 'node:http';
import WebSocket, { WebSocketServer } from 'ws';

import { HeraldClient } from '../dist/index.js';
import { Fallback, SILENT_CLOSES_MAX } from '../dist/fallback.js';
import { Lines } from '../dist/ndjson.js';
import { BATCH_BYTES, BATCH_MAX, batchSize, refusalCode, streamUrl } from '../dist/stream.js';
import { Events, cleanups, test } from './harness.mjs';

// ---------------------------------------------------------------- sans I/O

test('NDJSON: lines split across chunks anywhere, a UTF-8 character cut in two, CRLF, empty lines as heartbeats', () => {
  const text = '{"op":"welcome","session":"s1"}\n\n{"op":"msg","data":"zoë \u{1F600}"}\r\n{"op":"ok","id":1}\n{"partial":';
  const bytes = new TextEncoder().encode(text);
  const lines = new Lines();
  const got = [];
  for (const byte of bytes) got.push(...lines.push(Uint8Array.of(byte)));
  assert.deepEqual(got, ['{"op":"welcome","session":"s1"}', '', '{"op":"msg","data":"zoë \u{1F600}"}', '{"op":"ok","id":1}']);
  // The rest comes with the next chunk.
  assert.deepEqual(lines.push(new TextEncoder().encode('1}\n')), ['{"partial":1}']);
  // Whole, in one chunk: the same lines.
  assert.deepEqual(new Lines().push(bytes), got);
});

test('the stream beside each WebSocket URL', () => {
  assert.equal(streamUrl('wss://herald.example.com/ws'), 'https://herald.example.com/stream');
  assert.equal(streamUrl('ws://127.0.0.1:8080/ws'), 'http://127.0.0.1:8080/stream');
  assert.equal(streamUrl('wss://example.com/realtime/ws?tenant=a'), 'https://example.com/realtime/stream?tenant=a');
  assert.equal(streamUrl('wss://example.com/'), 'https://example.com/stream');
  assert.equal(streamUrl('wss://example.com/herald'), 'https://example.com/herald/stream');
});

test('batches: at most 64 commands, and a bounded body unless one command alone is larger', () => {
  const small = Array.from({ length: 100 }, (_, i) => JSON.stringify({ op: 'ack', topic: 't', seq: i }));
  assert.equal(BATCH_MAX, 64);
  assert.equal(batchSize(small), 64);
  assert.equal(batchSize(small.slice(0, 3)), 3);
  const big = 'x'.repeat(BATCH_BYTES);
  assert.equal(batchSize([big, ...small]), 1, 'a large one goes alone');
  // 5,000 characters count as 15,001 bytes (3 a character at most, and the newline): two fit, not three.
  const part = 'y'.repeat(5000);
  assert.equal(batchSize([part, part, part, part]), 2, 'the bound counts UTF-8 bytes at their most');
});

test("a refused stream: Herald's refusals as the WebSocket's close codes, a proxy's as a stream that could not be opened", () => {
  assert.equal(refusalCode(401, 'unauthorized'), 4502);
  assert.equal(refusalCode(403, 'forbidden'), 4502);
  assert.equal(refusalCode(401, 'token_expired'), 4004);
  assert.equal(refusalCode(503, 'draining'), 1012);
  assert.equal(refusalCode(429, 'rate_limited'), 4003);
  assert.equal(refusalCode(413, 'too_large'), 1009);
  assert.equal(refusalCode(403, undefined), undefined, "a proxy's 403 says nothing of the session");
  assert.equal(refusalCode(502, undefined), undefined);
  assert.equal(refusalCode(404, 'not_found'), undefined);
});

test('the fallback rule: a WebSocket that cannot open is followed at once by a stream to the same server; welcomed, it stays until the retry time', () => {
  const f = new Fallback('auto', 60_000);
  assert.equal(f.current, 'websocket');
  assert.equal(f.next(0), 'websocket');
  f.failed('websocket', false, false, 1000); // the upgrade refused
  assert.equal(f.probing, true);
  assert.equal(f.next(1000), 'stream');
  assert.equal(f.probing, false);
  assert.equal(f.welcomed('stream'), true, 'a change');
  // Reconnects on the fallback stay there for a minute after the failure.
  assert.equal(f.next(30_000), 'stream');
  assert.equal(f.next(60_999), 'stream');
  assert.equal(f.next(61_000), 'websocket');
  // Blocked still: the stream again at once, and another minute.
  f.failed('websocket', false, false, 61_000);
  assert.equal(f.next(61_000), 'stream');
  assert.equal(f.welcomed('stream'), false, 'no change');
  assert.equal(f.next(100_000), 'stream');
  assert.equal(f.next(121_000), 'websocket');
  assert.equal(f.welcomed('websocket'), true, 'back on the WebSocket');
  assert.equal(f.next(121_001), 'websocket');
});

test('the fallback rule: a server that is down (WebSocket and stream both fail) keeps the WebSocket first; silent closes count to 3', () => {
  const f = new Fallback('auto', 60_000);
  f.failed('websocket', false, false, 0);
  assert.equal(f.next(0), 'stream');
  f.failed('stream', false, false, 0); // the stream cannot get there either
  assert.equal(f.next(10), 'websocket', 'the WebSocket again: it was the server, not the transport');
  // Upgrades that go through and then close with nothing said.
  for (let n = 1; n < SILENT_CLOSES_MAX; n++) {
    f.failed('websocket', true, false, n);
    assert.equal(f.next(n), 'websocket', `after ${n} silent close(s)`);
  }
  f.failed('websocket', true, true, 5); // the server spoke (an `err`): the WebSocket works
  f.failed('websocket', true, false, 6);
  assert.equal(f.next(6), 'websocket', 'the count starts over after a frame');
  f.failed('websocket', true, false, 7);
  f.failed('websocket', true, false, 8);
  assert.equal(f.next(8), 'stream', `after ${SILENT_CLOSES_MAX} in a row`);
});

test('the fallback rule: a forced transport is never left', () => {
  for (const mode of ['websocket', 'stream']) {
    const f = new Fallback(mode, 0);
    assert.equal(f.current, mode);
    f.failed('websocket', false, false, 0);
    f.failed('stream', false, false, 0);
    assert.equal(f.next(1e9), mode);
    assert.equal(f.probing, false);
  }
});

// ---------------------------------------------------------------- a scripted server

/**
 * A node:http server that speaks just enough Herald over HTTP-streaming:
 * `POST /stream` answers `welcome` (session `s1`, resumed when asked) and
 * stays open; `POST /stream/s1` takes newline-delimited commands (`202`, or
 * what `answer(commands)` says) and answers `sub` and `pub` on the stream.
 * A WebSocket upgrade is refused with 403 while `upgrades` is false, else
 * the same protocol over the WebSocket. Every request, command and
 * connection is an event.
 */
async function scripted(cleanup, events, { answer = () => 202, pingMs = 25_000 } = {}) {
  const state = { upgrades: false, streams: [], seq: 0 };
  const reply = (write, m) => {
    if (m.op === 'sub') write({ op: 'ok', id: m.id, topic: m.topic, seq: state.seq, epoch: 'e1' });
    if (m.op === 'pub') write({ op: 'ok', id: m.id, topic: m.topic, seq: ++state.seq, epoch: 'e1' });
  };
  const welcome = (m) => ({ op: 'welcome', session: 's1', ping_ms: pingMs, resumed: m.resume === 's1' });
  const server = createServer(async (req, res) => {
    let body = '';
    for await (const chunk of req) body += chunk;
    const auth = req.headers.authorization;
    if (req.method === 'POST' && req.url === '/stream') {
      const hello = JSON.parse(body);
      events.push({ t: 'stream', hello, type: req.headers['content-type'] });
      res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-cache' });
      const write = (frame) => res.write(`${JSON.stringify(frame)}\n`);
      write(welcome(hello));
      state.streams.push({ res, write });
      return;
    }
    if (req.method === 'POST' && req.url === '/stream/s1') {
      const commands = body.split('\n').map((line) => JSON.parse(line));
      const status = await answer(commands);
      events.push({ t: 'post', status, auth, ops: commands.map((c) => c.op), commands });
      res.writeHead(status).end();
      if (status === 202) for (const m of commands) reply(state.streams.at(-1).write, m);
      return;
    }
    res.writeHead(404).end();
  });
  const wss = new WebSocketServer({ noServer: true });
  server.on('upgrade', (req, socket, head) => {
    events.push({ t: 'upgrade', allowed: state.upgrades });
    if (!state.upgrades) {
      socket.end('HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      const write = (frame) => ws.send(JSON.stringify(frame));
      ws.on('message', (data) => {
        const m = JSON.parse(String(data));
        events.push({ t: 'ws-got', op: m.op });
        if (m.op === 'hello') write(welcome(m));
        else reply(write, m);
      });
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  cleanup.push(() => {
    server.closeAllConnections();
    return new Promise((r) => server.close(r));
  });
  /** Sends `frame` on the newest stream. */
  state.push = (frame) => state.streams.at(-1).write(frame);
  /** A heartbeat (an empty line) on the newest stream. */
  state.beat = () => state.streams.at(-1).res.write('\n');
  /** Ends the newest stream's connection abruptly. */
  state.cut = () => state.streams.at(-1).res.socket.destroy();
  state.url = `ws://127.0.0.1:${server.address().port}/ws`;
  return state;
}

function client(cleanup, events, url, options) {
  const c = new HeraldClient({ urls: [url], WebSocket, backoff: { initialMs: 20, maxMs: 100 }, ...options });
  c.on('state', (s) => events.push({ t: 'state', ...s }));
  c.on('transport', (x) => events.push({ t: 'transport', ...x }));
  c.on('error', (e) => events.push({ t: 'error', name: e.name, code: e.code }));
  cleanup.push(() => c.close());
  return c;
}

test('stream, scripted: hello as the body, commands posted in order with the token, batched while a post is out, a 429 tried again', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  // The first post is held until released; the first batch after it is refused once as busy.
  let release;
  const held = new Promise((r) => (release = r));
  let posts = 0;
  let busy = false;
  const server = await scripted(cleanup, events, {
    answer: async () => {
      events.push({ t: 'posting', n: ++posts });
      if (posts === 1) await held;
      if (posts === 2 && !busy) {
        busy = true;
        return 429;
      }
      return 202;
    },
  });
  const c = client(cleanup, events, server.url, { transport: 'stream', getToken: () => 'tok-1' });
  const seen = [];
  const sub = c.subscribe('news');
  sub.on('message', (m) => seen.push(m.seq));
  await c.connect();
  assert.equal(c.transport, 'stream');
  const stream = events.list.find((e) => e.t === 'stream');
  assert.deepEqual(stream.hello, { op: 'hello', token: 'tok-1' });
  // The `sub` is out and held: these three wait, and go together, in order.
  await events.wait('the sub posted', (e) => e.t === 'posting');
  const pubs = [c.publish('news', 1), c.publish('news', 2), c.publish('news', 3)];
  release();
  const results = await Promise.all(pubs);
  assert.deepEqual(results.map((r) => r.seq), [1, 2, 3]);
  const sent = events.filter((e) => e.t === 'post');
  assert.deepEqual(
    sent.map((p) => [p.status, p.ops]),
    [
      [202, ['sub']],
      [429, ['pub', 'pub', 'pub']],
      [202, ['pub', 'pub', 'pub']],
    ],
  );
  assert.deepEqual(sent[2].commands.map((c) => c.data), [1, 2, 3]);
  assert.ok(sent.every((p) => p.auth === 'Bearer tok-1'), 'every post carries the token');
  server.push({ op: 'msg', topic: 'news', seq: 4, data: 'x' });
  server.push({ op: 'msg', topic: 'news', seq: 5, data: 'y' });
  await events.until('acks posted', () => events.filter((e) => e.t === 'post' && e.ops.includes('ack')).length > 0);
  assert.deepEqual(seen, [4, 5]);
});

test('stream, scripted: a stream cut is resumed (the session named in the new hello); heartbeats keep one alive, their silence ends it', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  // The client gives up after 2 x ping_ms of silence.
  const PING = 300;
  const server = await scripted(cleanup, events, { pingMs: PING });
  const c = client(cleanup, events, server.url, { transport: 'stream' });
  const seen = [];
  c.subscribe('news').on('message', (m) => seen.push(m.seq));
  await c.connect();
  await events.wait('the sub', (e) => e.t === 'post' && e.ops.includes('sub'));
  server.push({ op: 'msg', topic: 'news', seq: 1, data: 1 });
  server.cut();
  await events.wait('resumed', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
  const hellos = events.filter((e) => e.t === 'stream').map((e) => e.hello);
  assert.deepEqual(hellos, [{ op: 'hello' }, { op: 'hello', resume: 's1' }]);
  // Resumed: the subscription is the session's still, not sent again.
  assert.equal(events.filter((e) => e.t === 'post' && e.ops.includes('sub')).length, 1);
  // A redelivered seq is dropped as over a WebSocket.
  server.push({ op: 'msg', topic: 'news', seq: 1, data: 1 });
  server.push({ op: 'msg', topic: 'news', seq: 2, data: 2 });
  await events.until('seq 2', () => seen.includes(2));
  assert.deepEqual(seen, [1, 2]);
  // Nothing but heartbeats for 6 x ping_ms: the stream lives; then silence: found dead, resumed.
  let beats = 0;
  await new Promise((resolve) => {
    const timer = setInterval(() => {
      server.beat();
      if (++beats === 18) {
        clearInterval(timer);
        resolve();
      }
    }, PING / 3);
    cleanup.push(() => clearInterval(timer));
  });
  assert.equal(events.filter((e) => e.t === 'state' && e.state === 'disconnected').length, 1, 'alive while beating');
  const dead = await events.wait('found dead', (e) => e.t === 'state' && e.state === 'disconnected' && e.closeCode === 1006, 5000);
  assert.ok(dead);
  await events.until('a third stream, resuming', () => events.filter((e) => e.t === 'stream').length === 3);
  assert.equal(events.filter((e) => e.t === 'transport').length, 0, 'forced: never another transport');
  assert.equal(events.filter((e) => e.t === 'upgrade').length, 0, 'forced: no WebSocket tried');
});

test('auto, scripted: the upgrade refused, the stream at once; upgrades let through, the WebSocket again at a reconnect past the retry time', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  const server = await scripted(cleanup, events);
  const c = client(cleanup, events, server.url, { webSocketRetryMs: 200 });
  c.subscribe('news');
  await c.connect();
  assert.equal(c.transport, 'stream');
  const change = await events.wait('the transport event', (e) => e.t === 'transport');
  assert.deepEqual(change, { t: 'transport', transport: 'stream', previous: 'websocket' });
  const disconnected = events.filter((e) => e.t === 'state' && e.state === 'disconnected');
  assert.deepEqual(disconnected.map((d) => d.delayMs), [0], 'the stream right after the refusal, no backoff');
  // Cut before the retry time: the stream again, the WebSocket not tried.
  server.cut();
  await events.until('resumed on the stream', () => events.filter((e) => e.t === 'stream').length === 2 && c.state === 'connected');
  assert.equal(events.filter((e) => e.t === 'upgrade').length, 1);
  // Upgrades get through now; past the retry time, the next reconnect is a WebSocket.
  server.upgrades = true;
  const before = events.list.length;
  await new Promise((r) => setTimeout(r, 250)); // the retry time is a span of time: nothing to wait on but the clock
  server.cut();
  const back = await events.wait('back on the WebSocket', (e) => e.t === 'transport' && e.transport === 'websocket');
  assert.deepEqual(back, { t: 'transport', transport: 'websocket', previous: 'stream' });
  assert.equal(c.transport, 'websocket');
  await events.until('resumed', () => c.state === 'connected');
  assert.ok(events.list.slice(before).some((e) => e.t === 'ws-got' && e.op === 'hello'));
});

test('auto, scripted: a server down for both transports is not a fallback', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  const server = await scripted(cleanup, events);
  const url = server.url;
  // Nothing listens there any more.
  await cleanup.pop()();
  const c = client(cleanup, events, url);
  c.connect().catch(() => {});
  await events.until('three attempts', () => events.filter((e) => e.t === 'state' && e.state === 'disconnected').length >= 4);
  c.close();
  assert.equal(c.transport, 'websocket');
  assert.equal(events.filter((e) => e.t === 'transport').length, 0);
});
