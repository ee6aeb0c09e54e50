// Who is here, what was said, and subscriptions a backend makes: the SDK's
// presence (pages from the core; a `Presence` that merges the
// `presence_diff`s, and every page merged, from `@herald/client/presence`), its
// history and its server-made subscriptions, in Node (the `ws` package) and
// in headless Chromium, against the real `herald` (one pod, and two pods
// sharing Redis) with users from HS256 tokens.

import assert from 'node:assert/strict';
import { once } from 'node:events';
import WebSocket, { WebSocketServer } from 'ws';

import { DisabledError, HeraldClient, HistoryLostError } from '../dist/index.js';
import { followPresence, presenceAll } from '../dist/presence.js';
import { Events, STEP, cleanups, config, hs256, poll, pod, publish, sdkPage, startHerald, startRedis, test } from './harness.mjs';

const SECRET = 'herald-js-tests-hmac-secret-0123456789';

/** Tokens over {@link SECRET}: connections with users. */
const users = (extra = {}) => ({ auth: { hmac_secret: SECRET }, ...extra });

/** {@link users}, and `room` keeps presence and sends joins and leaves every 50 ms, `quiet` keeps presence only. */
const rooms = (extra = {}) => ({
  ...users(),
  presence: { diff_interval: '50ms' },
  'namespaces.room': { subscribe: 'anyone', publish: 'nobody', presence: true, join_leave: true },
  'namespaces.quiet': { subscribe: 'anyone', publish: 'nobody', presence: true },
  ...extra,
});

/** A token for `sub` with `claims` besides, valid for ten minutes. */
const token = (sub, claims = {}) => hs256(SECRET, { sub, exp: Math.floor(Date.now() / 1000) + 600, ...claims });

/** A Node client as `user` (claims `claims`), its events to `events`; closed at cleanup. */
function client(cleanup, events, urls, user, claims = {}) {
  const c = new HeraldClient({ urls, WebSocket, getToken: () => token(user, claims), backoff: { initialMs: 50, maxMs: 200 } });
  c.on('error', (e) => events.push({ t: 'error', user, code: e.code, message: e.message }));
  c.on('state', (s) => events.push({ t: 'state', user, state: s.state, resumed: s.resumed }));
  c.on('subscribed', ({ subscription, reason }) => {
    events.push({ t: 'server-subscribed', user, topic: subscription.topic, reason, origin: subscription.origin });
    subscription.on('message', (m) => events.push({ t: 'msg', user, topic: m.topic, seq: m.seq, data: m.data }));
    subscription.on('unsubscribed', (u) => events.push({ t: 'sub-unsubscribed', user, ...u }));
  });
  c.on('unsubscribed', ({ topic, reason }) => events.push({ t: 'unsubscribed', user, topic, reason }));
  cleanup.push(() => c.close());
  return c;
}

/** Subscribes and waits for the `ok`. */
async function subscribed(c, events, topic, user) {
  const sub = c.subscribe(topic);
  sub.on('subscribed', () => events.push({ t: 'subscribed', user, topic }));
  sub.on('message', (m) => events.push({ t: 'msg', user, topic, seq: m.seq, data: m.data }));
  await events.wait(`${user} subscribed to ${topic}`, (e) => e.t === 'subscribed' && e.user === user && e.topic === topic);
  return sub;
}

