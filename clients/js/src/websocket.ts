import type { Command, HelloCommand, ProtobufCodec } from './frame.js';
import type { Link, LinkHandlers } from './link.js';

/** The part of the WHATWG WebSocket the client uses: browsers, Node 22's global, the `ws` package. */
interface Socket {
  readonly readyState: number;
  /** The subprotocol the server selected (`''`: none). */
  readonly protocol: string;
  binaryType: string;
  send(data: string | Uint8Array): void;
  close(code?: number): void;
  terminate?(): void;
  on?(event: 'ping', listener: () => void): void;
  onopen: (() => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: (() => void) | null;
}

/** A WebSocket constructor: the global one, or the `ws` package's. */
export type SocketClass = new (url: string, protocols?: string[]) => unknown;

/** The subprotocol of binary frames, each one of herald.proto's messages. */
export const PROTOBUF = 'herald.v1.protobuf';

/**
 * A link over a WebSocket to `url`: `hello` once it opens, each command a
 * text message; with `codec`, `herald.v1.protobuf` is offered, and where the
 * server selects it each command is a binary message (frames from the
 * server come as text or bytes, whichever it sends). Throws if the socket
 * cannot even be created (a bad URL).
 */
export function openWebSocket(Socket: SocketClass, url: string, hello: HelloCommand, on: LinkHandlers, codec?: ProtobufCodec): Link {
  const ws = (codec ? new Socket(url, [PROTOBUF]) : new Socket(url)) as Socket;
  ws.binaryType = 'arraybuffer';
  let opened = false;
  /** Until `close()`: no handler runs after it. */
  let live = true;
  const send = (command: Command): void => {
    if (ws.readyState !== 1) return;
    try {
      ws.send(codec && ws.protocol === PROTOBUF ? codec.encode(command) : JSON.stringify(command));
    } catch {
      // The close event follows.
    }
  };
  ws.onopen = () => {
    opened = true;
    send(hello);
  };
  ws.onmessage = (ev) => on.frame(ev.data instanceof ArrayBuffer ? new Uint8Array(ev.data) : String(ev.data));
  ws.onclose = (ev) => on.closed(ev.code, ev.reason);
  ws.onerror = () => {}; // a close event follows
  // Only the `ws` package shows the server's pings; a browser answers them unseen.
  ws.on?.('ping', () => live && on.beat());
  return {
    get opened() {
      return opened;
    },
    beats: typeof ws.on === 'function',
    send,
    auth() {},
    close() {
      live = false;
      ws.onopen = ws.onmessage = ws.onclose = null;
      try {
        if (ws.terminate) ws.terminate();
        else ws.close(1000);
      } catch {
        // Already closed.
      }
    },
  };
}
