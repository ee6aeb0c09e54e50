// The presence merge rule (src/presence.ts) without a server: a model room
// changes (joins and leaves, each a new position), and the client sees what
// the protocol lets a pod send, in every order it allows: coalesced diffs
// (each user once, their state at `to`), pages of the members after a cursor
// answered at the current position (the pending diff sent first, so that no
// diff spans a page's position). After thousands of seeded runs, the merged
// room is the model's, and the `join`/`leave` events, applied to what was
// shown when loading completed, give the same members.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Presence, PresenceRoom, compareUsers } from '../dist/presence.js';

/** A small deterministic PRNG (mulberry32), so that a failing seed can be replayed. */
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Ids whose UTF-16 order differs from the server's (UTF-8 bytes): the last two.
const USERS = ['alice', 'bob', 'carol', 'dave', 'erin', 'frank', 'grace', 'zoë', '\u{1F600}smile', '\uFF21wide'];

/** Bytewise UTF-8 order, as the server sorts. */
const bytewise = (a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b));

/** A model of one pod's view of a topic: members, a position, what is pending for subscribers. */
class Model {
  members = new Map();
  position = 0;
  /** Position of the last diff sent. */
  sent = 0;
  /** Users changed since the last diff. */
  pending = new Set();
  connections = 0;

  change(random) {
    const user = USERS[Math.floor(random() * USERS.length)];
    if (this.members.has(user)) this.members.delete(user);
    else this.members.set(user, { user, info: { n: this.position } });
    this.connections = this.members.size + Math.floor(random() * 3);
    this.position++;
    this.pending.add(user);
  }

  /** The pending diff, if anything changed; `countsOnly` as above a namespace's threshold. */
  flush() {
    if (this.pending.size === 0) return undefined;
    const joins = [];
    const leaves = [];
    for (const user of this.pending) {
      if (this.members.has(user)) joins.push(this.members.get(user));
      else leaves.push(user);
    }
    const diff = { op: 'presence_diff', topic: 't', from: this.sent, to: this.position, joins, leaves, users: this.members.size, connections: this.connections };
    this.sent = this.position;
    this.pending.clear();
    return diff;
  }

  /** The page after `cursor` (a user id), sending the pending diff first. */
  page(cursor, limit, send) {
    const diff = this.flush();
    if (diff) send(diff);
    const sorted = [...this.members.values()].sort((a, b) => bytewise(a.user, b.user));
    const after = cursor === undefined ? sorted : sorted.filter((m) => bytewise(m.user, cursor) > 0);
    const members = after.slice(0, limit);
    const page = { position: this.position, users: this.members.size, connections: this.connections, members };
    if (after.length > limit) page.cursor = members[members.length - 1].user;
    return page;
  }
}

test('compareUsers orders user ids bytewise over UTF-8, as the server does', () => {
  const sorted = [...USERS].sort(compareUsers);
  assert.deepEqual(sorted, [...USERS].sort(bytewise));
  assert.notDeepEqual([...USERS].sort(), sorted, 'the ids include a pair UTF-16 orders otherwise');
});