/** POST a backend call on the pod's API. */
async function api(pod, path, body) {
  const res = await fetch(`${pod.http}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(STEP),
  });
  const text = await res.text();
  assert.equal(res.status, 200, `${path}: ${res.status} ${text}`);
}

test('Node, against a scripted server: a server-made subscription (messages, acks, `unsubscribed`) and a Presence whose diffs race its page', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  const server = new WebSocketServer({ host: '127.0.0.1', port: 0 });
  await once(server, 'listening');
  cleanup.push(() => new Promise((r) => server.close(r)));
  server.on('connection', (socket) => {
    cleanup.push(() => socket.terminate());
    const send = (frame) => socket.send(JSON.stringify(frame));
    socket.on('message', (data) => {
      const m = JSON.parse(String(data));
      events.push({ t: 'server-got', ...m });
      if (m.op === 'hello') {
        send({ op: 'welcome', session: 's1', ping_ms: 25_000, resumed: false });
        send({ op: 'ok', topic: 'alerts', seq: 10, epoch: 'e1', reason: 'server' });
        send({ op: 'msg', topic: 'alerts', seq: 11, data: { level: 'high' } });
      } else if (m.op === 'sub') {
        send({ op: 'ok', id: m.id, topic: m.topic, seq: 0, epoch: 'e2' });
        // Before the page: bob joined (position 4).
        send({ op: 'presence_diff', topic: m.topic, from: 3, to: 4, joins: [{ user: 'bob' }], leaves: [], users: 2, connections: 2 });
      } else if (m.op === 'presence') {
        // The pending diff up to the page's position first, then the page.
        send({ op: 'presence_diff', topic: m.topic, from: 4, to: 5, joins: [{ user: 'carol' }], leaves: ['alice'], users: 2, connections: 2 });
        send({ op: 'ok', id: m.id, topic: m.topic, position: 5, users: 2, connections: 2, members: [{ user: 'bob' }, { user: 'carol' }] });
        send({ op: 'presence_diff', topic: m.topic, from: 5, to: 6, joins: [], leaves: ['bob'], users: 1, connections: 1 });
      } else if (m.op === 'ack' && m.topic === 'alerts') {
        send({ op: 'unsubscribed', topic: 'alerts', reason: 'server' });
      }
    });
  });
  const url = `ws://127.0.0.1:${server.address().port}/ws`;
  const c = new HeraldClient({ urls: [url], WebSocket, ackIntervalMs: 10 });
  cleanup.push(() => c.close());
  c.on('subscribed', ({ subscription, reason }) => {
    events.push({ t: 'server-subscribed', topic: subscription.topic, reason, origin: subscription.origin });
    subscription.on('subscribed', (s) => events.push({ t: 'sub-subscribed', seq: s.seq, epoch: s.epoch }));
    subscription.on('message', (m) => events.push({ t: 'msg', topic: m.topic, seq: m.seq, epoch: m.epoch, data: m.data }));
    subscription.on('unsubscribed', (u) => events.push({ t: 'sub-unsubscribed', ...u }));
  });
  const seen = [];
  const presence = followPresence(c.subscribe('room:1'));
  presence.on('join', (m) => seen.push(`+${m.user}`));
  presence.on('leave', ({ user }) => seen.push(`-${user}`));
  presence.on('change', (s) => events.push({ t: 'presence', users: s.members.map((m) => m.user), position: s.position }));
  await c.connect();
  await events.wait('the server-made subscription', (e) => e.t === 'server-subscribed');
  assert.deepEqual(events.list.find((e) => e.t === 'server-subscribed'), { t: 'server-subscribed', topic: 'alerts', reason: 'server', origin: 'server' });
  assert.deepEqual(events.list.find((e) => e.t === 'sub-subscribed'), { t: 'sub-subscribed', seq: 10, epoch: 'e1' });
  await events.wait('its message', (e) => e.t === 'msg' && e.seq === 11 && e.epoch === 'e1');
  await events.wait('the ack of it', (e) => e.t === 'server-got' && e.op === 'ack' && e.topic === 'alerts' && e.seq === 11 && e.epoch === 'e1');
  await events.wait('unsubscribed', (e) => e.t === 'sub-unsubscribed' && e.topic === 'alerts' && e.reason === 'server');
  await events.wait('bob left', (e) => e.t === 'presence' && e.position === 6);
  // The frames may come in one read (the page's answer then settles after
  // the last diff): either way the joins and leaves told give the members,
  // none twice, and the diff the page held (carol, alice) is not applied again.
  const told = new Set();
  for (const e of seen) {
    const user = e.slice(1);
    assert.ok(e[0] === '+' ? !told.has(user) : told.has(user), `${e} in ${seen}`);
    if (e[0] === '+') told.add(user);
    else told.delete(user);
  }
  assert.deepEqual([...told], ['carol']);
  assert.deepEqual([...presence.members.keys()], ['carol']);
  assert.ok(!seen.includes('-alice'), 'alice was never told');
  // Unsubscribed by the server: an `unsub` is not sent for it.
  assert.deepEqual(events.filter((e) => e.t === 'server-got' && e.op === 'unsub'), []);
});

