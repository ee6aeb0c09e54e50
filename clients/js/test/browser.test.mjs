// The SDK in headless Chromium against the real `herald`: what the page's
// application sees across a pod killed with kill -9, a rolling restart, a
// reset, token expiry and a terminal close.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Events, cleanups, config, hs256, pod, publish, sdkPage, startHerald, startRedis, STEP } from './harness.mjs';

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
  const seen = await page.evaluate(() => window.seen);
  const dropped = await page.evaluate(() => window.sub.duplicates);
  const figures = exactlyOnce(seen, 1, N);
  const resumes = events.filter((e) => e.t === 'state' && e.state === 'connected' && e.resumed);
  t.diagnostic(`kill -9: ${JSON.stringify({ ...figures, redeliveredAndDropped: dropped, resumes: resumes.length })}`);
  console.log(`# kill -9 figures: checked ${figures.checked}, lost ${figures.lost}, duplicated ${figures.duplicated}, out of order ${figures.outOfOrder} (redelivered by the server and dropped by the SDK: ${dropped})`);
  assert.deepEqual([figures.lost, figures.duplicated, figures.outOfOrder], [0, 0, 0], JSON.stringify(figures));
  assert.ok(resumes.length >= 1, `the session was resumed on the other pod: ${JSON.stringify(events.filter((e) => e.t === 'state'))}`);
  assert.equal(events.filter((e) => e.t === 'reset').length, 0, 'no reset: history bridged the gap');
});
