/**
 * `@herald/client/presence`: a topic's presence merged and kept current,
 * kept out of the core bundle (the core has one page, `client.presence`; an
 * app that does not follow who is here does not carry the merge rule):
 *
 * ```ts
 * import { HeraldClient } from '@herald/client';
 * import { followPresence, presenceAll } from '@herald/client/presence';
 * const presence = followPresence(client.subscribe('room:1'));
 * presence.on('change', (s) => show(s.members));
 * const everyone = await presenceAll(client, 'room:2'); // every page, merged, no subscription needed
 * ```
 *
 * `PresenceRoom` merges pages and `presence_diff`s by the protocol's rule,
 * without I/O; `Presence` keeps a subscribed topic's members current with
 * it, told of the topic's diffs and of each re-subscribe or resume through
 * the subscription's hook (`PresenceFollower`, the one thing of presence the
 * core knows).
 * @packageDocumentation
 */
import type { HeraldClient } from './client.js';
import type { PresencePage } from './calls.js';
import { Emitter, type Fault } from './emitter.js';
import type { HeraldError } from './errors.js';
import type { PresenceDiffFrame, PresenceMember } from './frame.js';
import type { Subscription } from './subscription.js';

export type { PresenceOptions, PresencePage } from './calls.js';
export type { PresenceDiffFrame, PresenceMember } from './frame.js';

/** Counts and members of a topic's presence at `position`. */
export interface PresenceSnapshot {
  topic: string;
  position: number;
  users: number;
  connections: number;
  members: PresenceMember[];
}

/**
 * User ids in the server's order: bytewise over UTF-8, which is code point
 * order. JavaScript's `<` compares UTF-16 code units, which differs for
 * characters above U+FFFF (surrogates) against U+E000..U+FFFF.
 */
export function compareUsers(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    const sx = x >= 0xd800 && x <= 0xdfff;
    const sy = y >= 0xd800 && y <= 0xdfff;
    return sx === sy ? x - y : sx ? 1 : -1;
  }
  return a.length - b.length;
}

/** A loaded key range of the room: the users up to `upTo` (to the end when `undefined`), as of `position`. */
interface Range {
  upTo: string | undefined;
  position: number;
}

/** What one page or diff changed in a {@link PresenceRoom}. */
export interface Applied {
  joins: PresenceMember[];
  leaves: string[];
}

/**
 * The merge of presence pages and `presence_diff`s into one room, without
 * I/O (the rule of docs/protocol.md, "Presence"):
 * - a page answers at its `position` for the users of its key range (after
 *   the previous page's last user, up to its own last one; the last page to
 *   the end);
 * - a diff names each user at most once, with their state at `to`: it
 *   applies to a user whose range is loaded at a position below `to`, and is
 *   already in a page answered at `to` or later;
 * - a diff that comes before the page of a user's range is kept until that
 *   page comes, then applied under the same rule.
 * So a member is never missed nor counted twice, however pages and diffs
 * interleave. Pages must be given in order (each after the previous one's
 * cursor), diffs in the order they came.
 */
export class PresenceRoom {
  readonly members = new Map<string, PresenceMember>();
  /** Every page is in. */
  complete = false;
  /**
   * The members follow every change: `false` after a counts-only diff (a room
   * above the namespace's `presence_counts_only_above`) changed the count.
   */
  exact = true;
  position = 0;
  users = 0;
  connections = 0;
  #ranges: Range[] = [];
  /** Diffs seen before every page was in: replayed on each new range. */
  #early: PresenceDiffFrame[] = [];

  /** Adds the next page (`more`: a cursor came with it); what it added. */
  page(position: number, members: readonly PresenceMember[], more: boolean): Applied {
    if (this.complete) throw new Error('PresenceRoom: a page after the last one');
    const applied: Applied = { joins: [], leaves: [] };
    // An empty page with a cursor covers nothing new.
    if (more && members.length === 0) return applied;
    const last = this.#ranges[this.#ranges.length - 1];
    const upTo = more ? members[members.length - 1]?.user : undefined;
    for (const m of members) this.#set(m, applied);
    const range: Range = { upTo, position };
    const from = last?.upTo;
    for (const d of this.#early) {
      if (d.to <= position) continue;
      const inRange = (user: string) =>
        (from === undefined || compareUsers(user, from) > 0) && (upTo === undefined || compareUsers(user, upTo) <= 0);
      this.#apply(d, inRange, applied);
    }
    this.#ranges.push(range);
    this.#counts(position, undefined, undefined);
    if (!more) {
      this.complete = true;
      this.#early = [];
    }
    return applied;
  }

