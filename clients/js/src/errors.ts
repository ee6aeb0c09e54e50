/**
 * Typed errors: one class per `err` code an application handles differently,
 * and {@link HeraldError} (with its `code`) for the rest.
 */

/**
 * The `err` codes of docs/protocol.md, and the SDK's own (`closed`,
 * `timeout`, `not_connected`). A backend behind Herald's proxies may answer
 * with codes of its own (`[a-z][a-z0-9_]{0,31}`): they come as they are.
 */
export type ErrorCode =
  | 'malformed'
  | 'unknown_op'
  | 'missing_field'
  | 'bad_topic'
  | 'unknown_namespace'
  | 'forbidden'
  | 'unauthorized'
  | 'token_expired'
  | 'rate_limited'
  | 'not_subscribed'
  | 'already_subscribed'
  | 'too_many_subscriptions'
  | 'unavailable'
  | 'internal'
  /** The namespace has no presence (`presence`), or Herald has no rpc proxy (`rpc`). */
  | 'disabled'
  /** `history` with a `since` out of the kept window or of another epoch. */
  | 'history_lost'
  /** The connection closed for good (see `closeCode`), or before an answer came. */
  | 'closed'
  /** No answer within `timeoutMs`. */
  | 'timeout'
  /** `publish` while not connected: nothing was sent. */
  | 'not_connected';

/** Every error the SDK reports or rejects with. */
export class HeraldError extends Error {
  /** The server's `err.code`, or the SDK's own code. */
  readonly code: ErrorCode | (string & {});
  /** The WebSocket close code, when a close caused it. */
  readonly closeCode: number | undefined;
  constructor(code: ErrorCode | (string & {}), message: string, closeCode?: number) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.closeCode = closeCode;
  }
}

/** No valid token where one is required (close 4502): the client stops; fix the token source. */
export class UnauthorizedError extends HeraldError {}
/** The token expired; the client fetches a new one through `getToken` and resumes by itself. */
export class TokenExpiredError extends HeraldError {}
/** The namespace or the token does not allow this subscribe or publish. */
export class ForbiddenError extends HeraldError {}
/** Commands came faster than the pod allows. */
export class RateLimitedError extends HeraldError {}
/** The broker, or the backend behind a proxy, could not take the request now: retry later. */
export class UnavailableError extends HeraldError {}
/** The feature is off for the topic's namespace (`presence` where `presence = false`). */
export class DisabledError extends HeraldError {}
/**
 * `history` from a `since` the topic no longer holds (out of its window, or
 * of another epoch): nothing partial is answered. Resync from the source,
 * then ask again from the current position (a `limit: 0` answer gives it).
 */
export class HistoryLostError extends HeraldError {}

const CLASSES: Record<string, typeof HeraldError> = {
  unauthorized: UnauthorizedError,
  token_expired: TokenExpiredError,
  forbidden: ForbiddenError,
  rate_limited: RateLimitedError,
  unavailable: UnavailableError,
  disabled: DisabledError,
  history_lost: HistoryLostError,
};

/** The typed error for a server `err` code. */
export function errorFor(code: string, message: string, closeCode?: number): HeraldError {
  return new (CLASSES[code] ?? HeraldError)(code, message, closeCode);
}

/**
 * Whether a close code means "come back" (with backoff, resuming the
 * session) or "do not, without changing something": 4000-4499 and 1012 (a
 * draining pod) reconnect, 4500-4999 and the protocol errors 1002, 1003,
 * 1007, 1008, 1009 are terminal. A close without a code (1005, 1006: a pod
 * killed, a network cut) reconnects.
 */
export function isTerminalClose(code: number): boolean {
  return (code >= 4500 && code <= 4999) || [1002, 1003, 1007, 1008, 1009].includes(code);
}

const CLOSE_CODES: Record<number, [string, string]> = {
  4500: ['closed', 'too many bad commands in a row'],
  4501: ['closed', 'the session was resumed by another connection'],
  4502: ['unauthorized', 'no valid token where one is required'],
  4503: ['closed', "a backend ended the user's access"],
  4504: ['rate_limited', 'commands kept coming over the rate limit'],
};

/** The error a terminal close ends the client with; `err` is the server's last word before it, if any. */
export function closeError(code: number, reason: string, err?: HeraldError): HeraldError {
  if (err && (code === 4502 || code === 4504)) return errorFor(err.code, err.message, code);
  const [kind, text] = CLOSE_CODES[code] ?? ['closed', 'protocol error'];
  return errorFor(kind, `closed ${code}: ${reason || text}`, code);
}
