// Backend hooks through the SDK (docs/hooks.md): the real `herald` with its
// connect, subscribe and rpc proxies pointed at a small node:http backend
// that knows users by a session cookie, as an app's own backend does. Node
// (the `ws` package, whose upgrade request carries the cookie) and headless
// Chromium (a page that sets a cookie and connects with no token at all).
// And, against a tiny WebSocket server, what the SDK sends: `hello.data` on
// every connection, the resume included. Last, the example backend of
// docs/hooks.md (Python's standard library), run as the doc has it.

import assert from 'node:assert/strict';
import { once } from 'node:events';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import WebSocket, { WebSocketServer } from 'ws';

import { DisabledError, HeraldClient, HeraldError, UnauthorizedError } from '../dist/index.js';
import {
  Events,
  REPO,
  START_WAIT,
  STEP,
  bounded,
  cleanups,
  config,
  freePort,
  poll,
  sdkPage,
  spawnOwned,
  startBackend,
  startHerald,
  tempDir,
  test,
} from './harness.mjs';

/**
 * Set while the gateway's side of the hooks (the proxies in the session:
 * branches h-proxy and h-session) is not in this build: the tests that need
 * it are skipped with this reason. `undefined` once it is.
 */
const GATEWAY = undefined;

/** Tokens are required: without a token a client gets in only through the connect proxy. */
const SECRET = 'hooks-test-secret-0123456789abcdef';

/** The backend's sessions: cookie value -> the user it logs in. */
const SESSIONS = { 'alice-session': { user: 'alice', info: { name: 'Alice' } } };

/** The routes of the app's backend (docs/hooks.md has the contract). */
const ROUTES = {
  '/connect': (body) => {
    const sid = /(?:^|;\s*)sid=([^;]+)/.exec(body.headers?.cookie ?? '')?.[1];
    const session = SESSIONS[sid];
    return session ? [200, session] : [401, { message: 'no session' }];
  },
  '/subscribe': (body) =>
    body.topic === 'rooms:vip'
      ? [200, { error: { code: 'not_invited', message: 'ask the host' } }]
      : [200, { data: { welcome: body.topic, invite: body.data ?? null } }],
  '/rpc': (body) => {
    if (body.method === 'whoami') return [200, { data: { user: body.user, data: body.data ?? null } }];
    if (body.method === 'pay') return [200, { error: { code: 'insufficient_funds', message: 'balance 0' } }];
    return [200, { error: { code: 'no_such_method', message: body.method } }];
  },
};

/** Herald with tokens required, and the connect, subscribe and rpc proxies on `backend`. */
function hooked(backend) {
  return config({
    auth: { hmac_secret: SECRET },
    'proxy.connect': { url: `${backend.url}/connect`, timeout: '5s', headers: ['Cookie', 'Origin'] },
    'proxy.subscribe': { url: `${backend.url}/subscribe`, timeout: '5s' },
    'proxy.rpc': { url: `${backend.url}/rpc`, timeout: '5s' },
    'namespaces.rooms': { subscribe: 'authenticated', publish: 'nobody', subscribe_proxy: true },
  });
}

/** The `ws` package's WebSocket with a `Cookie` on its upgrade request, as a browser sends one. */
function withCookie(cookie) {
  return class extends WebSocket {
    constructor(url) {
      super(url, { headers: { cookie } });
    }
  };
}

/** A client on `urls` whose events go to `events`; closed at cleanup. */
function client(cleanup, events, urls, options = {}) {
  const c = new HeraldClient({ urls, WebSocket, backoff: { initialMs: 50, maxMs: 200 }, ...options });
  c.on('state', (s) => events.push({ t: 'state', ...s }));
  c.on('error', (e) => events.push({ t: 'error', name: e.name, code: e.code }));
  cleanup.push(() => c.close());
  return c;
}

test(
  'hooks, Node: no token but a session cookie: the connect proxy sees the cookie and hello.data, and the client is its user',
  async (t) => {
    const cleanup = cleanups(t);
    const backend = await startBackend(cleanup, ROUTES);
    const herald = await startHerald(cleanup, hooked(backend));
    const events = new Events();
    const c = client(cleanup, events, [herald.ws], {
      WebSocket: withCookie('theme=dark; sid=alice-session'),
      helloData: { device: 'test' },
    });
    await c.connect();
    const asked = await backend.requests.wait('the connect proxy asked', (r) => r.path === '/connect');
    assert.equal(asked.body.headers.cookie, 'theme=dark; sid=alice-session');
    assert.deepEqual(asked.body.data, { device: 'test' });
    assert.equal(asked.body.transport, 'websocket');
    assert.equal(typeof asked.body.client, 'string');
    // The backend's rpc proxy is told who calls: the user its connect proxy named.
    assert.deepEqual(await c.rpc('whoami', { x: 1 }), { user: 'alice', data: { x: 1 } });
  },
  { skip: GATEWAY },
);

