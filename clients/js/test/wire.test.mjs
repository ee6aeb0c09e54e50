// The SDK's protobuf mode, binary data and deltas in headless Chromium
// against the real `herald`: the page offers `herald.v1.protobuf` and
// permessage-deflate on one WebSocket and gets both, receives JSON and
// binary publications whole (in messages and in history), and rebuilds a
// 2-4 KiB scoreboard from deltas over many updates, in JSON and in protobuf
// side by side, every state exactly the one published, most of them sent as
// deltas (the gateway's metrics say so).

import assert from 'node:assert/strict';

import { Events, STEP, bounded, cleanups, config, publish, sdkPage, startHerald, test, waitingFor } from './harness.mjs';

/** A counter's value from herald's /metrics, summed over the series whose labels contain `labels` (0 when absent). */
async function metric(herald, name, labels = '') {
  const res = await fetch(`${herald.http}/metrics`, { signal: AbortSignal.timeout(STEP) });
  let sum = 0;
  for (const line of (await res.text()).split('\n')) {
    const [series, value] = line.split(' ');
    if (series === name || (series?.startsWith(`${name}{`) && series.includes(labels))) sum += Number(value);
  }
  return sum;
}

/** `POST /v1/publish?topic=` with `application/octet-stream`: the bytes are the data. */
async function publishBytes(pod, topic, bytes) {
  const done = waitingFor(`a binary publish to ${topic}`, STEP);
  try {
    const res = await fetch(`${pod.http}/v1/publish?topic=${encodeURIComponent(topic)}`, {
      method: 'POST',
      headers: { 'content-type': 'application/octet-stream' },
      body: bytes,
      signal: AbortSignal.timeout(STEP),
    });
    const body = await res.json();
    if (res.status !== 200) throw new Error(`publish: ${res.status} ${JSON.stringify(body)}`);
    return body;
  } finally {
    done();
  }
}

/** A scoreboard of 50 players (about 2.5 KiB of JSON), update `n`: the round, the clock and two players change. */
function scoreboard(n) {
  return {
    round: n,
    clock: `${String(59 - (n % 60)).padStart(2, '0')}:${String((n * 7) % 60).padStart(2, '0')}`,
    players: Array.from({ length: 50 }, (_, i) => ({
      name: `player ${i}`,
      team: i % 2 ? 'red' : 'blue',
      score: i * 37 + (i === n % 50 ? n * 3 : 0) + (i === (n * 7) % 50 ? n : 0),
      online: i !== n % 50,
    })),
  };
}

test('Chromium in protobuf mode, with permessage-deflate on the same WebSocket: JSON and binary publications reach the page whole, in messages and in history (and in JSON beside it)', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup);
  const events = new Events();
  const page = await sdkPage(cleanup, events);
  await page.evaluate(([url]) => window.follow([url], 'news', { protocol: 'protobuf', tag: 'protobuf' }), [herald.ws]);
  await page.evaluate(([url]) => window.follow([url], 'news', { tag: 'json' }), [herald.ws]);
  await events.until('both subscribed', () => events.filter((e) => e.t === 'subscribed').length === 2);
  const sockets = await page.evaluate(() => window.sockets.map((s) => ({ protocol: s.protocol, extensions: s.extensions })));
  assert.equal(sockets[0].protocol, 'herald.v1.protobuf', 'the subprotocol selected');
  assert.match(sockets[0].extensions, /^permessage-deflate/, `compression negotiated beside it: ${sockets[0].extensions}`);
  assert.equal(sockets[1].protocol, '', 'JSON: no subprotocol offered, none selected');

  const compressed = await metric(herald, 'herald_deflate_compressions_total');
  const board = scoreboard(1);
  const bytes = Uint8Array.of(0x00, 0xff, 0xc3, 0x28, 0x80, 0x0a, 0x00); // 0x00 first, and not UTF-8
  await publish(herald, 'news', board);
  await publishBytes(herald, 'news', bytes);
  await publish(herald, 'news', 'a string');
  await events.until('three messages each', () => events.filter((e) => e.t === 'msg').length === 6);
  for (const tag of ['protobuf', 'json']) {
    const msgs = events.filter((e) => e.t === 'msg' && e.tag === tag);
    assert.deepEqual(msgs.map((m) => [m.seq, m.data]), [[1, board], [2, { bytes: [...bytes] }], [3, 'a string']], tag);
  }
  // The scoreboard (over the compression's minimum size) went compressed, as protobuf.
  assert.ok((await metric(herald, 'herald_deflate_compressions_total')) > compressed, 'a frame was compressed');

  // The history, read by both clients.
  const histories = await bounded(
    'the history pages',
    STEP,
    page.evaluate(() =>
      Promise.all(
        window.clients.map((c) => c.history('news').then((h) => h.publications.map((p) => ({ ...p, data: window.plain(p.data) })))),
      ),
    ),
  );
  for (const history of histories) {
    assert.deepEqual(history, [{ seq: 1, data: board }, { seq: 2, data: { bytes: [...bytes] }, binary: true }, { seq: 3, data: 'a string' }]);
  }
  assert.deepEqual(events.filter((e) => e.t === 'pageerror' || e.t === 'error'), []);
});

