import type { OkFrame } from './frame.js';
import { Timer } from './timer.js';

/** Refresh the token this long before it expires (at most; a third of its lifetime if shorter). */
const REFRESH_MARGIN_MAX_MS = 30_000;

/** Where a fresh token comes from (the client's `getToken` option). */
export type TokenSource = () => string | null | undefined | Promise<string | null | undefined>;

/**
 * Keeps a connection's token fresh: before it expires, a new one from the
 * app's token source goes to the server as `refresh`, whose `ok` says when
 * that one expires in turn.
 */
export class TokenRefresh {
  #timer = new Timer();
  /** Bumped when the connection ends: a refresh under way for it does nothing more. */
  #gen = 0;
  #getToken: TokenSource | undefined;
  #send: (token: string) => Promise<OkFrame>;
  #fault: (error: unknown) => void;

  /** `send` sends `refresh` and resolves with its `ok`; `fault` reports a refresh that failed. */
  constructor(getToken: TokenSource | undefined, send: (token: string) => Promise<OkFrame>, fault: (error: unknown) => void) {
    this.#getToken = getToken;
    this.#send = send;
    this.#fault = fault;
  }

  /** Refreshes the token before `expires` (Unix seconds). */
  schedule(expires: number): void {
    const left = expires * 1000 - Date.now();
    const margin = Math.min(REFRESH_MARGIN_MAX_MS, left / 3);
    this.#timer.set(Math.max(0, left - margin), () => void this.#refresh());
  }

  /** The connection ended: its token needs no refresh. */
  stop(): void {
    this.#gen++;
    this.#timer.clear();
  }

  async #refresh(): Promise<void> {
    const gen = this.#gen;
    try {
      const token = await this.#getToken?.();
      if (!token || gen !== this.#gen) return;
      const ok = await this.#send(token);
      if (typeof ok.expires === 'number' && gen === this.#gen) this.schedule(ok.expires);
    } catch (e) {
      // The connection keeps its old expiry: at it the server closes with
      // 4004 and the client comes back with a token from `getToken`.
      if (gen === this.#gen) this.#fault(e);
    }
  }
}
