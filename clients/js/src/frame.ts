/**
 * The protocol's frames (docs/protocol.md; the messages of
 * `proto/proto/herald/v1/herald.proto`): what the server sends, as a union
 * keyed on `op`, and the commands the client sends. A proto3 field marked
 * `optional` is an optional key here; every other field is always present.
 * `test/protocol.test.mjs` keeps these types in step with the `.proto`.
 */

/** The first frame of every connection: the session, and how the server keeps it alive. */
export interface WelcomeFrame {
  op: 'welcome';
  session: string;
  ping_ms: number;
  resumed: boolean;
  /** When the connection's token expires (Unix seconds). */
  expires?: number;
  /** Why a `resume` was not honoured (`not_found`, `other_user`). */
  reason?: string;
}

/** One member of a topic's presence: a user, with the `info` claim of their token. */
export interface PresenceMember {
  user: string;
  /** The token's `info` claim (a small JSON object), if it had one. */
  info?: Record<string, unknown>;
}

/** One kept message of a topic, in a `history` answer. */
export interface Publication<T = unknown> {
  seq: number;
  /** Any JSON value, as published; a `Uint8Array` where it was published as bytes (`binary`). */
  data: T;
  /** The data was published as bytes (base64 in a JSON frame; a `Uint8Array` once read). */
  binary?: boolean;
}

/**
 * The reply to `sub`, `unsub`, `pub`, `refresh`, `ping`, `presence`,
 * `history` and `rpc`; without `id` (and with `reason`), a subscription the server
 * made on its own: a backend's `POST /v1/subscribe` (`server`) or the
 * token's `topics` claim (`token`).
 */
export interface OkFrame {
  op: 'ok';
  /** Absent only in a subscription the server made (see `reason`). */
  id?: number;
  topic?: string;
  seq?: number;
  epoch?: string;
  /** Only in the reply to a `sub` with `since`. */
  recovered?: boolean;
  /** Only in the reply to `refresh`. */
  expires?: number;
  /** Only in a subscription the server made: `server` or `token`. */
  reason?: string;
  /** `presence`: the topic's presence position the page answers at. */
  position?: number;
  /** `presence`: members (users, each once). */
  users?: number;
  /** `presence`: connections, anonymous ones included. */
  connections?: number;
  /** `presence`: this page's members, ordered by user id (bytewise). */
  members?: PresenceMember[];
  /** `presence`: asks for the next page; absent on the last one. */
  cursor?: string;
  /** `history`: the kept messages asked for. */
  publications?: Publication[];
  /** `rpc`: the backend's reply; `sub`: what the subscribe proxy attached (any JSON value). */
  data?: unknown;
  /** `sub` with `delta`: deltas were granted (the namespace has `delta = true`). */
  delta?: boolean;
}

/**
 * A message of a topic, in one of three forms: `data` (any JSON value, as
 * published; with `binary`, the published bytes in base64), or, in a
 * subscription with deltas, `full` (the data's JSON text, as a string, so
 * that the client holds its exact bytes) or `delta` (a Fossil delta from the
 * previous message's data to this one's, one char per byte).
 */
export interface MsgFrame {
  op: 'msg';
  topic: string;
  seq: number;
  data?: unknown;
  binary?: boolean;
  full?: string;
  delta?: string;
}

/**
 * A `msg` as a protobuf codec hands it over: the data's bytes
 * (JSON text, or with `binary` the published bytes; with `delta`, a Fossil
 * delta against the previous message's data).
 */
export interface MsgBytes {
  op: 'msg';
  topic: string;
  seq: number;
  bytes: Uint8Array;
  delta?: boolean;
  binary?: boolean;
}

/** A frame decoded from a binary message by a protobuf codec. */
export type DecodedFrame = ServerFrame | MsgBytes;

/**
 * The codec `protocol: 'protobuf'` speaks (`protobuf` of
 * `@herald/client/protobuf`): a command to one binary message, one to the
 * server's frame (`undefined` for one the client does not know; throws on
 * bytes that do not decode).
 */
export interface ProtobufCodec {
  encode(command: Command): Uint8Array;
  decode(bytes: Uint8Array): DecodedFrame | undefined;
  /** @internal The full data of a `msg` (`openMsg`: here so that a client without codec or decoder does not carry it). */
  open: Opener;
}

/**
 * What applies the deltas of a subscription with `delta` (`fossil` of
 * `@herald/client/delta`): the target from the base and the delta; throws
 * when the delta does not apply to the base (its checksum).
 */
export interface DeltaDecoder {
  apply(base: Uint8Array, delta: Uint8Array): Uint8Array;
  /** @internal As {@link ProtobufCodec.open}. */
  open: Opener;
}

/**
 * What a subscription with deltas holds to apply the next one:
 * the exact bytes of the data of `seq` (as the server had them: a delta is
 * made from those bytes, not from what JSON.parse made of them).
 */
export interface Base {
  seq: number;
  bytes: Uint8Array;
}

/** A `msg`'s data as the app sees it, and the base the next delta applies to (none: the next one is full). */
export interface Opened {
  data: unknown;
  base: Base | undefined;
}

/** The full data of a `msg` (see `openMsg`). */
export type Opener = (m: MsgFrame | MsgBytes, base: Base | undefined, decoder: DeltaDecoder | undefined) => Opened;

