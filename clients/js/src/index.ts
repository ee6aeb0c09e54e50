/**
 * Herald's client for browsers and Node (>= 20): `HeraldClient` connects,
 * resumes its session across drops and pods, and hands each topic's messages
 * to the app once and in order. docs/clients.md has the guide.
 * @packageDocumentation
 */
export {
  HeraldClient,
  DEFAULT_ACK_INTERVAL_MS,
  DEFAULT_BACKOFF_INITIAL_MS,
  DEFAULT_BACKOFF_MAX_MS,
  DEFAULT_TIMEOUT_MS,
  type HeraldClientOptions,
  type ConnectionState,
  type StateChange,
  type ClientEvents,
  type SubscribeOptions,
  type Published,
} from './client.js';
export { Subscription, type Message, type Subscribed, type Reset, type SubscriptionEvents } from './subscription.js';
export {
  HeraldError,
  UnauthorizedError,
  TokenExpiredError,
  ForbiddenError,
  RateLimitedError,
  UnavailableError,
  isTerminalClose,
  type ErrorCode,
} from './errors.js';
export { Emitter } from './emitter.js';