test('deltas on a `delta = true` namespace: a 2.5 KiB scoreboard rebuilt over 120 updates, in JSON and in protobuf side by side, across a dropped connection, every state the one published, most sent as deltas', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(
    cleanup,
    config({ 'namespaces.state': { history_size: 500, subscribe: 'anyone', publish: 'nobody', delta: true } }),
  );
  const events = new Events();
  const page = await sdkPage(cleanup, events);
  const warnings = [];
  page.on('console', (m) => m.type() === 'warning' && warnings.push(m.text()));
  const topic = 'state:match-1';
  await page.evaluate(([url, topic]) => window.follow([url], topic, { delta: true, tag: 'json' }), [herald.ws, topic]);
  await page.evaluate(([url, topic]) => window.follow([url], topic, { delta: true, protocol: 'protobuf', tag: 'protobuf' }), [herald.ws, topic]);
  await events.until('both subscribed', () => events.filter((e) => e.t === 'subscribed').length === 2);
  for (const s of events.filter((e) => e.t === 'subscribed')) assert.equal(s.delta, true, `${s.tag}: deltas granted`);
  assert.equal(await page.evaluate(() => window.sockets[1].protocol), 'herald.v1.protobuf');

  const N = 120;
  const deltasBefore = await metric(herald, 'herald_delta_deliveries_total', 'sent="delta"');
  const states = [];
  for (let n = 1; n <= N; n++) {
    states.push(scoreboard(n));
    await publish(herald, topic, states[n - 1]);
    if (n === 60) {
      // Both connections dropped mid-stream (the page closes its sockets): the
      // clients resume, the server replays what was not acked in the plain
      // form, then sends a full state, then deltas again; the bases dropped
      // meanwhile are never applied to.
      await events.until('seq 40 in both', () =>
        ['json', 'protobuf'].every((tag) => events.list.some((e) => e.t === 'msg' && e.tag === tag && e.seq >= 40)),
      );
      await page.evaluate(() => window.sockets.forEach((s) => s.close()));
    }
    // A few published while they are away; the rest once both are back, live.
    if (n === 65) {
      await events.until('both resumed', () => events.filter((e) => e.t === 'state' && e.state === 'connected' && e.resumed).length === 2);
    }
  }
  await events.until(`seq ${N} in both`, () => events.filter((e) => e.t === 'msg' && e.seq === N).length === 2, 30_000);
  for (const tag of ['json', 'protobuf']) {
    const msgs = events.filter((e) => e.t === 'msg' && e.tag === tag);
    assert.deepEqual(msgs.map((m) => m.seq), states.map((_, i) => i + 1), `${tag}: each seq once, in order`);
    msgs.forEach((m, i) => assert.deepEqual(m.data, states[i], `${tag}: the state of seq ${m.seq}`));
  }
  assert.ok(JSON.stringify(states[0]).length > 2048 && JSON.stringify(states[0]).length < 4096, 'a 2-4 KiB state');
  const deltas = (await metric(herald, 'herald_delta_deliveries_total', 'sent="delta"')) - deltasBefore;
  const full = await metric(herald, 'herald_delta_deliveries_total', 'sent="full"');
  t.diagnostic(`deliveries to the two delta subscribers: ${deltas} deltas, ${full} full`);
  // Live, each client gets a full state after its subscribe and after its
  // resume, deltas otherwise; what it missed while away comes replayed
  // (plain): 66..120 are live for both.
  assert.ok(full <= 8 && deltas >= 2 * (N - 66), `most deliveries were deltas: ${deltas} deltas, ${full} full`);
  const resumed = events.filter((e) => e.t === 'state' && e.state === 'connected' && e.resumed);
  assert.equal(resumed.length, 2, `both resumed: ${JSON.stringify(events.filter((e) => e.t === 'state'))}`);
  assert.ok((await metric(herald, 'herald_delta_encodes_total')) <= N, 'each delta made once, for both protocols');
  assert.deepEqual(warnings, [], 'no delta failed to apply');
  assert.deepEqual(events.filter((e) => e.t === 'pageerror' || e.t === 'error' || e.t === 'reset'), []);
});
