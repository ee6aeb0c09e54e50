import { Emitter, type Fault } from './emitter.js';
import type { HeraldError } from './errors.js';
import type { AckCommand, Base, DeltaDecoder, MsgBytes, MsgFrame, Opener, PresenceDiffFrame, SubCommand } from './frame.js';
import { fromBase64 } from './payload.js';
import type { PresenceOptions, PresencePage } from './calls.js';

/** A message handed to the application: each `seq` once, in order, within an `epoch`. */
export interface Message<T = unknown> {
  topic: string;
  seq: number;
  /** The topic's epoch the seq belongs to (`undefined` only before the server named it). */
  epoch: string | undefined;
  data: T;
}

/** The subscription is in place on the current connection. */
export interface Subscribed {
  topic: string;
  /** Live messages continue after this seq. */
  seq: number | undefined;
  epoch: string | undefined;
  /**
   * After a `sub` with `since`: whether every message since was replayed.
   * `false` comes with a `reset` event. `undefined` for a first subscribe
   * without `since`.
   */
  recovered: boolean | undefined;
  /**
   * The session was resumed: the server restored the subscription and
   * replays what was not acked; if its history cannot bridge the gap, a
   * `reset` follows.
   */
  resumed: boolean;
  /**
   * What the namespace's subscribe proxy attached to this subscription (any
   * JSON value), on the `subscribed` that answers a `sub`; absent otherwise.
   */
  data?: unknown;
  /** Deltas were asked for and granted (the namespace has `delta = true`): on the `subscribed` that answers a `sub`. */
  delta?: boolean;
}

/** Continuity was lost: resync the topic from its source, then continue live after `seq` in `epoch`. */
export interface Reset {
  topic: string;
  epoch: string | undefined;
  seq: number;
}

/**
 * Who made a subscription: the app (`client`), a backend through the HTTP or
 * gRPC API (`server`), or the token's `topics` claim (`token`).
 */
export type Origin = 'client' | 'server' | 'token';

/** The server ended a subscription on its own (`reason`: `server`, a backend's unsubscribe). */
export interface Unsubscribed {
  topic: string;
  reason: string;
}

/** The events of a {@link Subscription} whose messages carry `data` of type `T`. */
export interface SubscriptionEvents<T = unknown> {
  message: Message<T>;
  subscribed: Subscribed;
  reset: Reset;
  /** The subscription was refused or ended by the server (`forbidden`, `unknown_namespace`, …): it is closed. */
  error: HeraldError;
  /** The server ended it (a backend's unsubscribe): it is closed. */
  unsubscribed: Unsubscribed;
}

/** What a subscription needs of its client. */
export interface Owner {
  /** The topic's presence pages, for what follows them (`@herald/client/presence`). */
  presence(topic: string, options?: PresenceOptions): Promise<PresencePage>;
  /** @internal */
  _unsubscribe(sub: Subscription): void;
  /** @internal */
  _ackSoon(): void;
  /** @internal */
  readonly _autoAck: boolean;
}

/**
 * @internal What follows a subscribed topic's presence (`followPresence` of
 * `@herald/client/presence`): the core knows it by this alone, so that an
 * app that does not follow presence does not carry its merge rule.
 */
export interface PresenceFollower {
  /** A `presence_diff` of the topic. */
  _diff(d: PresenceDiffFrame): void;
  /** Subscribed again or resumed: the diffs of the gap are not replayed, so the members are loaded anew. */
  reload(): void;
  /** The subscription ended. */
  close(): void;
}

/**
 * One topic's stream, whose messages carry `data` of type `T` (see
 * `HeraldClient.subscribe`). Keeps what the protocol's client rule
 * needs: the newest seq handed over (a `msg` at or below it is a duplicate
 * and dropped), the epoch, and what to ack.
 */
export class Subscription<T = unknown> extends Emitter<SubscriptionEvents<T>> {
  /** The topic, as given to `subscribe`. */
  readonly topic: string;
  /** The current epoch (from `ok` or `reset`). */
  epoch: string | undefined;
  /** The newest seq handed to the application (or the seq the subscription started after). */
  seq: number | undefined;
  /** `msg`s dropped because their seq was not above {@link Subscription.seq}: redeliveries after a resume. */
  duplicates = 0;
  /** Closed by `unsubscribe()`, by a server error or by the server's `unsubscribed`. */
  closed = false;
  /** Who made it: the app, or the server (see `HeraldClient`'s `subscribed` event). */
  origin: Origin = 'client';