test('Node, against a scripted server: a followed Presence loads again after a resume and after a re-subscribe, tells the difference, and ends with its subscription', async (t) => {
  const cleanup = cleanups(t);
  const events = new Events();
  const server = new WebSocketServer({ host: '127.0.0.1', port: 0 });
  await once(server, 'listening');
  cleanup.push(() => new Promise((r) => server.close(r)));
  // Each load answers with the next page: the room as each connection finds it.
  const pages = [['alice', 'bob'], ['bob', 'carol'], ['carol', 'dave']];
  let connection = 0;
  server.on('connection', (socket) => {
    cleanup.push(() => socket.terminate());
    // The second connection resumes the session, the third finds it gone (a re-subscribe).
    const n = ++connection;
    const send = (frame) => socket.send(JSON.stringify(frame));
    socket.on('message', (data) => {
      const m = JSON.parse(String(data));
      events.push({ t: 'server-got', connection: n, ...m });
      if (m.op === 'hello') send({ op: 'welcome', session: n === 3 ? 's2' : 's1', ping_ms: 25_000, resumed: n === 2 });
      else if (m.op === 'sub') send({ op: 'ok', id: m.id, topic: m.topic, seq: 0, epoch: 'e1' });
      else if (m.op === 'presence') {
        const members = (pages.shift() ?? []).map((user) => ({ user }));
        send({ op: 'ok', id: m.id, topic: m.topic, position: n, users: members.length, connections: members.length, members });
      }
    });
  });
  const url = `ws://127.0.0.1:${server.address().port}/ws`;
  const c = new HeraldClient({ urls: [url], WebSocket, backoff: { initialMs: 10, maxMs: 20 } });
  cleanup.push(() => c.close());
  c.on('error', (e) => events.push({ t: 'error', code: e.code }));
  const sub = c.subscribe('room:1');
  await c.connect();
  await events.wait('subscribed', (e) => e.t === 'server-got' && e.op === 'sub');
  // Followed once subscribed: loaded at once.
  const presence = followPresence(sub);
  presence.on('join', (m) => events.push({ t: 'told', what: `+${m.user}` }));
  presence.on('leave', ({ user }) => events.push({ t: 'told', what: `-${user}` }));
  const told = () => events.filter((e) => e.t === 'told').map((e) => e.what);
  await presence.loaded();
  assert.deepEqual(told(), ['+alice', '+bob']);
  // The connection dropped: the diffs of the gap are not replayed, so the next one loads again.
  for (const [what, after] of [
    ['a resume', ['+carol', '-alice']],
    ['a re-subscribe', ['+dave', '-bob']],
  ]) {
    const before = told().length;
    for (const socket of server.clients) socket.terminate();
    await events.until(`the load after ${what}`, () => told().length === before + 2);
    assert.deepEqual(told().slice(before), after, what);
  }
  assert.deepEqual([...presence.members.keys()], ['carol', 'dave']);
  assert.deepEqual(
    events.filter((e) => e.t === 'server-got' && e.op === 'sub').map((e) => e.connection),
    [1, 3],
    'the resume restored the subscription; the new session subscribed again',
  );
  sub.unsubscribe();
  assert.ok(presence.closed, 'unsubscribed: the Presence is closed');
  assert.deepEqual(events.filter((e) => e.t === 'error'), []);
});

/**
 * Alice on pod `a` follows `room:1`; bob comes from pod `b` (the same pod on
 * the embedded broker) on two connections, and leaves one after the other.
 */
