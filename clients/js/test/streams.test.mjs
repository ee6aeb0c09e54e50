// The SDK over HTTP-streaming against the real `herald` (docs/protocol.md,
// "HTTP-streaming"; docs/clients.md, "When WebSockets do not get through"):
// forced (`transport: 'stream'`) in Node, and falling back by itself in
// headless Chromium and in Node where `/ws` is refused, then back on the
// WebSocket once upgrades get through again. Between the client and the pod
// stands a small proxy of this file, as a corporate proxy or an old load
// balancer would: it passes every HTTP request through (streaming, not
// buffering), answers the WebSocket upgrade as it is told (refused with
// 403, dropped, accepted and then closed before anything, or let through),
// and cuts the streams it carries on demand. It also serves the SDK and the
// test page, so that the page and the pod share an origin, as behind a
// deployment's reverse proxy (a cross-origin page needs the pod to answer
// CORS for `/stream`: docs/clients.md).

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, readFileSync } from 'node:fs';
import { createServer, request } from 'node:http';
import net from 'node:net';
import { extname, join, normalize } from 'node:path';
import WebSocket from 'ws';

import { HeraldClient } from '../dist/index.js';
import { Events, JS_ROOT, STEP, cleanups, config, hs256, pod, publish, sdkPage, startBackend, startHerald, startRedis, test } from './harness.mjs';

/**
 * Why the stories against `herald` are skipped: the server side of
 * HTTP-streaming (`POST /stream`, branch h-streams; `POST
 * /stream/<session>`, branch h-commands) is not in this build. `undefined`
 * once it is.
 */
const SERVER = undefined;

const SECRET = 'herald-js-streams-hmac-secret-0123456789';
/** A token for `sub`, good for ten minutes. */
const token = (sub) => hs256(SECRET, { sub, exp: Math.floor(Date.now() / 1000) + 600 });
/** Tokens verified; `default` and `chat` open to subscribers, `chat` to authenticated publishers. */
const keyed = () => config({ auth: { hmac_secret: SECRET } });

// ---------------------------------------------------------------- the proxy

/** What the proxy does with a WebSocket upgrade. */
const UPGRADES = ['refuse', 'drop', 'mute', 'pass'];

/**
 * A proxy in front of `pod` on a loopback port. HTTP requests go through
 * (each on a connection of its own, the response streamed as it comes);
 * `upgrades` says what a WebSocket upgrade gets: `refuse` (403), `drop`
 * (the connection closed, no answer), `mute` (a valid `101`, then the
 * connection closed once the client speaks: an upgrade that opens and
 * carries nothing), `pass` (through to the pod). `cut()` ends every stream
 * it carries; `upgradesSeen` counts the upgrades asked for. `GET /dist/…`
 * (`GET /dist/stream.js`, the lazy chunk, counted in `chunkGets` and
 * answered `503` while `chunkFailures` is above zero)
 * and `GET /test/…` are the SDK's files (`JS_ROOT`): the page's origin is the
 * proxy's.
 */
