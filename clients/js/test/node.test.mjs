// The SDK in Node 20 with the `ws` package as its WebSocket: against the real
// `herald` (receive, client publish and its typed errors, manual acks), and
// against a tiny server that upgrades and then goes silent (a dead connection
// must be found through the server's ping interval).

import assert from 'node:assert/strict';
import { once } from 'node:events';
import WebSocket, { WebSocketServer } from 'ws';

import { ForbiddenError, HeraldClient } from '../dist/index.js';
import { Events, STEP, cleanups, config, hs256, poll, pod, publish, startHerald, startRedis, test } from './harness.mjs';

/** A client on `urls` whose events go to `events`; closed at cleanup. */
function client(cleanup, events, urls, options = {}) {
  const c = new HeraldClient({ urls, WebSocket, backoff: { initialMs: 50, maxMs: 200 }, ...options });
  c.on('state', (s) => events.push({ t: 'state', ...s }));
  c.on('error', (e) => events.push({ t: 'error', name: e.name, code: e.code }));
  cleanup.push(() => c.close());
  return c;
}

function follow(sub, events) {
  sub.on('message', (m) => events.push({ t: 'msg', ...m }));
  sub.on('subscribed', (s) => events.push({ t: 'subscribed', ...s }));
  sub.on('reset', (r) => events.push({ t: 'reset', ...r }));
  sub.on('error', (e) => events.push({ t: 'suberror', name: e.name, code: e.code }));
  return sub;
}

test('Node: subscribe, receive, publish from the client, and a typed error where the namespace forbids it', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup);
  const events = new Events();
  const c = client(cleanup, events, [herald.ws]);
  follow(c.subscribe('chat:room-1'), events);
  await c.connect();
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  const mine = await c.publish('chat:room-1', { text: 'hi' });
  const theirs = await publish(herald, 'chat:room-1', { text: 'hello' });
  assert.deepEqual([mine.seq, theirs.seq], [1, 2]);
  assert.equal(mine.epoch, theirs.epoch);
  await events.until('both messages', () => events.filter((e) => e.t === 'msg').length === 2);
  assert.deepEqual(events.filter((e) => e.t === 'msg').map((m) => [m.seq, m.data.text]), [[1, 'hi'], [2, 'hello']]);
  // The default namespace lets only backends publish.
  await assert.rejects(c.publish('news', 1), (e) => e instanceof ForbiddenError && e.code === 'forbidden');
  // Bad topic: a HeraldError with the server's code.
  await assert.rejects(c.publish('no spaces allowed', 1), (e) => e.code === 'bad_topic');
});

test('Node: manual acks: a resumed session replays what the app did not ack, and the SDK hands nothing over twice', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup);
  const events = new Events();
  const c = client(cleanup, events, [herald.ws], { acks: 'manual', ackIntervalMs: 10 });
  const sub = follow(c.subscribe('orders'), events);
  await c.connect();
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  for (let n = 1; n <= 4; n++) await publish(herald, 'orders', { n });
  await events.until('four messages', () => events.filter((e) => e.t === 'msg').length === 4);
  c.ack('orders', 2); // the app processed 1 and 2 only
  c.close(); // sends the pending ack first
  c.connect();
  await events.wait('resumed', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
  await publish(herald, 'orders', { n: 5 });
  await events.wait('seq 5', (e) => e.t === 'msg' && e.seq === 5);
  assert.deepEqual(events.filter((e) => e.t === 'msg').map((m) => m.seq), [1, 2, 3, 4, 5]);
  assert.equal(sub.duplicates, 2, 'seqs 3 and 4 were replayed (not acked) and dropped');
});