async function presenceStory(cleanup, a, b) {
  const events = new Events();
  const alice = client(cleanup, events, [a.ws], 'alice', { info: { name: 'Alice' } });
  await alice.connect();
  const sub = await subscribed(alice, events, 'room:1', 'alice');
  // Subscribed, then asked: the page shows alice, with her info.
  const page = await alice.presence('room:1');
  assert.deepEqual(page.members, [{ user: 'alice', info: { name: 'Alice' } }]);
  assert.deepEqual([page.users, page.connections, page.cursor], [1, 1, undefined]);

  const presence = followPresence(sub);
  assert.equal(followPresence(sub), presence, 'one Presence per subscription');
  const seen = [];
  presence.on('join', (m) => seen.push(`+${m.user}`));
  presence.on('leave', ({ user }) => seen.push(`-${user}`));
  presence.on('change', (s) => events.push({ t: 'presence', users: s.members.map((m) => m.user) }));
  await presence.loaded();
  assert.deepEqual(seen, ['+alice']);

  // Bob on the other pod, with two connections: one join.
  const bob1 = client(cleanup, events, [b.ws], 'bob');
  const bob2 = client(cleanup, events, [b.ws], 'bob');
  await Promise.all([bob1.connect(), bob2.connect()]);
  const bobSub1 = await subscribed(bob1, events, 'room:1', 'bob');
  await events.wait('bob joined', (e) => e.t === 'presence' && e.users.join() === 'alice,bob');
  const bobSub2 = bob2.subscribe('room:1');
  const connections = (n) => async () => (await alice.presence('room:1')).connections === n;
  await poll('two connections of bob', STEP, connections(3), 50);
  bobSub1.unsubscribe();
  await poll('one connection of bob', STEP, connections(2), 50);
  assert.deepEqual([...presence.members.keys()], ['alice', 'bob'], 'bob still has a connection');
  bobSub2.unsubscribe();
  await events.until('bob left', () => seen.includes('-bob'));
  assert.deepEqual([...presence.members.keys()], ['alice']);
  assert.deepEqual(seen, ['+alice', '+bob', '-bob'], 'one join and one leave for bob');

  // Two pages, then the merge of every page.
  const first = await alice.presence('room:1', { limit: 1 });
  assert.deepEqual([first.members.map((m) => m.user), first.cursor], [['alice'], undefined]);
  const all = await presenceAll(alice, 'room:1');
  assert.deepEqual(all.members.map((m) => m.user), ['alice']);

  await assert.rejects(alice.presence('news'), (e) => e instanceof DisabledError && e.code === 'disabled');
  await assert.rejects(alice.presence('room:1', { limit: 0 }), (e) => e.code === 'malformed');
  await assert.rejects(alice.presence('room:1', { cursor: '!not a cursor!' }), (e) => e.code === 'malformed');
  assert.deepEqual(events.filter((e) => e.t === 'error'), []);
}

test('Node: presence on one pod (embedded broker): a page shows the asker, a Presence follows joins and leaves once per user, `disabled` is typed', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup, config(rooms()));
  await presenceStory(cleanup, herald, herald);
});

test('Node: presence across two pods sharing Redis: the same story, bob on the other pod', async (t) => {
  const cleanup = cleanups(t);
  const redis = await startRedis(cleanup);
  const a = await pod(cleanup, redis, rooms());
  const b = await pod(cleanup, redis, rooms());
  await presenceStory(cleanup, a, b);
});

