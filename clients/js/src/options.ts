import type { TransportOption } from './fallback.js';
import type { DeltaDecoder, ProtobufCodec } from './frame.js';
import type { TokenSource } from './refresh.js';
import type { Fetch } from './stream.js';

/** `hello.data`: a JSON value, or a function returning one (or a promise of one). */
export type HelloData = unknown | (() => unknown | Promise<unknown>);

/** First reconnect delay cap; doubled per failed attempt up to {@link DEFAULT_BACKOFF_MAX_MS}. */
export const DEFAULT_BACKOFF_INITIAL_MS = 500;
/** Largest reconnect delay cap. Each delay is a random fraction of the cap (full jitter). */
export const DEFAULT_BACKOFF_MAX_MS = 20_000;
/** Acks are batched: at most one per topic per this interval. */
export const DEFAULT_ACK_INTERVAL_MS = 100;
/** Longest the client waits for `welcome`, or for the answer to a `pub`, `refresh` or `rpc` (unless the call gives its own). */
export const DEFAULT_TIMEOUT_MS = 10_000;

/** On HTTP-streaming (`transport: 'auto'`), the WebSocket is tried again at the first reconnect this long after it last failed. */
export const DEFAULT_WEBSOCKET_RETRY_MS = 60_000;

/** The options of a `HeraldClient`: where to connect, with which token, and its timings. */
export interface HeraldClientOptions {
  /** WebSocket URLs of the pods (`wss://host/ws`); the client moves to the next one on each reconnect. */
  urls: string | string[];
  /**
   * Returns the token for `hello` and `refresh` (`null`: connect without one).
   * Called before every connection attempt and before each refresh, so a
   * token that expired is replaced without the app noticing. Cache in it if
   * fetching is costly.
   */
  getToken?: TokenSource;
  /**
   * Sent as `hello.data` on every connection (the first and each resume):
   * any JSON value, or a function returning one (called before each attempt,
   * so it can carry something fresh, such as a CSRF token). Herald gives it
   * to the backend's connect proxy when the `hello` has no token (see
   * docs/hooks.md); it is ignored otherwise.
   */
  helloData?: HelloData;
  /** Reconnect backoff (exponential, full jitter). */
  backoff?: { initialMs?: number; maxMs?: number };
  /**
   * `auto` (default): a message counts as processed once its `message`
   * listeners return. `manual`: only what the app passes to
   * `HeraldClient.ack`. Either way acks are batched.
   */
  acks?: 'auto' | 'manual';
  /** Default {@link DEFAULT_ACK_INTERVAL_MS}. */
  ackIntervalMs?: number;
  /** Default {@link DEFAULT_TIMEOUT_MS}. */
  timeoutMs?: number;
  /**
   * A WebSocket constructor (the `ws` package on Node 20, which has no global
   * one). Default: `globalThis.WebSocket`. With `protocol: 'protobuf'` it is
   * given the subprotocol too (`new WebSocket(url, ['herald.v1.protobuf'])`).
   */
  WebSocket?: new (url: string, protocols?: string[]) => unknown;
  /**
   * `json` (default): JSON text frames. `protobuf`: binary frames, each one
   * of herald.proto's messages (the WebSocket offers `herald.v1.protobuf`),
   * smaller on the wire; needs the codec, `protobuf` below. HTTP-streaming,
   * and a server that does not select the subprotocol, speak JSON.
   */
  protocol?: 'json' | 'protobuf';
  /** The codec of `protocol: 'protobuf'`: `import { protobuf } from '@herald/client/protobuf'`. */
  protobuf?: ProtobufCodec;
  /**
   * What applies the deltas of a `subscribe(topic, { delta: true })`:
   * `import { fossil } from '@herald/client/delta'`.
   */
  delta?: DeltaDecoder;
  /**
   * `auto` (default): the WebSocket; where it cannot be opened (the upgrade
   * refused or blocked, or closed before `welcome` 3 times in a row),
   * HTTP-streaming to the same server (`POST /stream` beside `/ws`), with
   * the same API and guarantees, until the WebSocket works again. `websocket`
   * or `stream`: that one only.
   */
  transport?: TransportOption;
  /** Default {@link DEFAULT_WEBSOCKET_RETRY_MS}. */
  webSocketRetryMs?: number;
  /** The `fetch` HTTP-streaming uses (default: the global one); in Node, one that sets a cookie, say. */
  fetch?: Fetch;
}
