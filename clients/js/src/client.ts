import { backoff } from './backoff.js';
import {
  Calls,
  historyCommand,
  historyPage,
  presenceCommand,
  presencePage,
  published,
  type HistoryOptions,
  type HistoryPage,
  type PresenceOptions,
  type PresencePage,
  type Published,
  type Request,
  type RpcOptions,
  type SubscribeOptions,
} from './calls.js';
import { Emitter } from './emitter.js';
import type { ClientEvents, ConnectionState, StateChange } from './events.js';
import { HeraldError, closeError, errorFor, isTerminalClose } from './errors.js';
import {
  parseFrame,
  type Command,
  type DecodedFrame,
  type DeltaDecoder,
  type ErrFrame,
  type HelloCommand,
  type MsgBytes,
  type MsgFrame,
  type OkFrame,
  type Opener,
  type ProtobufCodec,
  type RpcCommand,
  type UnsubscribedFrame,
  type WelcomeFrame,
} from './frame.js';
import { Fallback } from './fallback.js';
import { Heartbeat } from './heartbeat.js';
import { loadStream, type Link, type LinkHandlers, type Transport } from './link.js';
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
import { Subscription, type Owner } from './subscription.js';
import { Subscriptions } from './subscriptions.js';
import type { Fetch } from './stream.js';
import { Timer } from './timer.js';
import { openWebSocket, type SocketClass } from './websocket.js';

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
  #subs = new Subscriptions();
  #calls = new Calls();
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
    this.#subs.add(sub);
    if (this.#welcomed) this.#subscribe(sub);
    return sub;
  }

  /** Manual acks: the app has processed every message of `topic` up to `seq`. Sent batched. */
  ack(topic: string, seq: number): void {
    const sub = this.#subs.find(topic);
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
    return published(await this.#request({ op: 'pub', topic, data }));
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
    return presencePage(await this.#request(presenceCommand(topic, options)), topic);
  }

  /**
   * Kept messages of the topic, where the namespace lets this client
   * subscribe: after `since` oldest first, or below it newest first
   * (`reverse`), and the topic's position. A `since` the history no longer
   * holds rejects with `HistoryLostError` (never a partial answer).
   */
  async history<T = unknown>(topic: string, options: HistoryOptions = {}): Promise<HistoryPage<T>> {
    return historyPage<T>(await this.#request(historyCommand(topic, options)), topic);
  }

  /** @internal */
  _unsubscribe(sub: Subscription): void {
    if (!this.#subs.remove(sub)) return;
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
    this.#calls.fail(new HeraldError('closed', 'the connection closed before the answer'));
    this.#subs.disconnected();
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
        return this.#subs.find(m.topic)?._reset(m.epoch, m.seq);
      case 'ok':
        return this.#ok(m);
      case 'err':
        return this.#err(m);
      case 'presence_diff':
        return this.#subs.find(m.topic)?._presence?._diff(m);
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
    for (const sub of this.#subs.all()) {
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
    const sub = this.#subs.answered(id);
    if (sub) {
      if (sub.closed) {
        // Unsubscribed while the `sub` was in flight.
        this.#send({ op: 'unsub', id: ++this.#id, topic: sub.topic });
        return;
      }
      sub._ok(m.seq ?? 0, m.epoch, m.recovered, m.data, m.delta);
      return;
    }
    this.#calls.ok(id, m);
  }

  #msg(m: MsgFrame | MsgBytes): void {
    const sub = this.#subs.find(m.topic);
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
    if (m.topic === undefined || this.#subs.find(m.topic)) return;
    const sub = new Subscription(this, m.topic, undefined, undefined, (e) => this.#fault(e));
    sub.origin = m.reason === 'token' ? 'token' : 'server';
    // Held from now on: an `unsubscribe()` in the listener below tells the server.
    sub._held = true;
    this.#subs.add(sub);
    // The app hears of it first, so that its listeners see `subscribed` and every message.
    this.emit('subscribed', { subscription: sub, reason: m.reason ?? 'server' });
    if (!sub.closed) sub._server(m.seq ?? 0, m.epoch, m.recovered);
  }

  #unsubscribed(m: UnsubscribedFrame): void {
    const sub = this.#subs.find(m.topic);
    if (!sub || sub.closed) return;
    this.#subs.remove(sub);
    sub._ended(m.reason);
    this.emit('unsubscribed', { subscription: sub, topic: sub.topic, reason: m.reason });
  }

  #err(m: ErrFrame): void {
    const e = errorFor(m.code, m.message);
    if (m.id !== undefined) {
      const sub = this.#subs.answered(m.id);
      if (sub) {
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
      this.#calls.err(m.id, e);
      return;
    }
    if (!this.#welcomed) {
      // A refused `hello`: the close that follows says what comes next.
      this.#helloErr = e;
      return;
    }
    // Not caused by a command of ours: a subscription the server ended (a
    // resume the token no longer grants), named by `topic`.
    const sub = this.#subs.find(m.topic);
    if (sub) this.#drop(sub, e);
    else this.emit('error', e);
  }

  #drop(sub: Subscription, e: HeraldError): void {
    sub.closed = true;
    this.#subs.remove(sub);
    sub.emit('error', e);
  }

  #subscribe(sub: Subscription): void {
    const id = ++this.#id;
    this.#subs.sent(id, sub);
    this.#send(sub._subCommand(id));
  }

  #flushAcks(): void {
    this.#ackTimer.clear();
    if (!this.#welcomed) return;
    for (const sub of this.#subs.all()) {
      const ack = sub._ackCommand();
      if (ack) this.#send(ack);
    }
  }

  #request(command: Request, timeoutMs = this.#timeoutMs): Promise<OkFrame> {
    if (!this.#welcomed) return Promise.reject(new HeraldError('not_connected', 'not connected'));
    const id = ++this.#id;
    const answer = this.#calls.start(id, command.op, timeoutMs);
    this.#send({ ...command, id });
    return answer;
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