test('Node: history pages forward and in reverse, the position alone with limit 0, and `history_lost` typed', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup);
  for (let n = 1; n <= 5; n++) await publish(herald, 'news', { n });
  const events = new Events();
  const c = new HeraldClient({ urls: [herald.ws], WebSocket });
  cleanup.push(() => c.close());
  await c.connect();
  const all = await c.history('news');
  assert.deepEqual(all.publications.map((p) => [p.seq, p.data.n]), [[1, 1], [2, 2], [3, 3], [4, 4], [5, 5]]);
  assert.equal(all.seq, 5);
  const forward = await c.history('news', { since: 2, limit: 2 });
  assert.deepEqual(forward.publications.map((p) => p.seq), [3, 4]);
  assert.equal(forward.epoch, all.epoch);
  const newest = await c.history('news', { limit: 2, reverse: true });
  assert.deepEqual(newest.publications.map((p) => p.seq), [5, 4]);
  const below = await c.history('news', { since: 4, reverse: true });
  assert.deepEqual(below.publications.map((p) => p.seq), [3, 2, 1]);
  const position = await c.history('news', { limit: 0 });
  assert.deepEqual([position.seq, position.publications], [5, []]);
  await assert.rejects(c.history('news', { since: 9 }), (e) => e instanceof HistoryLostError && e.code === 'history_lost');
  await assert.rejects(c.history('news', { since: 1, epoch: 'another-epoch' }), (e) => e instanceof HistoryLostError);
  await assert.rejects(c.history('news', { limit: 100_000 }), (e) => e.code === 'malformed');
  assert.deepEqual(events.list, []);
});

test('Node: a backend subscribes a user on both pods: `subscribed` with the subscription, messages, a resume keeps it, `unsubscribed` ends it', async (t) => {
  const cleanup = cleanups(t);
  const redis = await startRedis(cleanup);
  const a = await pod(cleanup, redis, users());
  const b = await pod(cleanup, redis, users());
  const events = new Events();
  const onA = client(cleanup, events, [a.ws], 'alice');
  const onB = client(cleanup, events, [b.ws], 'alice');
  await Promise.all([onA.connect(), onB.connect()]);
  await api(a, '/v1/subscribe', { user: 'alice', topic: 'news' });
  await events.until('both connections subscribed', () => events.filter((e) => e.t === 'server-subscribed').length === 2);
  assert.deepEqual(
    events.filter((e) => e.t === 'server-subscribed').map((e) => [e.topic, e.reason, e.origin]),
    [['news', 'server', 'server'], ['news', 'server', 'server']],
  );
  const first = await publish(b, 'news', { n: 1 });
  await events.until('the message on both', () => events.filter((e) => e.t === 'msg' && e.seq === first.seq).length === 2);
  // A resume brings the subscription back.
  onA.close();
  await onA.connect();
  await events.wait('resumed', (e) => e.t === 'state' && e.state === 'connected' && e.resumed);
  const second = await publish(b, 'news', { n: 2 });
  await events.until('the next message on both', () => events.filter((e) => e.t === 'msg' && e.seq === second.seq).length === 2);
  await api(b, '/v1/unsubscribe', { user: 'alice', topic: 'news' });
  await events.until('both unsubscribed', () => events.filter((e) => e.t === 'unsubscribed').length === 2);
  assert.deepEqual(
    events.filter((e) => e.t === 'sub-unsubscribed').map((e) => [e.topic, e.reason]),
    [['news', 'server'], ['news', 'server']],
  );
  // Subscribed again by the backend: a new subscription object, as new.
  await api(a, '/v1/subscribe', { user: 'alice', topic: 'news' });
  await events.until('subscribed again', () => events.filter((e) => e.t === 'server-subscribed').length === 4);
});

test("Node: the token's `topics` are subscribed at hello: `subscribed` with reason `token`", async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup, config(users()));
  const events = new Events();
  const c = client(cleanup, events, [herald.ws], 'alice', { topics: ['news', 'chat:alice'] });
  await c.connect();
  await events.until('two topics', () => events.filter((e) => e.t === 'server-subscribed').length === 2);
  assert.deepEqual(
    events.filter((e) => e.t === 'server-subscribed').map((e) => [e.topic, e.reason]).sort(),
    [['chat:alice', 'token'], ['news', 'token']],
  );
  const sent = await publish(herald, 'news', { n: 1 });
  await events.wait('the message', (e) => e.t === 'msg' && e.seq === sent.seq);
});