test('Node: a reset the app never acked is told again on a resume, and reaches the app once', async (t) => {
  const cleanup = cleanups(t);
  const redis = await startRedis(cleanup);
  const herald = await pod(cleanup, redis);
  const events = new Events();
  // Manual acks the app never sends: the session cannot know the reset was read.
  const c = client(cleanup, events, [herald.ws], { acks: 'manual', ackIntervalMs: 10 });
  follow(c.subscribe('quotes'), events);
  await c.connect();
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  await publish(herald, 'quotes', { n: 1 });
  await events.wait('seq 1', (e) => e.t === 'msg' && e.seq === 1);
  await redis.restartEmpty();
  const next = await poll('a publish after the restart', STEP, () => publish(herald, 'quotes', { n: 'after' }), 100);
  await events.wait('reset', (e) => e.t === 'reset');
  await events.wait('the message after it', (e) => e.t === 'msg' && e.seq === next.seq && e.epoch === next.epoch);
  c.close();
  c.connect();
  await events.wait('resumed', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
  const later = await publish(herald, 'quotes', { n: 'later' });
  await events.wait('the message after the resume', (e) => e.t === 'msg' && e.seq === later.seq);
  assert.equal(events.filter((e) => e.t === 'reset').length, 1, 'the repeated reset is not handed over');
});

test('Node: a resume whose token grants less: the subscription it lost gets `error` (the `err` names it), the others go on', async (t) => {
  const cleanup = cleanups(t);
  const secret = 'herald-js-tests-hmac-secret-0123456789';
  const herald = await startHerald(
    cleanup,
    config({ auth: { hmac_secret: secret }, 'namespaces.prices': { subscribe: 'granted', publish: 'nobody' } }),
  );
  const grants = [['prices:*'], ['prices:eur']];
  let minted = 0;
  const getToken = () => hs256(secret, { sub: 'alice', exp: Math.floor(Date.now() / 1000) + 600, subscribe: grants[Math.min(minted++, 1)] });
  const events = new Events();
  const c = client(cleanup, events, [herald.ws], { getToken });
  const eur = c.subscribe('prices:eur');
  follow(eur, events);
  const usd = c.subscribe('prices:usd');
  usd.on('subscribed', () => events.push({ t: 'usd subscribed' }));
  usd.on('error', (e) => events.push({ t: 'lost', topic: usd.topic, name: e.name, code: e.code }));
  await c.connect();
  await events.wait('prices:eur subscribed', (e) => e.t === 'subscribed');
  await events.wait('prices:usd subscribed', (e) => e.t === 'usd subscribed');
  c.close();
  c.connect(); // with the second token, which grants only prices:eur
  await events.wait('resumed', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
  const lost = await events.wait('prices:usd lost', (e) => e.t === 'lost');
  assert.deepEqual(lost, { t: 'lost', topic: 'prices:usd', name: 'ForbiddenError', code: 'forbidden' });
  const sent = await publish(herald, 'prices:eur', { n: 1 });
  await events.wait('prices:eur goes on', (e) => e.t === 'msg' && e.seq === sent.seq);
  assert.deepEqual(events.filter((e) => e.t === 'error' || e.t === 'suberror'), [], 'nothing else went wrong');
});

// ---------------------------------------------------------------- a dead connection

/**
 * A server that speaks just enough Herald: `welcome` (session `s1`, resumed
 * when asked for it, `ping_ms` as given), then whatever `behave(socket,
 * message)` does. Each connection and command is an event.
 */
async function tinyServer(cleanup, events, pingMs, behave) {
  const server = new WebSocketServer({ host: '127.0.0.1', port: 0 });
  await once(server, 'listening');
  cleanup.push(() => new Promise((r) => server.close(r)));
  server.on('connection', (socket) => {
    cleanup.push(() => socket.terminate());
    events.push({ t: 'server-connection' });
    socket.on('message', (data) => {
      const m = JSON.parse(String(data));
      events.push({ t: 'server-got', ...m });
      if (m.op === 'hello') {
        socket.send(JSON.stringify({ op: 'welcome', session: 's1', ping_ms: pingMs, resumed: m.resume === 's1' }));
      }
      behave(socket, m);
    });
  });
  return `ws://127.0.0.1:${server.address().port}/ws`;
}

test('Node: a connection whose pings stop is found dead and replaced, resuming the session', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  const PING = 200; // the client gives up after ping_ms + ping_ms of silence: 400 ms
  let stoppedAt;
  const url = await tinyServer(cleanup, events, PING, (socket, m) => {
    if (m.op !== 'hello' || m.resume) return;
    // Pings for longer than the client's patience, then silence (the TCP connection stays open).
    let pings = 0;
    const timer = setInterval(() => {
      if (++pings > 8) {
        clearInterval(timer);
        stoppedAt = Date.now();
        events.push({ t: 'server-silent' });
        return;
      }
      socket.ping();
    }, 100);
    cleanup.push(() => clearInterval(timer));
  });
  const c = client(cleanup, events, [url]);
  await c.connect();
  const lost = await events.wait('found dead', (e) => e.t === 'state' && e.state === 'disconnected', 5000);
  assert.ok(stoppedAt !== undefined, `alive while pinged: ${JSON.stringify(events.list)}`);
  assert.equal(lost.closeCode, 1006);
  await events.wait('comes back resuming', (e) => e.t === 'server-got' && e.op === 'hello' && e.resume === 's1');
  await events.wait('resumed', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
});

test('Node: a client the app closes from its own `state` listener stays closed: no socket after it, no reconnect', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  // Welcomes, then closes with 4000 (a code that says: come back).
  const url = await tinyServer(cleanup, events, 25_000, (socket, m) => {
    if (m.op === 'hello') socket.close(4000);
  });
  const connections = () => events.filter((e) => e.t === 'server-connection').length;
  for (const closeOn of ['connecting', 'disconnected']) {
    const before = connections();
    // Backoff 0: a reconnect would be due at once.
    const c = new HeraldClient({ urls: [url], WebSocket, backoff: { initialMs: 0, maxMs: 0 } });
    cleanup.push(() => c.close());
    const states = [];
    c.on('state', ({ state }) => {
      states.push(state);
      events.push({ t: 'state', closeOn, state });
      if (state === closeOn) c.close();
    });
    c.connect().catch(() => {}); // rejected when closed before `welcome`
    await events.wait(`closed on ${closeOn}`, (e) => e.closeOn === closeOn && e.state === 'closed');
    // A timer set now runs after any the client set before (Node runs timers
    // of one delay in the order they were set): a reconnect would be under way.
    await new Promise((resolve) => setTimeout(resolve, 0));
    assert.deepEqual(states, closeOn === 'connecting' ? ['connecting', 'closed'] : ['connecting', 'connected', 'disconnected', 'closed']);
    // And no socket was opened after the close: the next connection the
    // server sees is another client's.
    const from = events.list.length;
    const other = client(cleanup, events, [url]);
    other.connect().catch(() => {});
    await events.until("the other client's hello", () => events.list.slice(from).some((e) => e.t === 'server-got' && e.op === 'hello'));
    other.close();
    assert.equal(connections(), before + (closeOn === 'connecting' ? 1 : 2), JSON.stringify(events.list));
  }
});

/** The `ws` socket behind the browser's interface: pings hidden, as a browser hides them. */
class HiddenPings {
  #ws;
  constructor(url) {
    this.#ws = new WebSocket(url);
    this.#ws.onopen = () => this.onopen?.();
    this.#ws.onmessage = (e) => this.onmessage?.(e);
    this.#ws.onclose = (e) => this.onclose?.(e);
    this.#ws.onerror = () => this.onerror?.();
  }
  get readyState() {
    return this.#ws.readyState;
  }
  send(data) {
    this.#ws.send(data);
  }
  close() {
    this.#ws.terminate();
  }
}

test('Node, pings hidden as in a browser: a silent connection is probed; answered it lives, unanswered it is replaced', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  const PING = 150;
  let answered = 0;
  const url = await tinyServer(cleanup, events, PING, (socket, m) => {
    // The probe is a `ping`: its `ok` proves the server is there.
    if (m.op === 'ping' && answered < 2) {
      answered++;
      socket.send(JSON.stringify({ op: 'ok', id: m.id }));
    }
  });
  const c = client(cleanup, events, [url], { WebSocket: HiddenPings });
  await c.connect();
  const lost = await events.wait('found dead', (e) => e.t === 'state' && e.state === 'disconnected', 5000);
  const probes = events.filter((e) => e.t === 'server-got' && e.op === 'ping');
  assert.equal(probes.length, 3, 'two probes answered, the third not');
  assert.equal(new Set(probes.map((p) => p.id)).size, 3, 'each with its own id');
  assert.deepEqual(events.filter((e) => e.t === 'server-got' && e.op !== 'ping' && e.op !== 'hello'), [], 'nothing else sent');
  assert.equal(lost.closeCode, 1006);
  assert.ok(events.list.indexOf(lost) > events.list.indexOf(probes[2]), 'replaced only after an unanswered probe');
  await events.wait('comes back resuming', (e) => e.t === 'server-got' && e.op === 'hello' && e.resume === 's1');
});