async function startProxy(cleanup, pod, upgrades = 'refuse') {
  const proxy = { upgrades, upgradesSeen: 0, streamsSeen: 0, chunkFailures: 0, chunkGets: 0 };
  const streams = new Set();
  const server = createServer((req, res) => {
    const path = normalize(decodeURIComponent(new URL(req.url, 'http://x').pathname));
    if (req.method === 'GET' && path === '/dist/stream.js') {
      // The lazily loaded HTTP-streaming link: counted, and refused `chunkFailures` times (a network blip).
      proxy.chunkGets++;
      if (proxy.chunkFailures > 0) {
        proxy.chunkFailures--;
        return res.writeHead(503).end();
      }
    }
    if (req.method === 'GET' && (path.startsWith('/dist/') || path.startsWith('/test/'))) {
      const file = join(JS_ROOT, path);
      if (!existsSync(file)) return res.writeHead(404).end();
      const type = { '.html': 'text/html', '.js': 'text/javascript' }[extname(file)] ?? 'application/octet-stream';
      return res.writeHead(200, { 'content-type': type }).end(readFileSync(file));
    }
    const up = request(
      { host: '127.0.0.1', port: pod.port, method: req.method, path: req.url, headers: req.headers, agent: false },
      (answer) => {
        res.writeHead(answer.statusCode, answer.rawHeaders);
        res.flushHeaders();
        answer.pipe(res);
      },
    );
    up.on('error', () => res.destroy());
    req.pipe(up);
    if (req.method === 'POST' && req.url === '/stream') {
      proxy.streamsSeen++;
      const cut = () => {
        up.destroy();
        res.destroy();
      };
      streams.add(cut);
      res.on('close', () => {
        streams.delete(cut);
        up.destroy();
      });
    }
  });
  server.on('upgrade', (req, socket, head) => {
    proxy.upgradesSeen++;
    socket.on('error', () => {});
    if (proxy.upgrades === 'refuse') {
      socket.end('HTTP/1.1 403 Forbidden\r\ncontent-type: text/html\r\ncontent-length: 22\r\nconnection: close\r\n\r\n<h1>WebSocket off</h1>');
    } else if (proxy.upgrades === 'drop') {
      socket.destroy();
    } else if (proxy.upgrades === 'mute') {
      const accept = createHash('sha1').update(`${req.headers['sec-websocket-key']}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64');
      socket.write(`HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: ${accept}\r\n\r\n`);
      socket.once('data', () => socket.destroy());
    } else {
      const up = net.connect(pod.port, '127.0.0.1', () => {
        const lines = [`${req.method} ${req.url} HTTP/1.1`];
        for (let i = 0; i < req.rawHeaders.length; i += 2) lines.push(`${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}`);
        up.write(`${lines.join('\r\n')}\r\n\r\n`);
        up.write(head);
        socket.pipe(up).pipe(socket);
      });
      up.on('error', () => socket.destroy());
      socket.on('close', () => up.destroy());
    }
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  cleanup.push(() => {
    server.closeAllConnections();
    return new Promise((r) => server.close(r));
  });
  const port = server.address().port;
  Object.assign(proxy, {
    http: `http://127.0.0.1:${port}`,
    ws: `ws://127.0.0.1:${port}/ws`,
    /** Ends every stream the proxy carries, as a network cut would. */
    cut() {
      const n = streams.size;
      for (const cut of [...streams]) cut();
      return n;
    },
  });
  return proxy;
}

// ---------------------------------------------------------------- helpers

/** Checks that `seen` is exactly `first..last`, once each and in order; the figures. */
function exactlyOnce(seen, first, last) {
  const distinct = new Set(seen);
  let lost = 0;
  for (let seq = first; seq <= last; seq++) if (!distinct.has(seq)) lost++;
  const duplicated = seen.length - distinct.size;
  const outOfOrder = seen.filter((seq, i) => i > 0 && seq <= seen[i - 1]).length;
  return { checked: last - first + 1, lost, duplicated, outOfOrder };
}

/** A Node client whose events go to `events`; closed at cleanup. */
function client(cleanup, events, urls, options = {}) {
  const c = new HeraldClient({ urls, WebSocket, backoff: { initialMs: 50, maxMs: 300 }, ...options });
  c.on('state', (s) => events.push({ t: 'state', ...s, transport: c.transport }));
  c.on('transport', (x) => events.push({ t: 'transport', ...x }));
  c.on('error', (e) => events.push({ t: 'error', name: e.name, code: e.code, message: e.message }));
  cleanup.push(() => c.close());
  return c;
}

/** Follows `sub`: its messages, `subscribed`, `reset` and `error` as events. */
function follow(sub, events) {
  sub.on('message', (m) => events.push({ t: 'msg', seq: m.seq, epoch: m.epoch, data: m.data }));
  sub.on('subscribed', (s) => events.push({ t: 'subscribed', ...s }));
  sub.on('reset', (r) => events.push({ t: 'reset', ...r }));
  sub.on('error', (e) => events.push({ t: 'suberror', name: e.name, code: e.code }));
  return sub;
}

const seqs = (events) => events.filter((e) => e.t === 'msg').map((e) => e.seq);
const resumes = (events) => events.filter((e) => e.t === 'state' && e.state === 'connected' && e.resumed).length;

// ---------------------------------------------------------------- forced

test(
  "Node, transport 'stream': subscribe, receive, publish from the client; the stream cut, the session resumed with nothing lost or twice",
  async (t) => {
    const cleanup = cleanups(t);
    const herald = await startHerald(cleanup, keyed());
    // Upgrades would pass: the client must not even try one.
    const proxy = await startProxy(cleanup, herald, 'pass');
    const events = new Events();
    const c = client(cleanup, events, [proxy.ws], { transport: 'stream', getToken: () => token('alice') });
    const sub = follow(c.subscribe('chat:room-1'), events);
    await c.connect();
    assert.equal(c.transport, 'stream');
    await events.wait('subscribed', (e) => e.t === 'subscribed');
    // A client publish goes as a command post; its `ok` comes on the stream.
    const mine = await c.publish('chat:room-1', { n: 1, from: 'alice' });
    assert.equal(mine.seq, 1);
    for (let n = 2; n <= 20; n++) await publish(herald, 'chat:room-1', { n });
    await events.until('seq 20', () => seqs(events).includes(20));
    // Cut, and published meanwhile: the resume brings what was missed.
    assert.equal(proxy.cut(), 1, 'one stream open');
    for (let n = 21; n <= 40; n++) await publish(herald, 'chat:room-1', { n });
    await events.wait('resumed', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
    const late = await c.publish('chat:room-1', { n: 41, from: 'alice' });
    assert.equal(late.seq, 41);
    await events.until('seq 41', () => seqs(events).includes(41));
    const figures = exactlyOnce(seqs(events), 1, 41);
    t.diagnostic(`forced stream, cut once: ${JSON.stringify({ ...figures, redeliveredAndDropped: sub.duplicates })}`);
    assert.deepEqual([figures.lost, figures.duplicated, figures.outOfOrder], [0, 0, 0], JSON.stringify(figures));
    assert.deepEqual(
      events.filter((e) => e.t === 'msg').map((m) => m.data.n),
      Array.from({ length: 41 }, (_, i) => i + 1),
    );
    assert.equal(events.filter((e) => e.t === 'reset').length, 0);
    assert.equal(proxy.upgradesSeen, 0, 'no WebSocket tried');
    assert.equal(proxy.streamsSeen, 2);
    assert.deepEqual(events.filter((e) => e.t === 'transport' || e.t === 'error' || e.t === 'suberror'), []);
  },
  { skip: SERVER },
);

test(
  "Node, transport 'stream': short-lived tokens refreshed over command posts; the posts carry the newest token, the stream stays up past the first one's expiry",
  async (t) => {
    const cleanup = cleanups(t);
    const herald = await startHerald(cleanup, config({ auth: { hmac_secret: SECRET, leeway: '0s' } }));
    const events = new Events();
    let minted = 0;
    // Three seconds each: unrefreshed, the pod ends the stream at expiry; a post with an expired token is a 401.
    const getToken = () => {
      events.push({ t: 'minted', n: ++minted });
      return hs256(SECRET, { sub: 'alice', exp: Math.floor(Date.now() / 1000) + 3 });
    };
    const c = client(cleanup, events, [herald.ws], { transport: 'stream', getToken });
    follow(c.subscribe('chat:room-2'), events);
    await c.connect();
    await events.wait('subscribed', (e) => e.t === 'subscribed');
    const firstExpiry = Math.floor(Date.now() / 1000) + 3;
    await events.wait('a fourth token', (e) => e.t === 'minted' && e.n === 4, 10_000);
    assert.ok(Date.now() > firstExpiry * 1000, 'past the first expiry');
    // A command post now: with the first token it would be refused.
    const mine = await c.publish('chat:room-2', { after: 'refreshes' });
    await events.wait('the message', (e) => e.t === 'msg' && e.seq === mine.seq);
    assert.deepEqual(events.filter((e) => e.t === 'state' && e.state !== 'connected' && e.state !== 'connecting'), [], 'never disconnected');
    assert.deepEqual(events.filter((e) => e.t === 'error' || e.t === 'suberror'), []);
  },
  { skip: SERVER },
);

test(
  "Node, transport 'stream': a pod draining sends its streams the `reconnect` advice; the client follows it to the other pod and misses nothing",
  async (t) => {
    const cleanup = cleanups(t);
    const redis = await startRedis(cleanup);
    const drain = { shutdown: { drain_timeout: '2s' } };
    const [a, b] = [await pod(cleanup, redis, drain), await pod(cleanup, redis, drain)];
    const events = new Events();
    // A backoff of a minute: only the advice can bring the client back within the test.
    const c = client(cleanup, events, [a.ws, b.ws], { transport: 'stream', backoff: { initialMs: 60_000, maxMs: 60_000 } });
    follow(c.subscribe('rolling'), events);
    await c.connect();
    await events.wait('subscribed', (e) => e.t === 'subscribed');
    const N = 120;
    for (let n = 1; n <= N; n++) {
      await publish(b, 'rolling', { n });
      if (n === 40) a.sigterm();
      if (n === 80) await events.wait('resumed on b', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
    }
    await events.until(`seq ${N}`, () => seqs(events).includes(N));
    const figures = exactlyOnce(seqs(events), 1, N);
    assert.deepEqual([figures.lost, figures.duplicated, figures.outOfOrder], [0, 0, 0], JSON.stringify(figures));
    const drained = events.filter((e) => e.t === 'state' && e.state === 'disconnected');
    assert.equal(drained.length, 1, JSON.stringify(drained));
    assert.ok(drained[0].delayMs < 2000, `waited as advised, not the backoff: ${drained[0].delayMs} ms`);
    assert.equal(resumes(events), 1);
    assert.equal(events.filter((e) => e.t === 'reset').length, 0);
  },
  { skip: SERVER },
);

test(
  "Node, transport 'stream': a bad token is refused before the stream begins (401): UnauthorizedError, for good; an expired one is replaced from getToken",
  async (t) => {
    const cleanup = cleanups(t);
    const herald = await startHerald(cleanup, config({ auth: { hmac_secret: SECRET, leeway: '0s' }, 'namespaces.default': { subscribe: 'authenticated' } }));
    const events = new Events();
    let minted = 0;
    const bad = () => {
      minted++;
      return hs256('a-secret-that-is-not-the-pods-0123456789', { sub: 'alice', exp: Math.floor(Date.now() / 1000) + 60 });
    };
    const c = client(cleanup, events, [herald.ws], { transport: 'stream', getToken: bad, backoff: { initialMs: 50, maxMs: 50 } });
    const refused = await c.connect().then(() => undefined, (e) => e);
    assert.deepEqual([refused?.name, refused?.code, refused?.closeCode], ['UnauthorizedError', 'unauthorized', 4502]);
    assert.equal(c.state, 'closed');
    // A reconnect would come within the 50 ms backoff: give it twenty times that.
    await assert.rejects(events.until('another attempt', () => minted > 1, 1000));
    // Expired at the first attempt: a new token, and in.
    let calls = 0;
    const expiring = () => hs256(SECRET, { sub: 'alice', exp: Math.floor(Date.now() / 1000) + (++calls === 1 ? -10 : 600) });
    const d = client(cleanup, events, [herald.ws], { transport: 'stream', getToken: expiring, backoff: { initialMs: 50, maxMs: 50 } });
    await d.connect();
    assert.equal(calls, 2);
    const closed = events.filter((e) => e.t === 'state' && e.state === 'disconnected');
    assert.deepEqual(closed.map((e) => e.closeCode), [4004]);
  },
  { skip: SERVER },
);

// ---------------------------------------------------------------- auto

test(
  "Chromium, auto: /ws refused (403) by a proxy: HTTP-streaming, nothing lost across a cut; upgrades let through: back on the WebSocket at the next reconnect",
  async (t) => {
    const cleanup = cleanups(t);
    const redis = await startRedis(cleanup);
    const herald = await pod(cleanup, redis);
    const proxy = await startProxy(cleanup, herald, 'refuse');
    const events = new Events();
    const page = await sdkPage(cleanup, events, { origin: proxy.http });
    // A retry time of 0: each reconnect on the fallback tries the WebSocket first (the 60 s default is the unit tests').
    await page.evaluate(([urls]) => window.follow(urls, 'ticker', { backoff: { initialMs: 50, maxMs: 300 }, webSocketRetryMs: 0 }), [[proxy.ws]]);
    const fallback = await events.wait('on the stream', (e) => e.t === 'transport');
    assert.deepEqual(fallback, { t: 'transport', transport: 'stream', previous: 'websocket' });
    await events.wait('subscribed', (e) => e.t === 'subscribed');
    assert.equal(await page.evaluate(() => window.client.transport), 'stream');
    const N = 150;
    for (let n = 1; n <= N; n++) {
      await publish(herald, 'ticker', { n });
      if (n === 50) {
        // Mid-stream: cut it. The WebSocket is tried first (refused still), then the stream resumes.
        await events.until('seq 50 at the page', () => events.list.some((e) => e.t === 'msg' && e.seq === 50));
        assert.equal(proxy.cut(), 1);
      }
      if (n === 100) {
        await events.until('seq 100 at the page', () => events.list.some((e) => e.t === 'msg' && e.seq === 100));
        // Upgrades get through now: the next reconnect is a WebSocket.
        proxy.upgrades = 'pass';
        assert.equal(proxy.cut(), 1);
        await events.wait('back on the WebSocket', (e) => e.t === 'transport' && e.transport === 'websocket');
      }
    }
    await events.until(`seq ${N} at the page`, () => events.list.some((e) => e.t === 'msg' && e.seq === N));
    const figures = exactlyOnce(await page.evaluate(() => window.seen), 1, N);
    const dropped = await page.evaluate(() => window.sub.duplicates);
    t.diagnostic(`fallback: ${JSON.stringify({ ...figures, redeliveredAndDropped: dropped, upgrades: proxy.upgradesSeen, streams: proxy.streamsSeen })}`);
    assert.deepEqual([figures.lost, figures.duplicated, figures.outOfOrder], [0, 0, 0], JSON.stringify(figures));
    assert.equal(await page.evaluate(() => window.client.transport), 'websocket');
    const changes = events.filter((e) => e.t === 'transport').map((e) => e.transport);
    assert.deepEqual(changes, ['stream', 'websocket']);
    const connected = events.filter((e) => e.t === 'state' && e.state === 'connected');
    assert.deepEqual(connected.map((e) => [e.transport, e.resumed]), [['stream', false], ['stream', true], ['websocket', true]]);
    assert.equal(proxy.streamsSeen, 2, 'a stream, and one after the cut');
    assert.equal(proxy.upgradesSeen, 3, 'the first, one at the cut (refused), one let through');
    assert.equal(events.filter((e) => e.t === 'reset').length, 0);
    assert.deepEqual(events.filter((e) => e.t === 'error' || e.t === 'suberror' || e.t === 'pageerror'), []);
  },
  { skip: SERVER },
);

test(
  'Chromium, auto: the HTTP-streaming link is not loaded at start; loaded at the first fallback, and where that load fails, an error and the next attempt loads it',
  async (t) => {
    const cleanup = cleanups(t);
    const redis = await startRedis(cleanup);
    const herald = await pod(cleanup, redis);
    // Upgrades let through at first: the page connects without the stream's chunk.
    const proxy = await startProxy(cleanup, herald, 'pass');
    const events = new Events();
    const page = await sdkPage(cleanup, events, { origin: proxy.http });
    await page.evaluate(([urls]) => window.follow(urls, 'ticker', { backoff: { initialMs: 50, maxMs: 300 }, webSocketRetryMs: 0 }), [[proxy.ws]]);
    await events.wait('subscribed', (e) => e.t === 'subscribed');
    await publish(herald, 'ticker', { n: 1 });
    await events.until('seq 1 at the page', () => events.list.some((e) => e.t === 'msg' && e.seq === 1));
    assert.equal(proxy.chunkGets, 0, 'the HTTP-streaming link is loaded only when needed');
    // Upgrades refused from now on, and the chunk's first load fails.
    proxy.upgrades = 'refuse';
    proxy.chunkFailures = 1;
    // The WebSocket ends (closed at the page's end): the reconnect's upgrade is refused, and the client falls back.
    assert.equal(await page.evaluate(() => window.sockets.length), 1);
    await page.evaluate(() => window.sockets[0].close());
    const error = await events.wait('the load failed', (e) => e.t === 'error');
    assert.equal(error.code, 'closed');
    assert.match(error.message, /cannot load the HTTP-streaming link/);
    const fallback = await events.wait('on the stream', (e) => e.t === 'transport');
    assert.deepEqual(fallback, { t: 'transport', transport: 'stream', previous: 'websocket' });
    await events.wait('resumed on the stream', (e) => e.t === 'state' && e.state === 'connected' && e.transport === 'stream');
    await publish(herald, 'ticker', { n: 2 });
    await events.until('seq 2 at the page', () => events.list.some((e) => e.t === 'msg' && e.seq === 2));
    assert.equal(proxy.chunkGets, 2, 'one failed load, one that worked');
    const figures = exactlyOnce(await page.evaluate(() => window.seen), 1, 2);
    assert.deepEqual([figures.lost, figures.duplicated, figures.outOfOrder], [0, 0, 0], JSON.stringify(figures));
    assert.deepEqual(events.filter((e) => e.t === 'suberror' || e.t === 'pageerror'), []);
  },
  { skip: SERVER },
);

test(
  'Node, auto: an upgrade dropped unanswered, or one that opens and closes before anything 3 times, falls back too; a forced WebSocket never does',
  async (t) => {
    const cleanup = cleanups(t);
    const herald = await startHerald(cleanup);
    for (const upgrades of ['drop', 'mute']) {
      const proxy = await startProxy(cleanup, herald, upgrades);
      const events = new Events();
      const c = client(cleanup, events, [proxy.ws]);
      follow(c.subscribe('news'), events);
      await c.connect();
      assert.equal(c.transport, 'stream', upgrades);
      assert.equal(proxy.upgradesSeen, upgrades === 'drop' ? 1 : 3, `${upgrades}: the WebSocket attempts before the fallback`);
      await events.wait('subscribed', (e) => e.t === 'subscribed');
      const sent = await publish(herald, 'news', { upgrades });
      await events.wait('the message', (e) => e.t === 'msg' && e.seq === sent.seq);
      c.close();
    }
    // Forced: the WebSocket alone, however often it fails.
    const proxy = await startProxy(cleanup, herald, 'refuse');
    const events = new Events();
    const c = client(cleanup, events, [proxy.ws], { transport: 'websocket' });
    c.connect().catch(() => {});
    await events.until('five attempts', () => proxy.upgradesSeen >= 5, STEP);
    c.close();
    assert.equal(proxy.streamsSeen, 0);
    assert.equal(events.filter((e) => e.t === 'transport').length, 0);
  },
  { skip: SERVER },
);

// ---------------------------------------------------------------- cookies

test(
  "Chromium, auto, no token: the fallback's stream and its command posts carry the page's cookie; the connect proxy names the user for each",
  async (t) => {
    const cleanup = cleanups(t);
    const backend = await startBackend(cleanup, {
      '/connect': (body) =>
        /(?:^|;\s*)sid=alice-session(;|$)/.test(body.headers?.cookie ?? '') ? [200, { user: 'alice' }] : [401, { message: 'no session' }],
      '/rpc': (body) => [200, { data: { user: body.user } }],
    });
    const herald = await startHerald(
      cleanup,
      config({
        auth: { hmac_secret: SECRET },
        'proxy.connect': { url: `${backend.url}/connect`, timeout: '5s', headers: ['Cookie'] },
        'proxy.rpc': { url: `${backend.url}/rpc`, timeout: '5s' },
        'namespaces.default': { subscribe: 'authenticated' },
      }),
    );
    const proxy = await startProxy(cleanup, herald, 'refuse');
    const events = new Events();
    // The app's login set the cookie for the page's host, which serves /stream too.
    const page = await sdkPage(cleanup, events, { origin: proxy.http, cookie: 'sid=alice-session' });
    await page.evaluate(([url]) => window.follow([url], 'news'), [proxy.ws]);
    await events.wait('on the stream', (e) => e.t === 'transport' && e.transport === 'stream');
    await events.wait('subscribed', (e) => e.t === 'subscribed');
    const sent = await publish(herald, 'news', { for: 'alice' });
    await events.wait('the message', (e) => e.t === 'msg' && e.seq === sent.seq);
    // A command post, as the user the connect proxy named.
    assert.deepEqual(await page.evaluate(() => window.client.rpc('whoami')), { user: 'alice' });
    const asked = backend.requests.filter((r) => r.path === '/connect');
    t.diagnostic(`connect proxy asked ${asked.length} times`);
    assert.ok(asked.length >= 2, `asked for the stream and again for the posts: ${asked.length}`);
    assert.ok(asked.every((r) => /sid=alice-session/.test(r.body.headers?.cookie ?? '')), JSON.stringify(asked.map((r) => r.body.headers)));
    assert.deepEqual(events.filter((e) => e.t === 'error' || e.t === 'suberror' || e.t === 'pageerror'), []);
  },
  { skip: SERVER },
);

// ---------------------------------------------------------------- another origin

/**
 * Why the cross-origin story is skipped: `POST /stream` answers no CORS
 * (no preflight, no `Access-Control-Allow-Origin`) in this build, so a page
 * on another origin than the pod's cannot read its stream. `undefined` once
 * it does.
 */
const CORS = undefined;

test(
  'Chromium, a page on another origin than the pod, transport stream with a token: preflighted posts, subscribe, receive, publish',
  async (t) => {
    const cleanup = cleanups(t);
    const herald = await startHerald(cleanup, keyed());
    const events = new Events();
    // The page is served by the harness's static server: an origin of its own.
    const page = await sdkPage(cleanup, events, { tokens: () => token('alice') });
    await page.evaluate(([url]) => window.follow([url], 'chat:lobby', { token: true, transport: 'stream' }), [herald.ws]);
    await events.wait('subscribed', (e) => e.t === 'subscribed');
    const mine = await page.evaluate(() => window.client.publish('chat:lobby', { from: 'page' }));
    const theirs = await publish(herald, 'chat:lobby', { from: 'backend' });
    await events.until('both messages', () => events.filter((e) => e.t === 'msg').length === 2);
    assert.deepEqual(events.filter((e) => e.t === 'msg').map((m) => [m.seq, m.data.from]), [[mine.seq, 'page'], [theirs.seq, 'backend']]);
    assert.equal(await page.evaluate(() => window.client.transport), 'stream');
    // Again, its preflight cached now: the stream's request may go on a
    // connection the posts left open (the pod serves it there too, through
    // its HTTP server).
    await page.evaluate(() => {
      window.client.close();
      window.client.connect();
    });
    await events.wait('resumed', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
    const again = await page.evaluate(() => window.client.publish('chat:lobby', { from: 'page, again' }));
    await events.wait('the message after the resume', (e) => e.t === 'msg' && e.seq === again.seq);
    assert.deepEqual(events.filter((e) => e.t === 'error' || e.t === 'suberror' || e.t === 'pageerror'), []);
  },
  { skip: CORS },
);
