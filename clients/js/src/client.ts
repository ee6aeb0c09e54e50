import { backoff } from './backoff.js';
import { Emitter } from './emitter.js';
import { HeraldError, closeError, errorFor, isTerminalClose } from './errors.js';
import {
  parseFrame,
  type Command,
  type DecodedFrame,
  type DeltaDecoder,
  type ErrFrame,
  type HelloCommand,
  type HistoryCommand,
  type MsgBytes,
  type MsgFrame,
  type OkFrame,
  type Opener,
  type PresenceCommand,
  type PresenceMember,
  type ProtobufCodec,
  type PubCommand,
  type Publication,
  type RefreshCommand,
  type RpcCommand,
  type UnsubscribedFrame,
  type WelcomeFrame,
} from './frame.js';
import { Fallback } from './fallback.js';
import { Heartbeat } from './heartbeat.js';
import type { Link, LinkHandlers, Transport } from './link.js';
import {
  DEFAULT_ACK_INTERVAL_MS,
  DEFAULT_BACKOFF_INITIAL_MS,
  DEFAULT_BACKOFF_MAX_MS,
  DEFAULT_TIMEOUT_MS,
  DEFAULT_WEBSOCKET_RETRY_MS,
  type HeraldClientOptions,
  type HelloData,
} from './options.js';
import { TokenRefresh, type TokenSource } from './refresh.js';
import { fromBase64 } from './payload.js';
import { Subscription, type Owner } from './subscription.js';
import type { Fetch } from './stream.js';
import { Timer } from './timer.js';
import { openWebSocket, type SocketClass } from './websocket.js';

/**
 * `connecting` (a socket is opening or `hello` is unanswered), `connected`
 * (`welcome` came), `disconnected` (waiting `delayMs` to reconnect), `closed`
 * (by {@link HeraldClient.close}, or for good: `error` says why).
 */
export type ConnectionState = 'idle' | 'connecting' | 'connected' | 'disconnected' | 'closed';

/** A `state` event. */
export interface StateChange {
  state: ConnectionState;
  /** `connected`: the session id, and whether the previous session was resumed. */
  session?: string;
  resumed?: boolean;
  /** `disconnected`: the close code (1006: none, or the client found the connection dead) and the wait before the next attempt. */
  closeCode?: number;
  delayMs?: number;
  /** `closed` for good: why. */
  error?: HeraldError;
}

/** A subscription the server made on its own: a backend's `POST /v1/subscribe` (`server`), the token's `topics` (`token`). */
export interface ServerSubscribed {
  subscription: Subscription;
  reason: 'server' | 'token' | (string & {});
}

/** The server ended a subscription on its own (a backend's `POST /v1/unsubscribe`). */
export interface ServerUnsubscribed {
  subscription: Subscription;
  topic: string;
  reason: string;
}

/** A `transport` event: the connection now welcomed goes over another transport than the one before. */
export interface TransportChange {
  transport: Transport;
  previous: Transport;
}

/** The events of a {@link HeraldClient}. */
export interface ClientEvents {
  state: StateChange;
  /**
   * The client moved to another transport (`auto`): to HTTP-streaming where
   * the WebSocket could not be opened, back to the WebSocket once it could.
   * Told when the first connection over the new one is welcomed, before its
   * `state` event.
   */
  transport: TransportChange;
  /** Something went wrong that no promise or subscription reports: a refused refresh, a listener that threw. */
  error: HeraldError;
  /**
   * The server subscribed this connection (a backend, or the token's
   * `topics`): listen on the subscription now, its messages follow. Not for
   * a topic the app subscribed already.
   */
  subscribed: ServerSubscribed;
  /** The server ended a subscription (the app's or its own): it is closed. */
  unsubscribed: ServerUnsubscribed;
}

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

let streamModule: Promise<typeof import('./stream.js')> | undefined;

/**
 * The HTTP-streaming link, loaded the first time the client falls back to
 * it (or is told to use it): most connections never need it, so it is a
 * separate chunk of an app's bundle, out of what a page loads at start. A
 * load that failed is tried again at the next attempt.
 */