  /** @internal The session holds this subscription (an `ok` came, or a resume restored it). */
  _held = false;
  /** @internal The newest seq the application has processed (auto) or acked (manual). */
  _processed = 0;
  /** The newest seq this connection has seen for the topic: an ack must not pass it. */
  #wire: number | undefined;
  /** The last ack sent, and its epoch. */
  #acked = -1;
  #ackedEpoch: string | undefined;
  /** The `since` the `sub` in flight carried. */
  #since: number | undefined;

  /** @internal The client: `@herald/client/presence` loads the topic's pages through it. */
  readonly _owner: Owner;
  /** @internal What a listener that throws is given (the client's `error`). */
  readonly _fault: Fault;
  /** @internal Told of the topic's presence (see {@link PresenceFollower}). */
  _presence: PresenceFollower | undefined;
  /** `sub.data`, for the subscribe proxy. */
  #data: unknown;
  /** Deltas asked for. */
  #delta: boolean;
  /** The data the next delta applies to (deltas only). */
  #base: Base | undefined;
  /**
   * @internal A delta did not apply: the topic is being subscribed again
   * from {@link Subscription.seq}, and its messages are ignored until the
   * `ok` (they are replayed after it).
   */
  _resyncing = false;

  /** @internal */
  constructor(
    owner: Owner,
    topic: string,
    since: number | undefined,
    epoch: string | undefined,
    fault: Fault,
    data?: unknown,
    delta = false,
  ) {
    super(fault);
    this.#data = data;
    this.#delta = delta;
    this._fault = fault;
    this._owner = owner;
    this.topic = topic;
    this.seq = since;
    this.epoch = epoch;
    this._processed = since ?? 0;
  }

  /** Leaves the topic. No more events come. */
  unsubscribe(): void {
    if (this.closed) return;
    this.closed = true;
    this._presence?.close();
    this._owner._unsubscribe(this);
  }

