/**
 * Reconnect waits: exponential backoff with full jitter, as Herald's Rust
 * `Backoff` (`backoff/src/lib.rs`). Full jitter (a wait drawn uniformly
 * between zero and the attempt's ceiling) spreads the clients of a pod that
 * died, which all lost it at the same instant; a floor would bring them back
 * together.
 */

/**
 * The wait before attempt `attempt` (from 0): a random time between zero and
 * `initialMs × 2^attempt`, at most `maxMs`.
 */
export function backoff(initialMs: number, maxMs: number, attempt: number): number {
  return Math.floor(Math.random() * Math.min(maxMs, initialMs * 2 ** attempt));
}