  /** Applies a `presence_diff` where the rule says; what it changed. */
  diff(d: PresenceDiffFrame): Applied {
    const applied: Applied = { joins: [], leaves: [] };
    if (!this.complete) this.#early.push(d);
    this.#apply(d, (user) => this.#loadedAt(user) !== undefined, applied);
    if (d.joins === undefined && d.leaves === undefined && d.users !== this.members.size && this.complete) {
      this.exact = false;
    }
    this.#counts(d.to, d.users, d.connections);
    return applied;
  }

  /** The page counts, for the newest position seen. */
  counts(position: number, users: number, connections: number): void {
    this.#counts(position, users, connections);
  }

  /** The members, ordered by user id. */
  list(): PresenceMember[] {
    return [...this.members.values()].sort((a, b) => compareUsers(a.user, b.user));
  }

  #counts(position: number, users: number | undefined, connections: number | undefined): void {
    if (position < this.position) return;
    this.position = position;
    if (users !== undefined) this.users = users;
    if (connections !== undefined) this.connections = connections;
  }

  /** The position a user's range was loaded at, or `undefined` if its page has not come. */
  #loadedAt(user: string): number | undefined {
    for (const r of this.#ranges) if (r.upTo === undefined || compareUsers(user, r.upTo) <= 0) return r.position;
    return undefined;
  }

  #apply(d: PresenceDiffFrame, where: (user: string) => boolean, applied: Applied): void {
    for (const m of d.joins ?? []) {
      if (!where(m.user) || d.to <= (this.#loadedAt(m.user) ?? 0)) continue;
      this.#set(m, applied);
    }
    for (const user of d.leaves ?? []) {
      if (!where(user) || d.to <= (this.#loadedAt(user) ?? 0)) continue;
      if (this.members.delete(user)) applied.leaves.push(user);
    }
  }

  #set(m: PresenceMember, applied: Applied): void {
    const known = this.members.has(m.user);
    this.members.set(m.user, m);
    if (!known) applied.joins.push(m);
  }
}

/** The events of a {@link Presence}. */
export interface PresenceEvents {
  /** A user joined the topic (their first connection subscribed). */
  join: PresenceMember;
  /** A user left (their last connection left). */
  leave: { user: string };
  /** Members or counts changed (also once every page is in). */
  change: PresenceSnapshot;
  /** A page could not be loaded (`DisabledError`: the namespace has no presence). */
  error: HeraldError;
}

/** One page of the topic's presence, after `cursor` (the first without). */
type PageLoader = (cursor: string | undefined) => Promise<PresencePage>;

/**
 * The members of a subscribed topic, kept current: every page loaded, then
 * the topic's `presence_diff`s applied by the protocol's rule (see
 * {@link PresenceRoom}); `join`, `leave` and `change` events. Reloaded after
 * each re-subscribe or resume (the diffs of a connection's gap are not
 * replayed), with the difference told as `join`s and `leave`s. Diffs come
 * only in a `join_leave` namespace; elsewhere the members are those of the
 * last load ({@link Presence.reload} loads again). From
 * {@link followPresence}.
 */
export class Presence extends Emitter<PresenceEvents> {
  readonly topic: string;
  #load: PageLoader;
  #room = new PresenceRoom();
  /** The room told to the app: kept while a reload is under way. */
  #shown: PresenceRoom | undefined;
  /** Bumped by each (re)load: the pages of an older one are dropped. */
  #gen = 0;
  #waiters: [() => void, (e: HeraldError) => void][] = [];
  closed = false;

  /** @internal */
  constructor(topic: string, load: PageLoader, fault: Fault) {
    super(fault);
    this.topic = topic;
    this.#load = load;
  }

  /** Every page is in (and since then, diffs applied). */
  get ready(): boolean {
    return this.#shown !== undefined;
  }

  /** The members (as of the last complete load and the diffs after it), by user id. */
  get members(): ReadonlyMap<string, PresenceMember> {
    return (this.#shown ?? this.#room).members;
  }

  /** Members (users), connections and the position they hold at. */
  snapshot(): PresenceSnapshot {
    const room = this.#shown ?? this.#room;
    return { topic: this.topic, position: room.position, users: room.users, connections: room.connections, members: room.list() };
  }

  /** Resolves once every page of the first load is in (at once if it is; a reload keeps the members shown until it ends). */
  loaded(): Promise<void> {
    if (this.ready) return Promise.resolve();
    return new Promise((resolve, reject) => this.#waiters.push([resolve, reject]));
  }

  /** Loads every page again (diffs that come meanwhile are merged). */
  reload(): void {
    if (this.closed) return;
    const gen = ++this.#gen;
    this.#room = new PresenceRoom();
    void this.#pages(gen);
  }

  /** Stops following (the subscription is unaffected). */
  close(): void {
    this.closed = true;
    this.#gen++;
  }

  /** @internal A `presence_diff` of the topic. */
  _diff(d: PresenceDiffFrame): void {
    if (this.closed) return;
    if (this.#room === this.#shown && !this.#room.exact && (d.joins !== undefined || d.leaves !== undefined)) {
      // Back under the counts-only line: the members are not known, so load
      // them (the pages hold this diff) and tell the difference.
      this.reload();
      return;
    }
    const applied = this.#room.diff(d);
    if (this.#room === this.#shown) this.#tell(applied);
  }

  async #pages(gen: number): Promise<void> {
    const room = this.#room;
    let cursor: string | undefined;
    try {
      do {
        const page = await this.#load(cursor);
        if (gen !== this.#gen) return;
        room.page(page.position, page.members, page.cursor !== undefined);
        room.counts(page.position, page.users, page.connections);
        cursor = page.cursor;
      } while (cursor !== undefined);
    } catch (e) {
      // A connection that ended mid-load: the re-subscribe or resume on the
      // next one loads again.
      if (gen !== this.#gen || ['closed', 'not_connected'].includes((e as HeraldError).code)) return;
      this.emit('error', e as HeraldError);
      for (const [, reject] of this.#waiters.splice(0)) reject(e as HeraldError);
      return;
    }
    const before = this.#shown;
    this.#shown = room;
    // Tell the app what changed since what it was shown (everything, the first time).
    const applied: Applied = { joins: [], leaves: [] };
    for (const m of room.members.values()) if (!before?.members.has(m.user)) applied.joins.push(m);
    for (const user of before?.members.keys() ?? []) if (!room.members.has(user)) applied.leaves.push(user);
    this.#tell(applied);
    for (const [resolve] of this.#waiters.splice(0)) resolve();
  }

  #tell(applied: Applied): void {
    for (const m of applied.joins) this.emit('join', m);
    for (const user of applied.leaves) this.emit('leave', { user });
    this.emit('change', this.snapshot());
  }
}

/**
 * The members of `subscription`'s topic, kept current (see {@link Presence};
 * the same object on each call for a subscription): every page loaded once
 * subscribed, then the `presence_diff`s of a `join_leave` namespace merged;
 * loaded again after each re-subscribe or resume. Its `error` event says
 * `DisabledError` where the namespace has no presence.
 */
export function followPresence(subscription: Subscription): Presence {
  let presence = subscription._presence as Presence | undefined;
  if (!presence) {
    const { topic, _owner: client } = subscription;
    // A listener that throws is the client's `error`, as for the subscription's own.
    presence = new Presence(topic, (cursor) => client.presence(topic, cursor === undefined ? {} : { cursor }), subscription._fault);
    subscription._presence = presence;
    if (subscription._held) presence.reload();
  }
  return presence;
}

/** Every page of the topic's presence, merged (the counts of the newest page); no subscription needed. */
export async function presenceAll(client: HeraldClient, topic: string): Promise<PresenceSnapshot> {
  const room = new PresenceRoom();
  let cursor: string | undefined;
  do {
    const page = await client.presence(topic, cursor === undefined ? {} : { cursor });
    room.page(page.position, page.members, page.cursor !== undefined);
    room.counts(page.position, page.users, page.connections);
    cursor = page.cursor;
  } while (cursor !== undefined);
  return { topic, position: room.position, users: room.users, connections: room.connections, members: room.list() };
}
