import { Timer } from './timer.js';

/** The server's ping interval when `welcome` names none. */
const DEFAULT_PING_MS = 25_000;
/** Past the server's ping interval, how long a silent connection may stay silent (at most). */
const PONG_GRACE_MAX_MS = 10_000;

/**
 * Finds a dead connection: silence (no frame, and no ping where the socket
 * shows them) longer than the server's ping interval plus a grace ends it.
 * A socket that hides the server's pings (a browser's) is probed first with
 * a `ping` command, whose answer, like any frame, is life.
 */
export class Heartbeat {
  #timer = new Timer();
  /** The server's ping interval, from `welcome` until the connection ends (`undefined`: nothing to watch). */
  #pingMs: number | undefined;
  /** Whether the socket shows the server's pings (the `ws` package does; browsers do not). */
  #pingsVisible = false;
  /** A `ping` of ours is unanswered: more silence ends the connection. */
  #probing = false;
  #probe: () => void;
  #dead: () => void;

  /** `probe` sends a `ping` command; `dead` ends the connection. */
  constructor(probe: () => void, dead: () => void) {
    this.#probe = probe;
    this.#dead = dead;
  }

  /**
   * Watches the connection that was welcomed: the server pings every
   * `pingMs` (`welcome.ping_ms`; anything but a positive number means the
   * default). The clock starts at {@link Heartbeat.alive}.
   */
  start(pingMs: number, pingsVisible: boolean): void {
    this.#pingMs = pingMs > 0 ? pingMs : DEFAULT_PING_MS;
    this.#pingsVisible = pingsVisible;
  }

  /** Something came: the connection lives. Silence past the ping interval and a grace ends it. */
  alive(): void {
    const pingMs = this.#pingMs;
    if (pingMs === undefined) return;
    this.#probing = false;
    this.#timer.set(pingMs + Math.min(pingMs, PONG_GRACE_MAX_MS), () => this.#silent());
  }

  /** The connection ended. */
  stop(): void {
    this.#pingMs = undefined;
    this.#probing = false;
    this.#timer.clear();
  }

  #silent(): void {
    if (this.#pingsVisible || this.#probing) {
      this.#dead();
      return;
    }
    // A browser's WebSocket answers pings without showing them: ask the
    // server for an answer instead. Its `ok` (any frame) is life; the client
    // finds no request of that id and ignores it.
    this.#probing = true;
    this.#probe();
    // Set: the timer that ran this is armed only while a connection is watched.
    this.#timer.set(Math.min(this.#pingMs!, PONG_GRACE_MAX_MS), () => this.#silent());
  }
}
