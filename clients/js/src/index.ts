/**
 * Herald's client for browsers and Node (>= 20): `HeraldClient` connects,
 * resumes its session across drops and pods, and hands each topic's messages
 * to the app once and in order. docs/clients.md has the guide.
 *
 * The modules: `client` speaks the protocol (docs/protocol.md) over one
 * connection after another, each a `link` (the seam: what the client needs of
 * a connection) over `websocket` or `stream` (HTTP-streaming: `ndjson` splits
 * its response into frames; loaded with `import()` by `link` the first time
 * it is used, so that a page does not load it at start), as `fallback` picks;
 * `frame` is its wire, the server's frames (a union keyed on `op`, checked on
 * the way in by `parseFrame`) and the commands; `events` are what the client
 * tells its listeners; `calls` are the commands answered by their id's `ok`
 * or `err` (`pub`, `rpc`, `presence`, `history`, `refresh`), their options
 * and results and those in flight; `subscriptions` finds a frame's
 * subscription by topic or by its `sub`'s id; `subscription` is one topic's
 * stream and its acks, and tells a topic's presence diffs to what follows
 * them. Beside the protocol:
 * `backoff` (the wait before a reconnect), `heartbeat` (a dead connection
 * found), `refresh` (the token renewed before it expires), `timer`, `options`
 * (with their defaults), `emitter` (events) and `errors` (one class per code
 * an app handles differently). A `msg` goes socket -> `client` (parsed by
 * `frame`) -> its `subscription` (a duplicate dropped) -> the app's
 * `message` listeners -> an `ack` batched by `client` -> the link (a
 * WebSocket message, or a line of a `POST /stream/<session>`).
 *
 * The extras, each an entry point of its own so that an app carries only
 * those it imports: `protobuf` (`@herald/client/protobuf`, the codec of
 * `protocol: 'protobuf'`), `delta` (`@herald/client/delta`, the Fossil delta
 * decoder) and `presence` (`@herald/client/presence`: `PresenceRoom`, the
 * merge of presence pages and diffs without I/O, and `Presence`, a
 * subscribed topic's members kept current).
 * @packageDocumentation
 */
export { HeraldClient } from './client.js';
export type {
  ConnectionState,
  StateChange,
  ClientEvents,
  ServerSubscribed,
  ServerUnsubscribed,
  TransportChange,
} from './events.js';
export type {
  SubscribeOptions,
  Published,
  RpcOptions,
  PresenceOptions,
  PresencePage,
  HistoryOptions,
  HistoryPage,
} from './calls.js';
export type { PresenceMember, PresenceDiffFrame, Publication } from './frame.js';
export {
  DEFAULT_ACK_INTERVAL_MS,
  DEFAULT_BACKOFF_INITIAL_MS,
  DEFAULT_BACKOFF_MAX_MS,
  DEFAULT_TIMEOUT_MS,
  DEFAULT_WEBSOCKET_RETRY_MS,
  type HeraldClientOptions,
  type HelloData,
} from './options.js';
export {
  Subscription,
  type Message,
  type Subscribed,
  type Reset,
  type SubscriptionEvents,
  type Origin,
  type Unsubscribed,
} from './subscription.js';
export {
  HeraldError,
  UnauthorizedError,
  TokenExpiredError,
  ForbiddenError,
  RateLimitedError,
  UnavailableError,
  DisabledError,
  HistoryLostError,
  isTerminalClose,
  type ErrorCode,
} from './errors.js';
export { Emitter } from './emitter.js';
export type { Transport } from './link.js';
export type { TransportOption } from './fallback.js';
export type { Fetch } from './stream.js';