/** A page whose client (`window.client`, as carol) reports server-made subscriptions and their messages. */
async function carolsPage(cleanup, events, herald) {
  const tokens = () => token('carol', { info: { name: 'Carol' } });
  const page = await sdkPage(cleanup, events, { tokens });
  await page.evaluate(([url]) => {
    const { HeraldClient } = window.herald;
    const client = new HeraldClient({ urls: [url], getToken: () => window.nodeToken() });
    window.client = client;
    client.on('subscribed', ({ subscription, reason }) => {
      window.report({ t: 'server-subscribed', topic: subscription.topic, reason });
      subscription.on('message', (m) => window.report({ t: 'msg', topic: m.topic, seq: m.seq }));
      subscription.on('unsubscribed', (u) => window.report({ t: 'sub-unsubscribed', ...u }));
    });
  }, [herald.ws]);
  return page;
}

test('Chromium: a page follows a room: its Presence shows the page itself, then joins and leaves', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup, config(rooms()));
  const events = new Events();
  const page = await carolsPage(cleanup, events, herald);
  await page.evaluate(async () => {
    const presence = window.heraldPresence.followPresence(window.client.subscribe('room:lobby'));
    presence.on('join', (m) => window.report({ t: 'join', user: m.user, info: m.info }));
    presence.on('leave', ({ user }) => window.report({ t: 'leave', user }));
    await window.client.connect();
    await presence.loaded();
  });
  await events.wait('carol sees herself', (e) => e.t === 'join' && e.user === 'carol');
  assert.deepEqual(events.list.find((e) => e.t === 'join').info, { name: 'Carol' });
  // Dave joins from Node, then leaves: the page hears both.
  const dave = client(cleanup, events, [herald.ws], 'dave');
  await dave.connect();
  const daveSub = await subscribed(dave, events, 'room:lobby', 'dave');
  await events.wait('dave joined', (e) => e.t === 'join' && e.user === 'dave');
  daveSub.unsubscribe();
  await events.wait('dave left', (e) => e.t === 'leave' && e.user === 'dave');
  assert.deepEqual(events.filter((e) => e.t === 'join' || e.t === 'leave').map((e) => `${e.t} ${e.user}`), ['join carol', 'join dave', 'leave dave']);
  assert.deepEqual(events.filter((e) => e.t === 'pageerror'), []);
});

test('Chromium: a page reads history (HistoryLostError typed) and hears of a subscription its backend made, until the backend ends it', async (t) => {
  const cleanup = cleanups(t);
  const herald = await startHerald(cleanup, config(users()));
  for (let n = 1; n <= 3; n++) await publish(herald, 'news', { n });
  const events = new Events();
  const page = await carolsPage(cleanup, events, herald);
  await page.evaluate(async () => {
    const client = window.client;
    await client.connect();
    const history = await client.history('news', { since: 1 });
    window.report({ t: 'history', seqs: history.publications.map((p) => p.seq), data: history.publications.map((p) => p.data.n), seq: history.seq });
    try {
      await client.history('news', { since: 99 });
    } catch (e) {
      window.report({ t: 'history-error', name: e.name, code: e.code });
    }
  });
  assert.deepEqual(events.list.find((e) => e.t === 'history'), { t: 'history', seqs: [2, 3], data: [2, 3], seq: 3 });
  assert.deepEqual(events.list.find((e) => e.t === 'history-error'), { t: 'history-error', name: 'HistoryLostError', code: 'history_lost' });

  await api(herald, '/v1/subscribe', { user: 'carol', topic: 'news' });
  await events.wait('the page subscribed by its backend', (e) => e.t === 'server-subscribed' && e.topic === 'news' && e.reason === 'server');
  const sent = await publish(herald, 'news', { n: 4 });
  await events.wait('its message', (e) => e.t === 'msg' && e.topic === 'news' && e.seq === sent.seq);
  await api(herald, '/v1/unsubscribe', { user: 'carol', topic: 'news' });
  await events.wait('unsubscribed', (e) => e.t === 'sub-unsubscribed' && e.reason === 'server');
  assert.deepEqual(events.filter((e) => e.t === 'pageerror'), []);
});
