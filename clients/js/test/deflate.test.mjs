// permessage-deflate between Chromium and the real `herald`: the browser
// offers it on every WebSocket (`permessage-deflate; client_max_window_bits`),
// Herald accepts it, and the page reads compressed messages as any others.
// A plain `WebSocket` in the page: compression is below the SDK.

import assert from 'node:assert/strict';

import { JS_ROOT, STEP, browser, cleanups, publish, serveStatic, startHerald, test } from './harness.mjs';

/** A counter's value from herald's /metrics (0 when absent). */
async function metric(herald, name) {
  const res = await fetch(`${herald.http}/metrics`, { signal: AbortSignal.timeout(STEP) });
  const line = (await res.text()).split('\n').find((l) => l.startsWith(`${name} `));
  return line ? Number(line.split(' ')[1]) : 0;
}

test('Chromium negotiates permessage-deflate with herald and reads compressed messages', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup);
  const context = await browser(cleanup);
  // A page from a loopback origin (Chromium will not open a loopback
  // WebSocket from a data: URL).
  const origin = await serveStatic(cleanup, JS_ROOT);
  const page = context.pages()[0] ?? (await context.newPage());
  await page.goto(`${origin}/test/page.html`, { timeout: STEP });

  const extensions = await page.evaluate(
    ([url, step]) =>
      new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('no ok for the sub')), step);
        const ws = new WebSocket(url);
        window.msgs = [];
        ws.onerror = () => reject(new Error('the WebSocket failed'));
        ws.onmessage = (e) => {
          const m = JSON.parse(e.data);
          window.msgs.push(m);
          if (m.op === 'ok' && m.id === 1) {
            clearTimeout(timer);
            resolve(ws.extensions);
          }
        };
        ws.onopen = () => {
          ws.send(JSON.stringify({ op: 'hello' }));
          ws.send(JSON.stringify({ op: 'sub', id: 1, topic: 'news' }));
        };
        window.ws = ws;
      }),
    [herald.ws, STEP],
  );
  assert.match(extensions, /^permessage-deflate/, `negotiated: ${extensions}`);
  assert.match(extensions, /server_no_context_takeover/);
  assert.match(extensions, /client_no_context_takeover/);

  const before = await metric(herald, 'herald_deflate_compressions_total');
  const board = { players: Array.from({ length: 50 }, (_, i) => ({ name: `player ${i}`, score: i * 37 })) };
  await publish(herald, 'news', board);
  await page.waitForFunction(() => window.msgs.some((m) => m.op === 'msg'), null, { timeout: STEP });
  const msg = await page.evaluate(() => window.msgs.find((m) => m.op === 'msg'));
  assert.deepEqual(msg.data, board);
  assert.equal(msg.seq, 1);
  // Compressed on its way (over min_bytes): counted once, for the publication.
  assert.ok((await metric(herald, 'herald_deflate_compressions_total')) > before, 'the msg was compressed');

  // A compressed command: Chromium compresses what it sends too.
  const inflatedBefore = await metric(herald, 'herald_deflate_inflations_total');
  await page.evaluate(() => window.ws.send(JSON.stringify({ op: 'ping', id: 2, pad: 'x'.repeat(300) })));
  await page.waitForFunction(() => window.msgs.some((m) => m.id === 2), null, { timeout: STEP });
  const inflated = await metric(herald, 'herald_deflate_inflations_total');
  assert.ok(inflated > inflatedBefore, `the page's command came compressed (${inflatedBefore} -> ${inflated})`);
});
