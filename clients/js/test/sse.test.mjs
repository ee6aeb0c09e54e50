// A plain `EventSource` (no SDK) in headless Chromium on `GET /sse`, through
// the test's own round-robin TCP proxy in front of two pods sharing a
// Redis: the pod the page streams from is killed with kill -9 mid-stream
// while a backend publishes; the browser reconnects by itself, through the
// proxy to the other pod, with its `Last-Event-ID`, and the page misses
// nothing and sees nothing twice.

import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer } from 'node:http';
import net from 'node:net';

import { Events, STEP, browser, cleanups, pod, publish, startRedis, test } from './harness.mjs';

/**
 * A TCP proxy on a loopback port: each connection goes to the next of
 * `ports` in turn, or past it to the next that accepts (a dead pod is
 * skipped). A connection ends with its other side.
 */
async function roundRobin(cleanup, ports) {
  let next = 0;
  const sockets = new Set();
  const server = net.createServer((client) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    client.on('error', () => {});
    const attempt = (tries) => {
      if (tries >= ports.length) {
        client.destroy();
        return;
      }
      const port = ports[next++ % ports.length];
      const upstream = net.connect(port, '127.0.0.1');
      sockets.add(upstream);
      let connected = false;
      upstream.once('connect', () => {
        connected = true;
        client.pipe(upstream);
        upstream.pipe(client);
      });
      upstream.on('error', () => {
        if (!connected) attempt(tries + 1);
      });
      upstream.on('close', () => {
        sockets.delete(upstream);
        if (connected) client.destroy();
      });
      client.on('close', () => upstream.destroy());
    };
    attempt(0);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  cleanup.push(() => {
    for (const s of sockets) s.destroy();
    return new Promise((r) => server.close(r));
  });
  return `http://127.0.0.1:${server.address().port}`;
}

/** A page of its own origin (not the pods', not the proxy's: the stream is cross-origin, as an app's is). */
async function blankPage(cleanup) {
  const server = createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/html', connection: 'close' });
    res.end('<!doctype html><meta charset="utf-8"><title>EventSource</title>');
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  cleanup.push(() => {
    server.closeAllConnections();
    return new Promise((r) => server.close(r));
  });
  return `http://127.0.0.1:${server.address().port}/`;
}

test('kill -9 of the pod an EventSource streams from: the page misses nothing and sees nothing twice', async (t) => {
  const cleanup = cleanups(t);
  const redis = await startRedis(cleanup);
  const [a, b] = [await pod(cleanup, redis), await pod(cleanup, redis)];
  const proxy = await roundRobin(cleanup, [a.port, b.port]);
  const events = new Events();
  const context = await browser(cleanup);
  const origin = await blankPage(cleanup);
  const page = context.pages()[0] ?? (await context.newPage());
  page.on('pageerror', (e) => events.push({ t: 'pageerror', message: String(e) }));
  await page.exposeFunction('report', (event) => events.push(event));
  await page.goto(origin, { timeout: STEP });
  // The whole client: what the docs show.
  await page.evaluate((url) => {
    const source = new EventSource(url);
    source.onopen = () => window.report({ t: 'open' });
    source.onerror = () => window.report({ t: 'error', state: source.readyState });
    source.onmessage = (e) => {
      const frame = JSON.parse(e.data);
      window.report({ t: frame.op, id: e.lastEventId, seq: frame.seq, topic: frame.topic });
    };
  }, `${proxy}/sse?topic=ticker`);
  await events.wait('subscribed', (e) => e.t === 'ok');
  const N = 200;
  const KILL_AT = 60;
  for (let n = 1; n <= N; n++) {
    await publish(b, 'ticker', { n });
    if (n === KILL_AT) {
      // Mid-stream: the page has had messages through `a`.
      await events.wait('a message through pod a', (e) => e.t === 'msg');
      await a.kill9();
        }
  }
  await events.until(`seq ${N} at the page`, () => events.list.some((e) => e.t === 'msg' && e.seq === N), 30_000);
  const seen = events.filter((e) => e.t === 'msg').map((e) => e.seq);
  const distinct = new Set(seen);
  const lost = [];
  for (let seq = 1; seq <= N; seq++) if (!distinct.has(seq)) lost.push(seq);
  const duplicated = seen.length - distinct.size;
  const outOfOrder = seen.filter((seq, i) => i > 0 && seq <= seen[i - 1]).length;
  const opens = events.filter((e) => e.t === 'open').length;
  console.log(`# EventSource across kill -9: ${N} published, lost ${lost.length}, duplicated ${duplicated}, out of order ${outOfOrder}, opens ${opens}`);
  assert.deepEqual([lost.length, duplicated, outOfOrder], [0, 0, 0], JSON.stringify({ lost: lost.slice(0, 5), seen: seen.slice(0, 10) }));
  assert.ok(opens >= 2, 'the browser reconnected by itself');
  assert.equal(events.filter((e) => e.t === 'reset').length, 0, 'no reset: history bridged the gap');
  const ids = events.filter((e) => e.t === 'msg').map((e) => e.id);
  assert.ok(ids.every((id) => /^[0-9a-f]+:\d+$/.test(id)), JSON.stringify(ids.slice(0, 3)));
});