test(
  'hooks, Node: rpc resolves with the backend\'s data or rejects with its own code; sub.data goes to the subscribe proxy and its data comes back',
  async (t) => {
    const cleanup = cleanups(t);
    const backend = await startBackend(cleanup, ROUTES);
    const herald = await startHerald(cleanup, hooked(backend));
    const events = new Events();
    const c = client(cleanup, events, [herald.ws], { WebSocket: withCookie('sid=alice-session') });
    const lobby = c.subscribe('rooms:lobby', { data: { invite: 'abc' } });
    lobby.on('subscribed', (s) => events.push({ t: 'subscribed', ...s }));
    const vip = c.subscribe('rooms:vip');
    vip.on('error', (e) => events.push({ t: 'suberror', topic: 'rooms:vip', name: e.name, code: e.code }));
    await c.connect();
    const subscribed = await events.wait('rooms:lobby subscribed', (e) => e.t === 'subscribed');
    assert.deepEqual(subscribed.data, { welcome: 'rooms:lobby', invite: { invite: 'abc' } });
    const asked = await backend.requests.wait('the subscribe proxy asked', (r) => r.path === '/subscribe' && r.body.topic === 'rooms:lobby');
    assert.equal(asked.body.user, 'alice');
    // Refused by the backend with its own code.
    const refused = await events.wait('rooms:vip refused', (e) => e.t === 'suberror');
    assert.equal(refused.code, 'not_invited');
    assert.equal(vip.closed, true);

    assert.deepEqual(await c.rpc('whoami'), { user: 'alice', data: null });
    await assert.rejects(c.rpc('pay', { amount: 5 }), (e) => e instanceof HeraldError && e.code === 'insufficient_funds' && e.message === 'balance 0');
    // A method name out of the protocol's alphabet costs no backend call.
    const before = backend.requests.filter((r) => r.path === '/rpc').length;
    await assert.rejects(c.rpc('no spaces'), (e) => e.code === 'malformed');
    assert.equal(backend.requests.filter((r) => r.path === '/rpc').length, before);
    assert.equal(c.state, 'connected', 'refusals end no connection');
  },
  { skip: GATEWAY },
);

test(
  'hooks, Node: no token and no session: the connect proxy\'s 401 is a terminal UnauthorizedError (close 4502), and no reconnect',
  async (t) => {
    const cleanup = cleanups(t);
    const backend = await startBackend(cleanup, ROUTES);
    const herald = await startHerald(cleanup, hooked(backend));
    const events = new Events();
    const c = client(cleanup, events, [herald.ws], { WebSocket: withCookie('sid=stolen') });
    await assert.rejects(c.connect(), (e) => e instanceof UnauthorizedError && e.closeCode === 4502);
    assert.equal(c.state, 'closed');
    assert.equal(events.filter((e) => e.t === 'state' && e.state === 'disconnected').length, 0, 'no reconnect');
    assert.equal(backend.requests.filter((r) => r.path === '/connect').length, 1);
  },
  { skip: GATEWAY },
);

test(
  'hooks, Node: rpc where Herald has no rpc proxy is DisabledError, and the connection stays',
  async (t) => {
    const cleanup = cleanups(t);
    const herald = await startHerald(cleanup);
    const events = new Events();
    const c = client(cleanup, events, [herald.ws]);
    await c.connect();
    await assert.rejects(c.rpc('whoami'), (e) => e instanceof DisabledError && e.code === 'disabled');
    assert.equal(c.state, 'connected');
  },
  { skip: GATEWAY },
);

test('hooks, Node: hello.data goes with every hello, the resume too, from a function called before each connection; an rpc ends at its own timeout', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  const server = new WebSocketServer({ host: '127.0.0.1', port: 0 });
  await once(server, 'listening');
  cleanup.push(() => new Promise((r) => server.close(r)));
  server.on('connection', (socket) => {
    cleanup.push(() => socket.terminate());
    socket.on('message', (data) => {
      const m = JSON.parse(String(data));
      if (m.op !== 'hello') return;
      events.push({ t: 'hello', ...m });
      socket.send(JSON.stringify({ op: 'welcome', session: 's1', ping_ms: 25_000, resumed: m.resume === 's1' }));
      // The first connection is sent away (4000: come back and resume).
      if (!m.resume) socket.close(4000, 'slow');
    });
  });
  let calls = 0;
  const c = client(cleanup, events, [`ws://127.0.0.1:${server.address().port}/ws`], {
    helloData: async () => ({ csrf: `c${++calls}` }),
  });
  await c.connect();
  await events.wait('the resume', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
  const hellos = events.filter((e) => e.t === 'hello');
  assert.deepEqual(
    hellos.map((h) => [h.resume, h.data]),
    [
      [undefined, { csrf: 'c1' }],
      ['s1', { csrf: 'c2' }],
    ],
  );  // This server never answers an `rpc`: the call's own timeout ends it.
  const started = Date.now();
  await assert.rejects(c.rpc('slow', null, { timeoutMs: 200 }), (e) => e instanceof HeraldError && e.code === 'timeout');
  assert.ok(Date.now() - started < 5_000, 'the call\'s timeout, not the client\'s 10 s');
});

