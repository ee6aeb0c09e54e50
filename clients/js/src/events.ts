/**
 * What a {@link HeraldClient} tells its listeners about itself: its
 * connection's state, the transport it moved to, and the subscriptions the
 * server made or ended on its own. (A topic's messages are events of its
 * {@link Subscription}.)
 * @module
 */
import type { HeraldError } from './errors.js';
import type { HeraldClient } from './client.js';
import type { Transport } from './link.js';
import type { Subscription } from './subscription.js';

/**
 * `connecting` (a socket is opening or `hello` is unanswered), `connected`
 * (`welcome` came), `disconnected` (waiting `delayMs` to reconnect), `closed`
 * (by {@link HeraldClient.close}, or for good: `error` says why).
 */
export type ConnectionState = 'idle' | 'connecting' | 'connected' | 'disconnected' | 'closed';

/** A `state` event. */
export interface StateChange {
  state: ConnectionState;
  /** `connected`: the session id, and whether the previous session was resumed. */
  session?: string;
  resumed?: boolean;
  /** `disconnected`: the close code (1006: none, or the client found the connection dead) and the wait before the next attempt. */
  closeCode?: number;
  delayMs?: number;
  /** `closed` for good: why. */
  error?: HeraldError;
}

/** A subscription the server made on its own: a backend's `POST /v1/subscribe` (`server`), the token's `topics` (`token`). */
export interface ServerSubscribed {
  subscription: Subscription;
  reason: 'server' | 'token' | (string & {});
}

/** The server ended a subscription on its own (a backend's `POST /v1/unsubscribe`). */
export interface ServerUnsubscribed {
  subscription: Subscription;
  topic: string;
  reason: string;
}

/** A `transport` event: the connection now welcomed goes over another transport than the one before. */
export interface TransportChange {
  transport: Transport;
  previous: Transport;
}

/** The events of a {@link HeraldClient}. */
export interface ClientEvents {
  state: StateChange;
  /**
   * The client moved to another transport (`auto`): to HTTP-streaming where
   * the WebSocket could not be opened, back to the WebSocket once it could.
   * Told when the first connection over the new one is welcomed, before its
   * `state` event.
   */
  transport: TransportChange;
  /** Something went wrong that no promise or subscription reports: a refused refresh, a listener that threw. */
  error: HeraldError;
  /**
   * The server subscribed this connection (a backend, or the token's
   * `topics`): listen on the subscription now, its messages follow. Not for
   * a topic the app subscribed already.
   */
  subscribed: ServerSubscribed;
  /** The server ended a subscription (the app's or its own): it is closed. */
  unsubscribed: ServerUnsubscribed;
}
