/**
 * The client's calls: the commands answered by the `ok` or `err` of their
 * `id` (`pub`, `rpc`, `presence`, `history`, `refresh`), what the app passes
 * to them and gets back, and the calls in flight, each settled once by its
 * answer, its timeout or the end of its connection. Apart from the client
 * because none of it depends on the connection's state: the client gives a
 * call its id and sends it.
 * @module
 */
import { HeraldError } from './errors.js';
import type {
  HistoryCommand,
  OkFrame,
  PresenceCommand,
  PresenceMember,
  PubCommand,
  Publication,
  RefreshCommand,
  RpcCommand,
} from './frame.js';
import type { HeraldClient } from './client.js';
import { fromBase64 } from './payload.js';

/** The options of {@link HeraldClient.presence}. */
export interface PresenceOptions {
  /** The `cursor` of the previous page. */
  cursor?: string;
  /** Members per page (default and most: the server's `presence.page_size`). */
  limit?: number;
}

/** One page of a topic's presence, as {@link HeraldClient.presence} gives it. */
export interface PresencePage {
  topic: string;
  /** The presence position this page answers at (see `PresenceRoom` of `@herald/client/presence`). */
  position: number;
  users: number;
  connections: number;
  /** Ordered by user id (bytewise). */
  members: PresenceMember[];
  /** Pass it back for the next page; absent on the last one. */
  cursor?: string;
}

/** The options of {@link HeraldClient.history}. */
export interface HistoryOptions {
  /** Forward: the messages after this seq (default: from the oldest kept). Reverse: those below it (default: from the newest). */
  since?: number;
  /** The epoch `since` belongs to; another epoch's is `HistoryLostError`. */
  epoch?: string;
  /** At most this many (default 100; the server's `history.max_limit` at most); 0: the position only. */
  limit?: number;
  /** Newest first. */
  reverse?: boolean;
}

/** Kept messages of a topic, and its position. */
export interface HistoryPage<T = unknown> {
  topic: string;
  /** The topic's current position. */
  epoch: string;
  seq: number;
  /** Oldest first (newest first with `reverse`). Page on with the last one's seq as `since`. */
  publications: Publication<T>[];
}

/** The options of {@link HeraldClient.subscribe}. */
export interface SubscribeOptions {
  /** Replay every message after this seq first (e.g. the last one the app stored). */
  since?: number;
  /** The epoch `since` belongs to; without it the topic's current epoch is assumed. */
  epoch?: string;
  /**
   * Any JSON value, sent with every `sub` of this subscription (the first
   * and each re-subscribe): Herald gives it to the namespace's subscribe
   * proxy. What the proxy attaches comes back as `subscribed`'s `data`.
   */
  data?: unknown;
  /**
   * Ask for deltas (where the namespace has `delta = true`): the server
   * sends a message as a delta against the one before where that is
   * smaller, and the client applies it (the client's `delta` option), so
   * that `message` gives the full data as always.
   */
  delta?: boolean;
}

/** The options of {@link HeraldClient.rpc}. */
export interface RpcOptions {
  /** Longest to wait for the answer (default: the client's `timeoutMs`). */
  timeoutMs?: number;
}

/** What a `pub` was given. */
export interface Published {
  seq: number;
  epoch: string;
  /**
   * The namespace's publish proxy accepted the message but did not publish
   * it (`seq` 0, `epoch` empty then).
   */
  skipped?: true;
}

/** A command answered by the `ok` or `err` of its `id`, before it is given one. */
export type Request =
  | Omit<PubCommand, 'id'>
  | Omit<RefreshCommand, 'id'>
  | Omit<PresenceCommand, 'id'>
  | Omit<HistoryCommand, 'id'>
  | Omit<RpcCommand, 'id'>;

interface Pending {
  resolve(frame: OkFrame): void;
  reject(error: HeraldError): void;
  timer: ReturnType<typeof setTimeout>;
}

/** The calls in flight on the current connection, by id. */
export class Calls {
  #pending = new Map<number, Pending>();

  /** The answer to the call `id` (an `op`), sent next; rejected with `timeout` after `timeoutMs`. */
  start(id: number, op: Request['op'], timeoutMs: number): Promise<OkFrame> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(id);
        reject(new HeraldError('timeout', `no answer to \`${op}\` in ${timeoutMs} ms`));
      }, timeoutMs);
      this.#pending.set(id, { resolve, reject, timer });
    });
  }

  /** The `ok` of call `id` (if it is still in flight: not timed out). */
  ok(id: number, frame: OkFrame): void {
    this.#take(id)?.resolve(frame);
  }

  /** The `err` of call `id` (if it is still in flight). */
  err(id: number, error: HeraldError): void {
    this.#take(id)?.reject(error);
  }

  /** The connection ended: every call in flight fails with `error`. */
  fail(error: HeraldError): void {
    for (const p of this.#pending.values()) {
      clearTimeout(p.timer);
      p.reject(error);
    }
    this.#pending.clear();
  }

  #take(id: number): Pending | undefined {
    const p = this.#pending.get(id);
    if (p) {
      this.#pending.delete(id);
      clearTimeout(p.timer);
    }
    return p;
  }
}

/** A `pub`'s `ok` as the app gets it. */
export function published(ok: OkFrame): Published {
  // No position: the publish proxy swallowed it.
  if (ok.seq === undefined) return { seq: 0, epoch: '', skipped: true };
  return { seq: ok.seq, epoch: ok.epoch ?? '' };
}

export function presenceCommand(topic: string, options: PresenceOptions): Omit<PresenceCommand, 'id'> {
  const command: Omit<PresenceCommand, 'id'> = { op: 'presence', topic };
  if (options.cursor !== undefined) command.cursor = options.cursor;
  if (options.limit !== undefined) command.limit = options.limit;
  return command;
}

/** A `presence` call's `ok` as the app gets it. */
export function presencePage(ok: OkFrame, topic: string): PresencePage {
  const page: PresencePage = {
    topic: ok.topic ?? topic,
    position: ok.position ?? 0,
    users: ok.users ?? 0,
    connections: ok.connections ?? 0,
    members: ok.members ?? [],
  };
  if (ok.cursor !== undefined) page.cursor = ok.cursor;
  return page;
}

export function historyCommand(topic: string, options: HistoryOptions): Omit<HistoryCommand, 'id'> {
  const command: Omit<HistoryCommand, 'id'> = { op: 'history', topic };
  if (options.since !== undefined) command.since = options.since;
  if (options.epoch !== undefined) command.epoch = options.epoch;
  if (options.limit !== undefined) command.limit = options.limit;
  if (options.reverse) command.reverse = true;
  return command;
}

/** A `history` call's `ok` as the app gets it. */
export function historyPage<T>(ok: OkFrame, topic: string): HistoryPage<T> {
  return {
    topic: ok.topic ?? topic,
    epoch: ok.epoch ?? '',
    seq: ok.seq ?? 0,
    // Bytes in base64 (JSON) read back; `T` is the app's word for what publishers send: nothing here checks it.
    publications: (ok.publications ?? []).map((p) =>
      p.binary && typeof p.data === 'string' ? { ...p, data: fromBase64(p.data) } : p,
    ) as Publication<T>[],
  };
}