test(
  'hooks, Chromium: a page with a session cookie and no token is welcomed as the backend\'s user',
  async (t) => {
    const cleanup = cleanups(t);
    const backend = await startBackend(cleanup, ROUTES);
    const herald = await startHerald(cleanup, hooked(backend));
    const events = new Events();
    // The cookie is the host's (127.0.0.1): a browser sends it to the pod's port too.
    const page = await sdkPage(cleanup, events, { cookie: 'sid=alice-session' });
    await page.evaluate(([url]) => window.follow([url], 'news', { helloData: { page: 'home' } }), [herald.ws]);
    await events.wait('connected', (e) => e.t === 'connect');
    assert.deepEqual(events.filter((e) => e.t === 'connect'), [{ t: 'connect', ok: true }]);
    const asked = await backend.requests.wait('the connect proxy asked', (r) => r.path === '/connect');
    assert.match(asked.body.headers.cookie, /(^|; )sid=alice-session(;|$)/);
    assert.deepEqual(asked.body.data, { page: 'home' });
    assert.match(asked.body.headers.origin ?? '', /^http:\/\/127\.0\.0\.1:\d+$/, 'the Origin went with the cookie');
    const me = await bounded('whoami from the page', STEP, page.evaluate(() => window.client.rpc('whoami')));
    assert.deepEqual(me, { user: 'alice', data: null });
    await events.wait('subscribed', (e) => e.t === 'subscribed');
  },
  { skip: GATEWAY },
);

test('hooks: the example backend of docs/hooks.md, as written there, logs a client in by its cookie and logs the signed webhooks', async (t) => {
  const cleanup = cleanups(t);
  // The doc's backend, byte for byte: the fenced block that starts the server.
  const doc = readFileSync(join(REPO, 'docs/hooks.md'), 'utf8');
  const code = [...doc.matchAll(/```python\n([\s\S]*?)```/g)].map(([, c]) => c).find((c) => c.includes('serve_forever'));
  assert.ok(code, 'a python block with the example backend in docs/hooks.md');
  const file = join(tempDir(cleanup, 'backend'), 'backend.py');
  writeFileSync(file, code);
  const port = await freePort();
  const logged = new Events();
  const backend = spawnOwned('python3', ['-u', file], { env: { ...process.env, PORT: String(port) }, stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise((r) => backend.on('exit', r));
  cleanup.push(async () => {
    backend.kill('SIGKILL');
    await exited;
  });
  let lines = '';
  backend.stderr.on('data', (d) => {
    lines += d;
    for (const line of String(d).split('\n')) if (line) logged.push(line);
  });
  const url = `http://127.0.0.1:${port}`;
  await poll('the example backend answers', START_WAIT, async () => {
    const res = await fetch(`${url}/herald/connect`, { method: 'POST', body: '{}', signal: AbortSignal.timeout(STEP) });
    return res.status === 401;
  });
  const herald = await startHerald(
    cleanup,
    config({
      auth: { hmac_secret: SECRET },
      'proxy.connect': { url: `${url}/herald/connect`, timeout: '5s', headers: ['Cookie'] },
      webhooks: { url: `${url}/herald/events`, secret: 'change-me', batch_interval: '20ms' },
      'namespaces.rooms': { subscribe: 'granted', publish: 'nobody' },
    }),
  );
  const events = new Events();
  const c = client(cleanup, events, [herald.ws], { WebSocket: withCookie('session=8f2c0e') });
  const sub = c.subscribe('rooms:42');
  sub.on('subscribed', (s) => events.push({ t: 'subscribed', ...s }));
  sub.on('error', (e) => events.push({ t: 'suberror', code: e.code }));
  await c.connect();
  // Granted `rooms:*` by the backend's reply, as a token's `subscribe` would.
  await events.wait('rooms:42 subscribed', (e) => e.t === 'subscribed' || e.t === 'suberror');
  assert.deepEqual(events.filter((e) => e.t === 'suberror'), []);
  // The first subscriber anywhere: `topic.occupied`, signed (the backend checked it before logging).
  const occupied = await logged.wait('the backend logged topic.occupied', (l) => l.includes('"type": "topic.occupied"') && l.includes('"topic": "rooms:42"'));
  assert.match(occupied, /"id": "[^"]+-1"/);
  assert.doesNotMatch(lines, /bad signature|Traceback/);
  // Without the cookie: the backend's 401, a terminal close.
  const stranger = client(cleanup, new Events(), [herald.ws]);
  await assert.rejects(stranger.connect(), (e) => e instanceof UnauthorizedError && e.closeCode === 4502);
});