test('pages and diffs in any order the protocol allows merge to the room: no member missed or counted twice', () => {
  for (let seed = 1; seed <= 3000; seed++) {
    const random = rng(seed);
    const model = new Model();
    // A room before the client came.
    for (let i = Math.floor(random() * 12); i > 0; i--) model.change(random);
    model.flush();
    const room = new PresenceRoom();
    const limit = 1 + Math.floor(random() * 4);
    let cursor;
    let loading = true;
    let shown;
    const events = [];
    const deliver = (diff) => {
      const applied = room.diff(diff);
      if (shown) {
        for (const m of applied.joins) events.push(['join', m.user]);
        for (const u of applied.leaves) events.push(['leave', u]);
      }
    };
    for (let step = 0; step < 60 || loading; step++) {
      const r = random();
      if (r < 0.5) model.change(random);
      else if (r < 0.75) {
        const diff = model.flush();
        if (diff) deliver(diff);
      } else if (loading) {
        const page = model.page(cursor, limit, deliver);
        room.page(page.position, page.members, page.cursor !== undefined);
        room.counts(page.position, page.users, page.connections);
        cursor = page.cursor;
        if (cursor === undefined) {
          loading = false;
          shown = new Set(room.members.keys());
        }
      }
    }
    const last = model.flush();
    if (last) deliver(last);
    const why = `seed ${seed}`;
    assert.ok(room.complete, why);
    assert.deepEqual(
      room.list().map((m) => m.user),
      [...model.members.keys()].sort(bytewise),
      why,
    );
    for (const m of room.list()) assert.deepEqual(m, model.members.get(m.user), why);
    assert.equal(room.users, model.members.size, why);
    assert.equal(room.position, model.position, why);
    // The events, applied to what was shown at the end of the load, give the room.
    for (const [kind, user] of events) {
      if (kind === 'join') {
        assert.ok(!shown.has(user), `${why}: a join of ${user}, a member already`);
        shown.add(user);
      } else {
        assert.ok(shown.has(user), `${why}: a leave of ${user}, not a member`);
        shown.delete(user);
      }
    }
    assert.deepEqual([...shown].sort(bytewise), [...model.members.keys()].sort(bytewise), why);
  }
});

test('a diff before any page waits for the page of its users; one the page already holds is not applied twice', () => {
  const room = new PresenceRoom();
  const alice = { user: 'alice' };
  const bob = { user: 'bob' };
  // bob joined at 3, alice left at 4: the first page (at 3) holds bob and alice.
  room.diff({ op: 'presence_diff', topic: 't', from: 2, to: 3, joins: [bob], leaves: [], users: 2, connections: 2 });
  room.diff({ op: 'presence_diff', topic: 't', from: 3, to: 4, joins: [], leaves: ['alice'], users: 1, connections: 1 });
  assert.equal(room.members.size, 0, 'nothing is known before a page');
  const applied = room.page(3, [alice], true);
  assert.deepEqual(applied.leaves, ['alice'], "the diff after the page's position applies to its range");
  assert.equal(room.members.size, 0);
  room.page(3, [bob], false);
  assert.deepEqual(room.list(), [bob]);
  assert.equal(room.position, 4);
  assert.equal(room.users, 1);
});

test('a counts-only diff keeps the counts; the members are then not exact, and a Presence reloads when diffs name users again', async () => {
  const pages = [];
  const load = () => new Promise((resolve) => pages.push(resolve));
  const presence = new Presence('room:1', load, (e) => {
    throw e;
  });
  const seen = [];
  presence.on('join', (m) => seen.push(`+${m.user}`));
  presence.on('leave', ({ user }) => seen.push(`-${user}`));
  presence.reload();
  await Promise.resolve();
  // A diff while the only page is outstanding (its position is 5: the diff to 5 is in it).
  presence._diff({ op: 'presence_diff', topic: 'room:1', from: 4, to: 5, joins: [{ user: 'b' }], leaves: [], users: 2, connections: 2 });
  pages.shift()({ topic: 'room:1', position: 5, users: 2, connections: 2, members: [{ user: 'a' }, { user: 'b' }] });
  await presence.loaded();
  assert.deepEqual(seen, ['+a', '+b']);
  // Above the counts-only line.
  presence._diff({ op: 'presence_diff', topic: 'room:1', from: 5, to: 6, users: 3, connections: 3 });
  assert.equal(presence.snapshot().users, 3);
  // Back under it: members named again, so the room is loaded anew, and the difference told.
  presence._diff({ op: 'presence_diff', topic: 'room:1', from: 6, to: 7, joins: [], leaves: ['a'], users: 2, connections: 2 });
  await Promise.resolve();
  assert.equal(pages.length, 1, 'a reload asked for the first page');
  pages.shift()({ topic: 'room:1', position: 7, users: 2, connections: 2, members: [{ user: 'b' }, { user: 'c' }] });
  await presence.loaded();
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(seen, ['+a', '+b', '+c', '-a']);
  assert.deepEqual([...presence.members.keys()], ['b', 'c']);
});
