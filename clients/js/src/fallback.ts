import type { Transport } from './link.js';

/** The `transport` option: `auto` (WebSocket, HTTP-streaming where it cannot be opened), or one forced. */
export type TransportOption = 'auto' | Transport;

/**
 * WebSocket connections that opened and then closed before any frame
 * came (a proxy that lets the upgrade through but not what follows), in a
 * row, after which `auto` uses HTTP-streaming.
 */
export const SILENT_CLOSES_MAX = 3;

/**
 * Which transport each connection attempt uses, by the `transport` rule
 * (sans I/O: the client reports each attempt's outcome). `auto` starts on
 * the WebSocket. A WebSocket that cannot be opened (the upgrade refused,
 * or an error before it opened: a browser cannot tell those apart), or that
 * closes before any frame {@link SILENT_CLOSES_MAX} times in a row, makes
 * the next attempt an HTTP stream to the same URL, at once: if that one is
 * welcomed, the client is on the fallback; if it fails too, the server
 * itself is unreachable (a pod down, a network cut), not the WebSocket, and
 * the attempt after it is a WebSocket again. Once on the fallback, the
 * WebSocket is tried again at the first reconnect after `retryMs` since
 * it last failed.
 */
export class Fallback {
  /** The transport of the last connection that was welcomed (before any: the first one tried). */
  current: Transport;
  #mode: TransportOption;
  #retryMs: number;
  /** When the WebSocket last failed to carry a connection. */
  #failedAt = -Infinity;
  #silentCloses = 0;
  /** The next attempt is a stream to the URL the WebSocket just failed on. */
  #probe = false;

  constructor(mode: TransportOption, retryMs: number) {
    this.#mode = mode;
    this.#retryMs = retryMs;
    this.current = mode === 'stream' ? 'stream' : 'websocket';
  }

  /** Whether the next attempt is the stream tried right after the WebSocket failed: no backoff before it, and the same URL. */
  get probing(): boolean {
    return this.#probe;
  }

  /** The transport of the next attempt. */
  next(now: number): Transport {
    if (this.#mode !== 'auto') return this.#mode;
    if (this.#probe) {
      this.#probe = false;
      return 'stream';
    }
    return this.current === 'stream' && now - this.#failedAt < this.#retryMs ? 'stream' : 'websocket';
  }

  /**
   * An attempt over `transport` ended before `welcome`. `opened`: it got
   * through (the upgrade, the stream's `200`); `heard`: a frame came (the
   * server's `err`, say: then it is not the transport that failed).
   */
  failed(transport: Transport, opened: boolean, heard: boolean, now: number): void {
    if (this.#mode !== 'auto' || transport !== 'websocket') return;
    if (heard) {
      this.#silentCloses = 0;
      return;
    }
    if (opened && ++this.#silentCloses < SILENT_CLOSES_MAX) return;
    this.#silentCloses = 0;
    this.#probe = true;
    this.#failedAt = now;
  }

  /** A connection over `transport` was welcomed; whether that changed {@link Fallback.current}. */
  welcomed(transport: Transport): boolean {
    if (transport === 'websocket') this.#silentCloses = 0;
    const changed = transport !== this.current;
    this.current = transport;
    return changed;
  }
}
