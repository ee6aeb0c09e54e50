import type { Command, HelloCommand } from './frame.js';
import type { openStream } from './stream.js';

/**
 * How the client reaches Herald: `websocket` (`/ws`), or `stream`
 * (HTTP-streaming: `POST /stream` answered with newline-delimited JSON
 * frames, commands by `POST /stream/<session>`) where WebSockets do not get
 * through.
 */
export type Transport = 'websocket' | 'stream';

/** What a link tells the client. Nothing is called after the link's `close()`. */
export interface LinkHandlers {
  /** A frame from the server: one JSON text, or one binary message (protobuf). */
  frame(data: string | Uint8Array): void;
  /** A heartbeat the server sent (a WebSocket ping the socket shows, an empty line of a stream): life. */
  beat(): void;
  /**
   * The link ended. `code` as a WebSocket close code (1006: none, the
   * connection dropped; 1005: a stream that ended with no word on why).
   */
  closed(code: number, reason: string): void;
}

/**
 * One connection to Herald, whatever carries it: the client's protocol
 * logic (`client.ts`) sits above this seam and is the same over both. The
 * link sends `hello` itself once it can (a WebSocket: on open; a stream: as
 * its request's body), then the commands it is given, in order.
 */
export interface Link {
  /** Sends a command, after those sent before it; dropped when the link is not (or no longer) open. */
  send(command: Command): void;
  /** Ends the link (what was sent before still goes out, as far as the transport allows). */
  close(): void;
  /** The token the server accepted in a `refresh`: a stream authenticates its command posts with it from now on. */
  auth(token: string): void;
  /**
   * Whether it got through (the upgrade, the stream's `200`): a WebSocket
   * that did not is what makes `auto` try the stream.
   */
  readonly opened: boolean;
  /** Whether the server's heartbeats show ({@link LinkHandlers.beat}): a link that hides them is probed with `ping`. */
  readonly beats: boolean;
}

/** Opens a link to `url` (a `ws(s)://…/ws` URL) that starts with `hello`. */
export type Opener = (url: string, hello: HelloCommand, handlers: LinkHandlers) => Link;

let streamModule: Promise<typeof import('./stream.js')> | undefined;

/**
 * The HTTP-streaming link, loaded the first time the client falls back to
 * it (or is told to use it): most connections never need it, so it is a
 * separate chunk of an app's bundle, out of what a page loads at start. A
 * load that failed is tried again at the next attempt.
 */
export async function loadStream(): Promise<typeof openStream> {
  streamModule ??= import('./stream.js');
  try {
    return (await streamModule).openStream;
  } catch (e) {
    streamModule = undefined;
    throw e;
  }
}