async function loadStream(): Promise<typeof import('./stream.js').openStream> {
  streamModule ??= import('./stream.js');
  try {
    return (await streamModule).openStream;
  } catch (e) {
    streamModule = undefined;
    throw e;
  }
}

/** A command answered by the `ok` or `err` of its `id`, before it is given one. */
type Request =
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

/**
 * A connection to Herald that keeps the delivery contract for the app:
 * it resumes its session on any pod after a drop (or subscribes again with
 * `since`), drops redelivered seqs, acks what was processed, and tells the
 * app with `reset` when continuity could not be kept.
 *
 * ```ts
 * const client = new HeraldClient({ urls: 'wss://herald.example.com/ws', getToken });
 * client.subscribe('news').on('message', (m) => console.log(m.seq, m.data));
 * await client.connect();
 * ```
 */
export class HeraldClient extends Emitter<ClientEvents> implements Owner {
  /** The connection's state; changes are `state` events. */
  state: ConnectionState = 'idle';

  /**
   * The transport of the current connection (the last one welcomed; before
   * any, the first one to be tried): `websocket` or `stream`
   * (HTTP-streaming). Changes are `transport` events.
   */
  get transport(): Transport {
    return this.#fallback.current;
  }
  /** The session id (keep it secret: it resumes an anonymous session). */
  session: string | undefined;
  /** @internal */
  readonly _autoAck: boolean;

  #getToken: TokenSource | undefined;
  #helloData: HelloData;
  #urls: string[];
  #next = 0;
  /** The URL of the last attempt: the stream tried right after a WebSocket failed goes to it again. */
  #url = '';
  #Socket: SocketClass | undefined;
  #fetch: Fetch | undefined;
  #protobuf: ProtobufCodec | undefined;
  #delta: DeltaDecoder | undefined;
  #opener: Opener | undefined;
  #fallback: Fallback;
  #initialMs: number;
  #maxMs: number;
  #ackMs: number;
  #timeoutMs: number;

