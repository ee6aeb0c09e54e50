// The SDK in headless Chromium against the real `herald`: what the page's
// application sees across a pod killed with kill -9, a rolling restart, a
// reset, token expiry and a terminal close.

import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

import {
  Events,
  REPO,
  STEP,
  bounded,
  browser,
  cleanups,
  config,
  hs256,
  poll,
  pod,
  publish,
  sdkPage,
  serveStatic,
  startHerald,
  startRedis,
  test,
} from './harness.mjs';

/** Checks that `seen` is exactly `first..last`, once each and in order; the figures. */
function exactlyOnce(seen, first, last) {
  const expected = last - first + 1;
  const distinct = new Set(seen);
  const lost = [];
  for (let seq = first; seq <= last; seq++) if (!distinct.has(seq)) lost.push(seq);
  const duplicated = seen.length - distinct.size;
  const outOfOrder = seen.filter((seq, i) => i > 0 && seq <= seen[i - 1]).length;
  return { checked: expected, seen: seen.length, lost: lost.length, duplicated, outOfOrder, firstLost: lost.slice(0, 5) };
}

test('a page subscribes and receives what a backend publishes', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup);
  const events = new Events();
  const page = await sdkPage(cleanup, events);
  await page.evaluate(([url]) => window.follow([url], 'news'), [herald.ws]);
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  for (let i = 1; i <= 3; i++) await publish(herald, 'news', { headline: `h${i}` });
  await events.until('three messages', () => events.filter((e) => e.t === 'msg').length >= 3);
  const msgs = events.filter((e) => e.t === 'msg');
  assert.deepEqual(msgs.map((m) => [m.seq, m.data.headline]), [[1, 'h1'], [2, 'h2'], [3, 'h3']]);
  assert.ok(msgs[0].epoch, 'the epoch is known');
});

/** Publishes `count` messages to `topic` one after another; calls `at(n)` after the n-th. The last `{seq, epoch}`. */
async function publishMany(pod, topic, count, at = () => {}) {
  let last;
  for (let n = 1; n <= count; n++) {
    last = await publish(pod, topic, { n });
    await at(n);
  }
  return last;
}

test('kill -9 of the pod a page is on while 500 messages are published: every one reaches the app once, in order', async (t) => {
  const cleanup = cleanups(t);
  const redis = await startRedis(cleanup);
  const [a, b] = [await pod(cleanup, redis), await pod(cleanup, redis)];
  const events = new Events();
  const page = await sdkPage(cleanup, events);
  // The page starts on `a` (the first URL) and moves to `b` when `a` is gone.
  await page.evaluate(([urls]) => window.follow(urls, 'ticker', { backoff: { initialMs: 100, maxMs: 1000 } }), [[a.ws, b.ws]]);
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  const N = 500;
  const KILL_AT = 150;
  const last = await publishMany(b, 'ticker', N, async (n) => {
    if (n === KILL_AT) {
      // The page has seen messages through `a` by now: it is mid-stream.
      await events.wait('a message through pod a', (e) => e.t === 'msg');
      await a.kill9();
    }
  });
  assert.equal(last.seq, N);
  await events.until(`seq ${N} at the page`, () => events.list.some((e) => e.t === 'msg' && e.seq === N), 30_000);
  const seen = await bounded('the page to say what it saw', STEP, page.evaluate(() => window.seen));
  const dropped = await bounded('the page to say what it dropped', STEP, page.evaluate(() => window.sub.duplicates));
  const figures = exactlyOnce(seen, 1, N);
  const resumes = events.filter((e) => e.t === 'state' && e.state === 'connected' && e.resumed);
  t.diagnostic(`kill -9: ${JSON.stringify({ ...figures, redeliveredAndDropped: dropped, resumes: resumes.length })}`);
  console.log(`# kill -9 figures: checked ${figures.checked}, lost ${figures.lost}, duplicated ${figures.duplicated}, out of order ${figures.outOfOrder} (redelivered by the server and dropped by the SDK: ${dropped})`);
  assert.deepEqual([figures.lost, figures.duplicated, figures.outOfOrder], [0, 0, 0], JSON.stringify(figures));
  assert.ok(resumes.length >= 1, `the session was resumed on the other pod: ${JSON.stringify(events.filter((e) => e.t === 'state'))}`);
  assert.equal(events.filter((e) => e.t === 'reset').length, 0, 'no reset: history bridged the gap');
});