  /** Subscribed (again), on the current connection: `subscribed` told, and the presence (if followed) loaded anew. */
  #subscribed(
    seq: number | undefined,
    epoch: string | undefined,
    recovered: boolean | undefined,
    resumed = false,
    extra?: { data?: unknown; delta?: boolean },
  ): void {
    this.emit('subscribed', { topic: this.topic, seq, epoch, recovered, resumed, ...extra });
    this._presence?.reload();
  }

  /** @internal A subscription the server made (`ok` with `reason`, no `id`). */
  _server(seq: number, epoch: string | undefined, recovered: boolean | undefined): void {
    this._held = true;
    this.#base = undefined;
    this.#wire = Math.max(this.#wire ?? 0, seq);
    this.epoch = epoch;
    if (recovered === true) {
      // Replayed from a `since` the backend gave, which the frame does not
      // name: every seq that comes is new.
      this.seq = undefined;
    } else {
      this.seq = seq;
      this._processed = seq;
      this.#acked = seq;
      this.#ackedEpoch = epoch;
    }
    this.#subscribed(seq, epoch, recovered);
    if (recovered === false) this.emit('reset', { topic: this.topic, epoch, seq });
  }

  /** @internal The server's `unsubscribed`. */
  _ended(reason: string): void {
    this.closed = true;
    this._held = false;
    this._presence?.close();
    this.emit('unsubscribed', { topic: this.topic, reason });
  }

  /** @internal The `sub` command: with `since` once a position is known. */
  _subCommand(id: number): SubCommand {
    this.#since = this.seq;
    const sub: SubCommand = { op: 'sub', id, topic: this.topic };
    if (this.seq !== undefined) {
      sub.since = this.seq;
      if (this.epoch !== undefined) sub.epoch = this.epoch;
    }
    if (this.#data !== undefined) sub.data = this.#data;
    if (this.#delta) sub.delta = true;
    return sub;
  }

  /** @internal The `ok` to our `sub`. */
  _ok(seq: number, epoch: string | undefined, recovered: boolean | undefined, data?: unknown, delta?: boolean): void {
    this._held = true;
    this._resyncing = false;
    this.#base = undefined;
    // The subscribe proxy's `data`, and whether deltas were granted, on each `subscribed` this `ok` causes.
    const extra: { data?: unknown; delta?: boolean } = data === undefined ? {} : { data };
    if (delta) extra.delta = true;
    const since = this.#since;
    this.#since = undefined;
    this.#wire = Math.max(this.#wire ?? 0, seq);
    if (since === undefined) {
      this.epoch = epoch;
      this.seq = seq;
      this._processed = seq;
      this.#acked = seq;
      this.#ackedEpoch = epoch;
      this.#subscribed(seq, epoch, undefined, false, extra);
      return;
    }
    if (recovered) {
      this.epoch = epoch ?? this.epoch;
      this.#subscribed(this.seq, this.epoch, true, false, extra);
      return;
    }
    // Not recovered: live from the current seq. Within the same epoch the
    // position never goes back, so that no seq is handed over twice.
    this.#subscribed(seq, epoch, false, false, extra);
    this._reset(epoch, epoch === this.epoch ? Math.max(since, seq) : seq);
  }

  /** @internal A resumed session brought the subscription back. */
  _resumed(): void {
    this._resyncing = false;
    this.#base = undefined;
    // The pod vouches for what we acked (it replays after it), so an ack up to it is safe.
    if (this.#ackedEpoch === this.epoch && this.#acked >= 0) this.#wire = this.#acked;
    this.#subscribed(this.seq, this.epoch, true, true);
  }

  /**
   * @internal The full data of a `msg` (a delta applied), keeping the base
   * for the next one. Throws where it cannot be made: the base is gone then.
   */
  _open(m: MsgFrame | MsgBytes, open: Opener | undefined, decoder: DeltaDecoder | undefined): unknown {
    const base = this.#base;
    this.#base = undefined;
    // Without a codec or a decoder, only the plain form comes.
    if (!open) return (m as MsgFrame).binary ? fromBase64((m as MsgFrame).data as string) : (m as MsgFrame).data;
    const opened = open(m, base, decoder);
    if (this.#delta) this.#base = opened.base;
    return opened.data;
  }

  /** @internal A `msg`. */
  _msg(seq: number, data: unknown): void {
    this.#wire = Math.max(this.#wire ?? 0, seq);
    if (this.seq !== undefined && seq <= this.seq) {
      this.duplicates++;
      this._owner._ackSoon();
      return;
    }
    this.seq = seq;
    // `T` is the app's word for what publishers send: nothing here checks it.
    this.emit('message', { topic: this.topic, seq, epoch: this.epoch, data: data as T });
    if (this._owner._autoAck) this._processed = seq;
    this._owner._ackSoon();
  }

  /** @internal A `reset`, or a `sub` with `since` that could not be recovered. */
  _reset(epoch: string | undefined, seq: number): void {
    this.#base = undefined;
    if (epoch !== undefined && epoch === this.epoch && this.seq !== undefined && seq <= this.seq) {
      // Told again of the epoch we are in (a resume repeats a reset we may
      // not have read): nothing was skipped, carry on.
      this.#wire = Math.max(this.#wire ?? 0, seq);
      return;
    }
    this.epoch = epoch;
    this.seq = seq;
    this._processed = seq;
    this.#wire = Math.max(this.#wire ?? 0, seq);
    this.emit('reset', { topic: this.topic, epoch, seq });
    this._owner._ackSoon();
  }

  /** @internal The `ack` due now, if any. */
  _ackCommand(): AckCommand | undefined {
    if (!this._held || this.closed || this.#wire === undefined) return undefined;
    const seq = Math.min(this._processed, this.#wire);
    if (seq <= 0 || (seq <= this.#acked && this.#ackedEpoch === this.epoch)) return undefined;
    this.#acked = seq;
    this.#ackedEpoch = this.epoch;
    const ack: AckCommand = { op: 'ack', topic: this.topic, seq };
    if (this.epoch !== undefined) ack.epoch = this.epoch;
    return ack;
  }

  /** @internal The connection ended: nothing is known of the next one yet. */
  _disconnected(): void {
    this.#wire = undefined;
    this.#since = undefined;
    this.#base = undefined;
    this._resyncing = false;
  }
}