  /** Bumped whenever a connection ends: handlers of an older one do nothing. */
  #gen = 0;
  #link: Link | undefined;
  /** The transport of {@link HeraldClient.#link}. */
  #linkTransport: Transport = 'websocket';
  #welcomed = false;
  /** A frame came over the current link (before `welcome`: it got through, whatever ended it). */
  #heard = false;
  #subs = new Map<string, Subscription>();
  /** `sub`s in flight, by id. */
  #subIds = new Map<number, Subscription>();
  #pending = new Map<number, Pending>();
  #id = 0;
  /** Reconnect attempts since the last `welcome`. */
  #attempt = 0;
  /** `after_ms` of the `reconnect` advice of the current connection. */
  #advice: number | undefined;
  /** The `err` that came before `welcome` (a refused token): the close that follows says whether it is terminal. */
  #helloErr: HeraldError | undefined;
  /** A connection attempt's timer: the wait before it starts, then (its socket created) for its `welcome`. */
  #attemptTimer = new Timer();
  #ackTimer = new Timer();
  #heartbeat = new Heartbeat(
    () => this.#send({ op: 'ping', id: ++this.#id }),
    () => this.#lost(this.#gen, 1006, 'no ping from the server in time'),
  );
  #refresh: TokenRefresh;
  #waiters: [() => void, (e: HeraldError) => void][] = [];
  #faulting = false;

  constructor(options: HeraldClientOptions) {
    super((e) => this.#fault(e));
    this.#urls = typeof options.urls === 'string' ? [options.urls] : [...options.urls];
    if (this.#urls.length === 0) throw new TypeError('HeraldClient: `urls` is empty');
    const mode = options.transport ?? 'auto';
    this.#Socket = options.WebSocket ?? (globalThis as { WebSocket?: SocketClass }).WebSocket;
    if (!this.#Socket && mode !== 'stream') {
      throw new TypeError("HeraldClient: no global WebSocket here; pass `WebSocket` (e.g. the `ws` package), or `transport: 'stream'`");
    }
    const globalFetch = (globalThis as { fetch?: Fetch }).fetch;
    this.#fetch = options.fetch ?? globalFetch?.bind(globalThis);
    if (!this.#fetch && mode === 'stream') throw new TypeError('HeraldClient: no global fetch here; pass `fetch`');
    // Without `fetch`, `auto` is the WebSocket alone.
    this.#fallback = new Fallback(this.#fetch ? mode : 'websocket', options.webSocketRetryMs ?? DEFAULT_WEBSOCKET_RETRY_MS);
    if (options.protocol === 'protobuf') {
      this.#protobuf = options.protobuf;
      if (!this.#protobuf) throw new TypeError('HeraldClient: no `protobuf` codec');
    }
    this.#delta = options.delta;
    this.#opener = this.#delta?.open ?? this.#protobuf?.open;
    this.#getToken = options.getToken;
    this.#helloData = options.helloData;
    this.#initialMs = options.backoff?.initialMs ?? DEFAULT_BACKOFF_INITIAL_MS;
    this.#maxMs = options.backoff?.maxMs ?? DEFAULT_BACKOFF_MAX_MS;
    this.#refresh = new TokenRefresh(
      options.getToken,
      (token) => {
        const link = this.#link;
        // Accepted: the stream's command posts carry it from now on (one refused is not the session's user).
        return this.#request({ op: 'refresh', token }).then((ok) => (link?.auth(token), ok));
      },
      (e) => this.#fault(e),
    );
    this.#ackMs = options.ackIntervalMs ?? DEFAULT_ACK_INTERVAL_MS;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this._autoAck = (options.acks ?? 'auto') === 'auto';
  }

  /**
   * Connects (and keeps reconnecting until {@link HeraldClient.close}).
   * Resolves at the next `welcome`; rejects if the client closes for good
   * first (an {@link UnauthorizedError}, say).
   */
  connect(): Promise<void> {
    if (this.state === 'connected') return Promise.resolve();
    const done = new Promise<void>((resolve, reject) => this.#waiters.push([resolve, reject]));
    if (this.state === 'idle' || this.state === 'closed') {
      this.#attempt = 0;
      void this.#open();
    }
    return done;
  }

  /** Closes the connection and stops reconnecting. `connect()` again resumes the session. */
  close(): void {
    if (this.#welcomed) this.#flushAcks();
    this.#end();
    this.#stop(undefined);
  }

  /**
   * Subscribes to `topic` (now, or once connected). Messages, `subscribed`,
   * `reset` and `error` are events of the returned subscription. `T` is the
   * type of the messages' `data` (not checked: it is what the publishers
   * send), `unknown` unless given:
   *
   * ```ts
   * client.subscribe<Price>('prices').on('message', (m) => show(m.data.bid));
   * ```
   */
  subscribe<T = unknown>(topic: string, options: SubscribeOptions = {}): Subscription<T> {
    if (this.#subs.has(topic)) throw new HeraldError('already_subscribed', `already subscribed to \`${topic}\``);
    if (options.delta && !this.#delta) throw new TypeError('HeraldClient: no `delta` decoder');
    const sub = new Subscription<T>(this, topic, options.since, options.epoch, (e) => this.#fault(e), options.data, options.delta);
    this.#subs.set(topic, sub);
    if (this.#welcomed) this.#subscribe(sub);
    return sub;
  }

  /** Manual acks: the app has processed every message of `topic` up to `seq`. Sent batched. */
  ack(topic: string, seq: number): void {
    const sub = this.#sub(topic);
    if (!sub) return;
    sub._processed = Math.max(sub._processed, Math.min(seq, sub.seq ?? seq));
    this._ackSoon();
  }

  /**
   * Publishes `data` (any JSON value) where the topic's namespace lets
   * clients publish. Rejects with a typed error (`ForbiddenError`, …), or
   * `not_connected` while there is no connection (nothing is sent: a publish
   * is not retried, as it could then happen twice).
   */
  async publish(topic: string, data: unknown): Promise<Published> {
    const ok = await this.#request({ op: 'pub', topic, data });
    // No position: the publish proxy swallowed it.
    if (ok.seq === undefined) return { seq: 0, epoch: '', skipped: true };
    return { seq: ok.seq, epoch: ok.epoch ?? '' };
  }

  /**
   * Calls `method` on the application's backend through Herald's rpc
   * proxy, as this connection's user, and resolves with the backend's
   * reply `data` (`T`, not checked). Rejects with a {@link HeraldError}
   * whose `code` is the backend's own (`insufficient_funds`, say) when it
   * refused, `disabled` where Herald has no rpc proxy, `unavailable` when
   * the backend did not answer, `timeout`, or `not_connected` (nothing was
   * sent: a call is never retried, as the backend could then run it twice).
   *
   * ```ts
   * const cart = await client.rpc<Cart>('cart.add', { sku: 'A-1' }, { timeoutMs: 3000 });
   * ```
   */
  async rpc<T = unknown>(method: string, data?: unknown, options: RpcOptions = {}): Promise<T> {
    const command: Omit<RpcCommand, 'id'> = { op: 'rpc', method };
    if (data !== undefined) command.data = data;
    const ok = await this.#request(command, options.timeoutMs);
    // `T` is the app's word for what its backend answers: nothing here checks it.
    return ok.data as T;
  }

  /**
   * One page of the topic's presence (members ordered by user id, counts,
   * the position it answers at), where the namespace lets this client
   * subscribe (no subscription needed). Rejects with `DisabledError` where
   * the namespace has no presence. `@herald/client/presence` has the rest:
   * every page merged (`presenceAll`), a subscribed topic's members kept
   * current (`followPresence`).
   */
  async presence(topic: string, options: PresenceOptions = {}): Promise<PresencePage> {
    const command: Omit<PresenceCommand, 'id'> = { op: 'presence', topic };
    if (options.cursor !== undefined) command.cursor = options.cursor;
    if (options.limit !== undefined) command.limit = options.limit;
    const ok = await this.#request(command);
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

  /**
   * Kept messages of the topic, where the namespace lets this client
   * subscribe: after `since` oldest first, or below it newest first
   * (`reverse`), and the topic's position. A `since` the history no longer
   * holds rejects with `HistoryLostError` (never a partial answer).
   */
  async history<T = unknown>(topic: string, options: HistoryOptions = {}): Promise<HistoryPage<T>> {
    const command: Omit<HistoryCommand, 'id'> = { op: 'history', topic };
    if (options.since !== undefined) command.since = options.since;
    if (options.epoch !== undefined) command.epoch = options.epoch;
    if (options.limit !== undefined) command.limit = options.limit;
    if (options.reverse) command.reverse = true;
    const ok = await this.#request(command);
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

  /** @internal */
  _unsubscribe(sub: Subscription): void {
    if (this.#subs.get(sub.topic) !== sub) return;
    this.#subs.delete(sub.topic);
    if (sub._held) this.#send({ op: 'unsub', id: ++this.#id, topic: sub.topic });
  }

  /** @internal */
  _ackSoon(): void {
    if (!this.#ackTimer.armed && this.#welcomed) this.#ackTimer.set(this.#ackMs, () => this.#flushAcks());
  }

  // ---------------------------------------------------------------- connection

  async #open(): Promise<void> {
    const gen = ++this.#gen;
    this.#set({ state: 'connecting' });
    let token: string | null | undefined;
    let data: unknown;
    try {
      if (this.#getToken) token = await this.#getToken();
      data = typeof this.#helloData === 'function' ? await this.#helloData() : this.#helloData;
    } catch (e) {
      if (gen !== this.#gen) return;
      this.#fault(e);
      this.#retry(1006);
      return;
    }
    // Closed meanwhile: by the app (in a `state` listener, say), or for good.
    if (gen !== this.#gen) return;
    const url = this.#fallback.probing ? this.#url : this.#urls[this.#next++ % this.#urls.length]!;
    this.#url = url;
    const transport = this.#fallback.next(Date.now());
    const hello: HelloCommand = { op: 'hello' };
    if (token) hello.token = token;
    if (this.session) hello.resume = this.session;
    if (data !== undefined) hello.data = data;
    const handlers: LinkHandlers = {
      frame: (data) => gen === this.#gen && this.#frame(data),
      beat: () => gen === this.#gen && this.#heartbeat.alive(),
      closed: (code, reason) => this.#lost(gen, code, reason),
    };
    this.#welcomed = false;
    this.#heard = false;
    this.#helloErr = undefined;
    this.#advice = undefined;
    this.#linkTransport = transport;
    let openStream: typeof import('./stream.js').openStream | undefined;
    if (transport === 'stream') {
      // The first time: its chunk is loaded, within the attempt's time.
      this.#attemptTimer.set(this.#timeoutMs, () => this.#lost(gen, 1006, 'the HTTP-streaming link not loaded in time'));
      try {
        openStream = await loadStream();
      } catch (e) {
        // The chunk could not be loaded (a network cut, say): a failed attempt, tried again.
        if (gen !== this.#gen) return;
        this.#fault(new HeraldError('closed', `cannot load the HTTP-streaming link: ${e}`));
        this.#retry(1006);
        return;
      }
      if (gen !== this.#gen) return;
    }
    try {
      this.#link = openStream
        ? openStream(this.#fetch!, url, hello, handlers)
        : openWebSocket(this.#Socket!, url, hello, handlers, this.#protobuf);
    } catch (e) {
      this.#stop(new HeraldError('closed', `cannot open ${url}: ${e}`));
      return;
    }
    this.#attemptTimer.set(this.#timeoutMs, () => this.#lost(gen, 1006, 'no welcome in time'));
  }

  /** The connection of generation `gen` ended (closed by the server, dropped, or found dead). */
  #lost(gen: number, code: number, reason: string): void {
    if (gen !== this.#gen) return;
    if (!this.#welcomed) this.#fallback.failed(this.#linkTransport, this.#link?.opened ?? false, this.#heard, Date.now());
    this.#end();
    if (isTerminalClose(code)) {
      this.#stop(closeError(code, reason, this.#helloErr));
      return;
    }
    this.#retry(code);
  }

  /** Schedules the next attempt: after the server's advice, or a backoff with full jitter. */
  #retry(code: number): void {
    // The stream right after a WebSocket that failed is another way to the same server, not another try of it: no wait.
    const delay = this.#advice ?? (this.#fallback.probing ? 0 : backoff(this.#initialMs, this.#maxMs, this.#attempt++));
    this.#advice = undefined;
    // Before the event: a listener that closes the client ends this generation.
    const gen = this.#gen;
    this.#set({ state: 'disconnected', closeCode: code, delayMs: delay });
    this.#attemptTimer.set(delay, () => {
      if (gen === this.#gen) void this.#open();
    });
  }

  /** Drops the current socket and everything tied to it. */
  #end(): void {
    this.#gen++;
    this.#attemptTimer.clear();
    this.#ackTimer.clear();
    this.#heartbeat.stop();
    this.#refresh.stop();
    const link = this.#link;
    this.#link = undefined;
    this.#welcomed = false;
    link?.close();
    for (const p of this.#pending.values()) {
      clearTimeout(p.timer);
      p.reject(new HeraldError('closed', 'the connection closed before the answer'));
    }
    this.#pending.clear();
    this.#subIds.clear();
    for (const sub of this.#subs.values()) sub._disconnected();
  }

  /** Closed for good with `error`, or by the app (`undefined`): `closed`, and `connect()` callers told. */
  #stop(error: HeraldError | undefined): void {
    this.#set(error ? { state: 'closed', error } : { state: 'closed' });
    if (error) this.emit('error', error);
    const why = error ?? new HeraldError('closed', 'closed by the application');
    for (const [, reject] of this.#waiters.splice(0)) reject(why);
  }

  #set(change: StateChange): void {
    this.state = change.state;
    this.emit('state', change);
  }

  // ---------------------------------------------------------------- messages

  #frame(data: string | Uint8Array): void {
    let m: DecodedFrame | undefined;
    try {
      m = typeof data === 'string' ? parseFrame(data) : this.#protobuf?.decode(data);
    } catch {
      return;
    }
    // Any frame is life, even one this client does not know; and the transport carries.
    this.#heard = true;
    this.#heartbeat.alive();
    switch (m?.op) {
      case 'welcome':
        return this.#welcome(m);
      case 'msg':
        return this.#msg(m);
      case 'reset':
        return this.#sub(m.topic)?._reset(m.epoch, m.seq);
      case 'ok':
        return this.#ok(m);
      case 'err':
        return this.#err(m);
      case 'presence_diff':
        return this.#sub(m.topic)?._presence?._diff(m);
      case 'unsubscribed':
        return this.#unsubscribed(m);
      case 'reconnect':
        // Leave as advised: the server closes next; acks sent now still count.
        this.#advice = m.after_ms;
        this.#flushAcks();
        return;
    }
  }

  #welcome(m: WelcomeFrame): void {
    this.#attemptTimer.clear();
    const resumed = m.resumed === true && m.session === this.session;
    this.session = m.session;
    this.#welcomed = true;
    this.#attempt = 0;
    this.#heartbeat.start(m.ping_ms, this.#link?.beats ?? false);
    if (typeof m.expires === 'number') this.#refresh.schedule(m.expires);
    const previous = this.#fallback.current;
    const gen = this.#gen;
    if (this.#fallback.welcomed(this.#linkTransport)) this.emit('transport', { transport: this.#linkTransport, previous });
    // A listener that closed the client ended this connection.
    if (gen !== this.#gen) return;
    this.#set({ state: 'connected', session: m.session, resumed });
    for (const sub of [...this.#subs.values()]) {
      if (resumed && sub._held) sub._resumed();
      else {
        sub._held = false;
        this.#subscribe(sub);
      }
    }
    this.#heartbeat.alive();
    for (const [resolve] of this.#waiters.splice(0)) resolve();
  }

  #ok(m: OkFrame): void {
    const id = m.id;
    if (id === undefined) return this.#serverSub(m);
    const sub = this.#subIds.get(id);
    if (sub) {
      this.#subIds.delete(id);
      if (sub.closed) {
        // Unsubscribed while the `sub` was in flight.
        this.#send({ op: 'unsub', id: ++this.#id, topic: sub.topic });
        return;
      }
      sub._ok(m.seq ?? 0, m.epoch, m.recovered, m.data, m.delta);
      return;
    }
    const p = this.#pending.get(id);
    if (p) {
      this.#pending.delete(id);
      clearTimeout(p.timer);
      p.resolve(m);
    }
  }

  #msg(m: MsgFrame | MsgBytes): void {
    const sub = this.#sub(m.topic);
    if (!sub || sub._resyncing) return;
    let data: unknown;
    try {
      data = sub._open(m, this.#opener, this.#delta);
    } catch (e) {
      // Data that cannot be made (not JSON) is ignored, as a frame that is
      // not JSON is. A delta that does not apply is not: rather than hand
      // over wrong data or skip a seq, subscribe again after the last seq
      // handed over (the server replays from there, and sends the next live
      // message in full).
      if (!m.delta) return;
      console.warn(`herald: ${m.topic}: ${e}; subscribing again`);
      sub._resyncing = true;
      if (sub._held) {
        sub._held = false;
        this.#send({ op: 'unsub', id: ++this.#id, topic: sub.topic });
      }
      this.#subscribe(sub);
      return;
    }
    sub._msg(m.seq, data);
  }

  /** A subscription the server made: a new one for the app, unless it has the topic already. */
  #serverSub(m: OkFrame): void {
    if (m.topic === undefined || this.#sub(m.topic)) return;
    const sub = new Subscription(this, m.topic, undefined, undefined, (e) => this.#fault(e));
    sub.origin = m.reason === 'token' ? 'token' : 'server';
    // Held from now on: an `unsubscribe()` in the listener below tells the server.
    sub._held = true;
    this.#subs.set(m.topic, sub);
    // The app hears of it first, so that its listeners see `subscribed` and every message.
    this.emit('subscribed', { subscription: sub, reason: m.reason ?? 'server' });
    if (!sub.closed) sub._server(m.seq ?? 0, m.epoch, m.recovered);
  }

  #unsubscribed(m: UnsubscribedFrame): void {
    const sub = this.#sub(m.topic);
    if (!sub || sub.closed) return;
    this.#subs.delete(sub.topic);
    sub._ended(m.reason);
    this.emit('unsubscribed', { subscription: sub, topic: sub.topic, reason: m.reason });
  }

  #err(m: ErrFrame): void {
    const e = errorFor(m.code, m.message);
    if (m.id !== undefined) {
      const sub = this.#subIds.get(m.id);
      if (sub) {
        this.#subIds.delete(m.id);
        if (sub.closed) return;
        if (e.code === 'already_subscribed') {
          // The session got the `sub` before the connection that sent it ended.
          sub._held = true;
          sub._resumed();
        } else if (e.code === 'unavailable' || e.code === 'rate_limited') {
          const gen = this.#gen;
          setTimeout(() => gen === this.#gen && !sub.closed && this.#subscribe(sub), this.#initialMs);
        } else this.#drop(sub, e);
        return;
      }
      const p = this.#pending.get(m.id);
      if (p) {
        this.#pending.delete(m.id);
        clearTimeout(p.timer);
        p.reject(e);
      }
      return;
    }
    if (!this.#welcomed) {
      // A refused `hello`: the close that follows says what comes next.
      this.#helloErr = e;
      return;
    }
    // Not caused by a command of ours: a subscription the server ended (a
    // resume the token no longer grants), named by `topic`.
    const sub = this.#sub(m.topic);
    if (sub) this.#drop(sub, e);
    else this.emit('error', e);
  }

  #drop(sub: Subscription, e: HeraldError): void {
    sub.closed = true;
    if (this.#subs.get(sub.topic) === sub) this.#subs.delete(sub.topic);
    sub.emit('error', e);
  }

  #sub(topic: string | undefined): Subscription | undefined {
    if (topic === undefined) return undefined;
    return (
      this.#subs.get(topic) ??
      (topic.startsWith('default:') ? this.#subs.get(topic.slice(8)) : this.#subs.get(`default:${topic}`))
    );
  }

  #subscribe(sub: Subscription): void {
    const id = ++this.#id;
    this.#subIds.set(id, sub);
    this.#send(sub._subCommand(id));
  }

  #flushAcks(): void {
    this.#ackTimer.clear();
    if (!this.#welcomed) return;
    for (const sub of this.#subs.values()) {
      const ack = sub._ackCommand();
      if (ack) this.#send(ack);
    }
  }

  #request(command: Request, timeoutMs = this.#timeoutMs): Promise<OkFrame> {
    return new Promise((resolve, reject) => {
      if (!this.#welcomed) {
        reject(new HeraldError('not_connected', 'not connected'));
        return;
      }
      const id = ++this.#id;
      const timer = setTimeout(() => {
        this.#pending.delete(id);
        reject(new HeraldError('timeout', `no answer to \`${command.op}\` in ${timeoutMs} ms`));
      }, timeoutMs);
      this.#pending.set(id, { resolve, reject, timer });
      this.#send({ ...command, id });
    });
  }

  #send(command: Command): void {
    this.#link?.send(command);
  }

  // ---------------------------------------------------------------- errors

  #fault(e: unknown): void {
    const error = e instanceof HeraldError ? e : new HeraldError('internal', `a listener threw: ${String(e)}`);
    if (this.#faulting) {
      console.error(error);
      return;
    }
    this.#faulting = true;
    try {
      this.emit('error', error);
    } finally {
      this.#faulting = false;
    }
  }
}