test('a rolling restart: each pod drains with `reconnect` advice, the page follows it and misses nothing', async (t) => {
  const cleanup = cleanups(t);
  const redis = await startRedis(cleanup);
  const drain = { shutdown: { drain_timeout: '2s' } };
  let [a, b] = [await pod(cleanup, redis, drain), await pod(cleanup, redis, drain)];
  const events = new Events();
  const page = await sdkPage(cleanup, events);
  // A backoff of a minute: only the advice can bring the page back within the test.
  await page.evaluate(([urls]) => window.follow(urls, 'rolling', { backoff: { initialMs: 60_000, maxMs: 60_000 } }), [[a.ws, b.ws]]);
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  const comebacks = (n) =>
    events.until(`comeback ${n}`, () => events.filter((e) => e.t === 'state' && e.state === 'connected' && e.resumed).length >= n);
  const N = 300;
  let target = b;
  for (let n = 1; n <= N; n++) {
    await publish(target, 'rolling', { n });
    if (n === 50) a.sigterm(); // `a` drains; publishing goes on through `b`
    if (n === 120) {
      await a.exited;
      await comebacks(1);
      a = await pod(cleanup, redis, drain, { port: a.port }); // `a` is back, at the same address
    }
    if (n === 150) {
      target = a;
      b.sigterm();
    }
    if (n === 250) {
      await b.exited;
      await comebacks(2);
    }
  }
  await events.until(`seq ${N} at the page`, () => events.list.some((e) => e.t === 'msg' && e.seq === N));
  const figures = exactlyOnce(await page.evaluate(() => window.seen), 1, N);
  t.diagnostic(`rolling restart: ${JSON.stringify(figures)}`);
  assert.deepEqual([figures.lost, figures.duplicated, figures.outOfOrder], [0, 0, 0], JSON.stringify(figures));
  const drained = events.filter((e) => e.t === 'state' && e.state === 'disconnected');
  assert.equal(drained.length, 2, JSON.stringify(drained));
  for (const d of drained) {
    assert.equal(d.closeCode, 1012, 'closed as draining');
    assert.ok(d.delayMs < 2000, `waited as advised (within the drain window), not the backoff: ${d.delayMs} ms`);
  }
  assert.equal(events.filter((e) => e.t === 'reset').length, 0);
});

test('a `since` from an old epoch: `subscribed` not recovered, `reset`, then live messages', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup);
  for (let n = 1; n <= 5; n++) await publish(herald, 'prices', { n });
  const events = new Events();
  const page = await sdkPage(cleanup, events);
  await page.evaluate(([url]) => window.follow([url], 'prices', { subscribe: { since: 2, epoch: 'an-epoch-long-gone' } }), [herald.ws]);
  const reset = await events.wait('reset', (e) => e.t === 'reset');
  const subscribed = events.list.find((e) => e.t === 'subscribed');
  assert.equal(subscribed.recovered, false);
  assert.equal(reset.seq, 5, 'live after the current seq');
  assert.notEqual(reset.epoch, 'an-epoch-long-gone');
  await publish(herald, 'prices', { n: 6 });
  const msg = await events.wait('seq 6', (e) => e.t === 'msg');
  assert.deepEqual([msg.seq, msg.epoch], [6, reset.epoch]);
  assert.deepEqual(await page.evaluate(() => window.seen), [6], 'nothing from the old epoch');
});

test('Redis restarted empty under a subscribed page: `reset` with a new epoch, and no seq twice within an epoch', async (t) => {
  const cleanup = cleanups(t);
  const redis = await startRedis(cleanup);
  const herald = await pod(cleanup, redis);
  const events = new Events();
  const page = await sdkPage(cleanup, events);
  await page.evaluate(([url]) => window.follow([url], 'quotes'), [herald.ws]);
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  for (let n = 1; n <= 3; n++) await publish(herald, 'quotes', { n });
  const third = await events.wait('seq 3', (e) => e.t === 'msg' && e.seq === 3);
  await redis.restartEmpty();
  // Publishes fail while the pod reconnects to Redis; the first to go through starts a new epoch.
  const next = await poll('a publish after the restart', STEP, () => publish(herald, 'quotes', { n: 'after' }), 100);
  const reset = await events.wait('reset', (e) => e.t === 'reset');
  assert.notEqual(reset.epoch, third.epoch, 'a new epoch');
  assert.equal(next.epoch, reset.epoch);
  // The pod may find the new epoch when it reconnects (reset at seq 0, and
  // the publish arrives as a message) or through that publish (reset at its seq).
  assert.ok(reset.seq <= next.seq, JSON.stringify({ next, reset }));
  const later = await publish(herald, 'quotes', { n: 'later' });
  const after = await events.wait('the message after the reset', (e) => e.t === 'msg' && e.data.n === 'later');
  assert.deepEqual([after.seq, after.epoch], [later.seq, reset.epoch]);
  const msgs = events.filter((e) => e.t === 'msg');
  assert.ok(msgs.filter((m) => m.epoch === reset.epoch).every((m) => m.seq > reset.seq), 'live after the reset seq');
  const keys = msgs.map((m) => `${m.epoch}/${m.seq}`);
  assert.equal(new Set(keys).size, keys.length, `no seq twice in an epoch: ${keys}`);
});