test('Node: a session past its resume window: a fresh session, and `sub` with `since` recovers every message missed', async (t) => {
  const cleanup = cleanups(t);
  const WINDOW_MS = 1000;
  const herald = await startHerald(cleanup, config({ session: { resume_window: `${WINDOW_MS}ms` } }));
  const events = new Events();
  const c = client(cleanup, events, [herald.ws]);
  const sub = follow(c.subscribe('ledger'), events);
  await c.connect();
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  for (let n = 1; n <= 2; n++) await publish(herald, 'ledger', { n });
  await events.wait('seq 2', (e) => e.t === 'msg' && e.seq === 2);
  c.close();
  for (let n = 3; n <= 5; n++) await publish(herald, 'ledger', { n });
  // The window is a span of time: nothing to wait on but the clock.
  await new Promise((r) => setTimeout(r, WINDOW_MS + 500));
  await c.connect();
  const back = events.filter((e) => e.t === 'state' && e.state === 'connected').at(-1);
  assert.equal(back.resumed, false, 'the session is gone');
  const again = await events.wait('subscribed again', (e) => e.t === 'subscribed' && e.recovered !== undefined);
  assert.deepEqual([again.recovered, again.seq], [true, 2], '`sub` with since 2 in the same epoch');
  await events.wait('seq 5', (e) => e.t === 'msg' && e.seq === 5);
  assert.deepEqual(events.filter((e) => e.t === 'msg').map((m) => m.seq), [1, 2, 3, 4, 5]);
  assert.equal(sub.duplicates, 0, '`since` replays nothing twice');
  assert.equal(events.filter((e) => e.t === 'reset').length, 0);
});