/** A command failed, or the server ended a subscription (no `id` then; `topic` names it). */
export interface ErrFrame {
  op: 'err';
  id?: number;
  code: string;
  message: string;
  topic?: string;
}

/** The subscription lost continuity: resync, then continue after `seq` in `epoch`. */
export interface ResetFrame {
  op: 'reset';
  topic: string;
  epoch: string;
  seq: number;
}

/**
 * What changed in a topic's presence from position `from` to `to` (sent to
 * subscribers of a `join_leave` namespace, coalesced). Above the
 * namespace's `presence_counts_only_above` users, counts only (no `joins`,
 * no `leaves`). A user is named at most once: their state at `to`.
 */
export interface PresenceDiffFrame {
  op: 'presence_diff';
  topic: string;
  from: number;
  to: number;
  joins?: PresenceMember[];
  leaves?: string[];
  users: number;
  connections: number;
}

/** The server ended a subscription on its own (a backend's `POST /v1/unsubscribe`: `reason` `server`). */
export interface UnsubscribedFrame {
  op: 'unsubscribed';
  topic: string;
  reason: string;
}

/** Leave and come back after `after_ms`, resuming the session. */
export interface ReconnectFrame {
  op: 'reconnect';
  after_ms: number;
  reason: string;
}

/** A frame from the server. */
export type ServerFrame =
  | WelcomeFrame
  | OkFrame
  | MsgFrame
  | ErrFrame
  | ResetFrame
  | ReconnectFrame
  | PresenceDiffFrame
  | UnsubscribedFrame;

export interface HelloCommand {
  op: 'hello';
  token?: string;
  resume?: string;
  /** Any JSON value, given to the connect proxy (a `hello` without a token). */
  data?: unknown;
}

export interface SubCommand {
  op: 'sub';
  id: number;
  topic: string;
  since?: number;
  epoch?: string;
  /** Any JSON value, given to the namespace's subscribe proxy. */
  data?: unknown;
  /** Deltas, where the namespace has `delta = true`. */
  delta?: boolean;
}

export interface UnsubCommand {
  op: 'unsub';
  id: number;
  topic: string;
}

export interface PubCommand {
  op: 'pub';
  id: number;
  topic: string;
  data: unknown;
}

export interface AckCommand {
  op: 'ack';
  topic: string;
  seq: number;
  epoch?: string;
}

export interface RefreshCommand {
  op: 'refresh';
  id: number;
  token: string;
}

export interface PingCommand {
  op: 'ping';
  id: number;
}

/** A page of a topic's presence (members after `cursor`, at most `limit`). */
export interface PresenceCommand {
  op: 'presence';
  id: number;
  topic: string;
  cursor?: string;
  limit?: number;
}

/** Kept messages of a topic: after `since` (or below it, `reverse`), at most `limit`. */
export interface HistoryCommand {
  op: 'history';
  id: number;
  topic: string;
  since?: number;
  epoch?: string;
  limit?: number;
  reverse?: boolean;
}

/** A call to the backend's rpc proxy: answered by `ok` with the backend's `data`, or `err` with its code. */
export interface RpcCommand {
  op: 'rpc';
  id: number;
  /** 1..128 bytes of `[A-Za-z0-9_.:/-]`. */
  method: string;
  data?: unknown;
}

/** A command to the server. */
export type Command =
  | HelloCommand
  | SubCommand
  | UnsubCommand
  | PubCommand
  | AckCommand
  | RefreshCommand
  | PingCommand
  | PresenceCommand
  | HistoryCommand
  | RpcCommand;

/**
 * The frame in a text message from the server, or `undefined` for one the
 * client does not know (an op of a newer server) or that lacks a field the
 * client reads (or has it of another type): the client ignores it. Only those
 * fields are checked, not every one: the bundle stays small, and what the
 * client does not read cannot hurt it. (`welcome.ping_ms` is not checked
 * either: the heartbeat takes anything but a positive number for its
 * default.) Throws on text that is not JSON.
 */
export function parseFrame(text: string): ServerFrame | undefined {
  // `any` until checked: what the cases below let through is the frame its `op` says.
  const f = JSON.parse(text);
  switch (f?.op) {
    case 'welcome':
      return typeof f.session === 'string' ? f : undefined;
    case 'ok':
      // Ours (an `id`), or a subscription the server made (`topic` and `reason`).
      return typeof f.id === 'number' || (typeof f.topic === 'string' && typeof f.reason === 'string') ? f : undefined;
    case 'msg':
      return typeof f.topic === 'string' && typeof f.seq === 'number' ? f : undefined;
    case 'reset':
      return typeof f.topic === 'string' && typeof f.epoch === 'string' && typeof f.seq === 'number' ? f : undefined;
    case 'err':
      return typeof f.code === 'string' && typeof f.message === 'string' ? f : undefined;
    case 'reconnect':
      return typeof f.after_ms === 'number' ? f : undefined;
    case 'presence_diff':
      return typeof f.topic === 'string' &&
        typeof f.from === 'number' &&
        typeof f.to === 'number' &&
        (f.joins === undefined || Array.isArray(f.joins)) &&
        (f.leaves === undefined || Array.isArray(f.leaves))
        ? f
        : undefined;
    case 'unsubscribed':
      return typeof f.topic === 'string' ? f : undefined;
  }
  return undefined;
}