// ---------------------------------------------------------------- tokens

const SECRET = 'herald-js-tests-hmac-secret-0123456789';
const keyed = () => config({ auth: { hmac_secret: SECRET, leeway: '0s' }, 'namespaces.default': { subscribe: 'authenticated' } });
/** A token for `sub` that expires `seconds` from now (JWT times are whole seconds). */
const token = (sub, seconds, secret = SECRET) => hs256(secret, { sub, exp: Math.floor(Date.now() / 1000) + seconds });

test('short-lived tokens are refreshed before they expire: the connection stays up', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup, keyed());
  const events = new Events();
  let minted = 0;
  // Three seconds each: without a refresh the pod closes with 4004 at expiry.
  const tokens = () => {
    minted++;
    events.push({ t: 'minted', n: minted });
    return token('alice', 3);
  };
  const page = await sdkPage(cleanup, events, { tokens });
  await page.evaluate(([url]) => window.follow([url], 'feed', { token: true }), [herald.ws]);
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  // Three refreshes: by the fourth token the first two have expired (a
  // pod that was not sent a fresh one would have closed with 4004).
  const firstExpiry = Math.floor(Date.now() / 1000) + 3;
  await events.wait('a fourth token', (e) => e.t === 'minted' && e.n === 4, 10_000);
  assert.ok(Date.now() > firstExpiry * 1000, 'past the first expiry');
  const sent = await publish(herald, 'feed', { after: 'refreshes' });
  await events.wait('the message', (e) => e.t === 'msg' && e.seq === sent.seq);
  assert.deepEqual(events.filter((e) => e.t === 'state' && e.state !== 'connected' && e.state !== 'connecting'), [], 'never disconnected');
  assert.deepEqual(events.filter((e) => e.t === 'error'), []);
});

test('a token that expires unrefreshed: close 4004, a new token from getToken, the session resumed, nothing lost', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup, keyed());
  const events = new Events();
  let minted = 0;
  // The first token lives 2 s; the refresh gets another user's token (refused:
  // the connection keeps its expiry); after the 4004 close a good one.
  const tokens = () => (++minted === 1 ? token('alice', 2) : minted === 2 ? token('mallory', 60) : token('alice', 60));
  const page = await sdkPage(cleanup, events, { tokens });
  await page.evaluate(([url]) => window.follow([url], 'feed', { token: true }), [herald.ws]);
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  for (let n = 1; n <= 3; n++) await publish(herald, 'feed', { n });
  const closed = await events.wait('the 4004 close', (e) => e.t === 'state' && e.state === 'disconnected', 10_000);
  assert.equal(closed.closeCode, 4004);
  for (let n = 4; n <= 6; n++) await publish(herald, 'feed', { n });
  await events.wait('resumed', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
  await events.until('seq 6', () => events.list.some((e) => e.t === 'msg' && e.seq === 6));
  assert.deepEqual(await page.evaluate(() => window.seen), [1, 2, 3, 4, 5, 6]);
  const refused = events.filter((e) => e.t === 'error');
  assert.deepEqual(refused.map((e) => [e.name, e.code]), [['UnauthorizedError', 'unauthorized']], 'the refused refresh is reported');
  assert.equal(minted, 3);
});

test('a bad token is a terminal close: UnauthorizedError, and no reconnect', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup, keyed());
  const events = new Events();
  let minted = 0;
  const tokens = () => {
    minted++;
    return token('alice', 60, 'a-secret-that-is-not-the-pods-0123456789');
  };
  const page = await sdkPage(cleanup, events, { tokens });
  await page.evaluate(([url]) => window.follow([url], 'feed', { token: true, backoff: { initialMs: 50, maxMs: 50 } }), [herald.ws]);
  const connect = await events.wait('connect() settles', (e) => e.t === 'connect');
  assert.deepEqual([connect.ok, connect.name, connect.code, connect.closeCode], [false, 'UnauthorizedError', 'unauthorized', 4502]);
  const closed = events.list.find((e) => e.t === 'state' && e.state === 'closed');
  assert.deepEqual(closed.error, { name: 'UnauthorizedError', code: 'unauthorized', closeCode: 4502 });
  // A reconnect would come within the 50 ms backoff: give it twenty times that.
  const attempts = () => events.filter((e) => e.t === 'state' && e.state === 'connecting').length;
  await assert.rejects(events.until('another attempt', () => attempts() > 1, 1000));
  assert.equal(minted, 1);
  assert.equal(await page.evaluate(() => window.client.state), 'closed');
});

test("a quiet page's liveness probes (a browser cannot see pings) keep its connection, and are no bad commands", async (t) => {
  const cleanup = cleanups(t);
  // Pings every 300 ms: the page sends `ping` after 600 ms of silence. Three
  // bad commands in a row would close the connection (4500).
  const herald = await startHerald(cleanup, config({ websocket: { ping_interval: '300ms', max_bad_commands: 3 } }));
  const events = new Events();
  const page = await sdkPage(cleanup, events);
  await page.evaluate(([url]) => window.follow([url], 'quiet'), [herald.ws]);
  await events.wait('subscribed', (e) => e.t === 'subscribed');
  await publish(herald, 'quiet', { only: 'one' });
  await events.wait('the message', (e) => e.t === 'msg');
  const metric = async (name) => {
    const text = await (await fetch(`${herald.http}/metrics`)).text();
    return Number(new RegExp(`^${name} (\\d+)`, 'm').exec(text)?.[1] ?? 0);
  };
  // From here on nothing is published: every frame the pod writes is the `ok` to a probe.
  const before = await metric('herald_messages_delivered_total');
  await poll('six probes answered', 15_000, async () => (await metric('herald_messages_delivered_total')) - before >= 6, 100);
  assert.equal(await metric('herald_bad_commands_total'), 0, 'a probe is no bad command');
  assert.deepEqual(events.filter((e) => e.t === 'state' && e.state !== 'connected' && e.state !== 'connecting'), [], 'never disconnected');
  assert.deepEqual(events.filter((e) => e.t === 'error' || e.t === 'suberror'), []);
});

// ---------------------------------------------------------------- the demo

/**
 * Where the demo's screenshot goes: under the cargo target directory, so that
 * a test run leaves the work tree clean; docs/demo.png only when asked for
 * with HERALD_UPDATE_DEMO=1.
 */
function demoScreenshot() {
  if (process.env.HERALD_UPDATE_DEMO === '1') return join(REPO, 'docs/demo.png');
  const dir = join(process.env.CARGO_TARGET_DIR ?? join(REPO, 'target'), 'herald-js');
  mkdirSync(dir, { recursive: true });
  return join(dir, 'demo.png');
}

test('the ticker demo shows seqs, a resume and a reset as they happen (docs/demo.png is its screenshot)', async (t) => {
  const cleanup = cleanups(t);
  const redis = await startRedis(cleanup);
  const herald = await pod(cleanup, redis);
  const context = await browser(cleanup);
  const origin = await serveStatic(cleanup, REPO);
  const page = context.pages()[0] ?? (await context.newPage());
  await page.setViewportSize({ width: 1100, height: 470 });
  await page.goto(`${origin}/examples/ticker/index.html?ws=${encodeURIComponent(herald.ws)}`, { timeout: STEP });
  const logged = (text) => page.waitForFunction((text) => document.getElementById('log').textContent.includes(text), text, { timeout: STEP });
  const rows = (n) => page.waitForFunction((n) => document.getElementById('messages').rows.length >= n, n, { timeout: STEP });
  await logged('subscribed');
  let price = 100;
  const tick = () => publish(herald, 'ticker', { price: (price += 0.37).toFixed(2) });
  for (let n = 0; n < 4; n++) await tick();
  await rows(4);
  // Dropped: what is published meanwhile comes with the resume.
  await page.click('#drop');
  await logged('dropped by the button');
  for (let n = 0; n < 3; n++) await tick();
  await logged('resumed session');
  await rows(7);
  // Redis loses everything: the page is told, and goes on in the new epoch.
  await redis.restartEmpty();
  await poll('a publish after the restart', STEP, tick, 100);
  await logged('reset: new epoch');
  for (let n = 0; n < 3; n++) await tick();
  const seqs = await page.evaluate(() => [...document.querySelectorAll('#messages tr td:first-child')].map((td) => Number(td.textContent)));
  assert.deepEqual(seqs.slice(-7), [7, 6, 5, 4, 3, 2, 1], 'newest first, each once');
  await page.waitForFunction(() => document.getElementById('messages').rows.length >= 9, null, { timeout: STEP });
  const path = demoScreenshot();
  await page.screenshot({ path });
  t.diagnostic(`screenshot: ${path}`);
});
