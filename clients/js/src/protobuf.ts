/**
 * `@herald/client/protobuf`: the codec of `protocol: 'protobuf'`, kept out
 * of the core bundle (an app on JSON does not carry it):
 *
 * ```ts
 * import { HeraldClient } from '@herald/client';
 * import { protobuf } from '@herald/client/protobuf';
 * const client = new HeraldClient({ urls, protocol: 'protobuf', protobuf });
 * ```
 *
 * Hand-written, not generated (protobufjs and its runtime are ~20 KiB
 * gzipped, more than the whole SDK; protobuf-es's runtime ~10): Herald's
 * protocol is a dozen small messages of four scalar types (uint64, string,
 * bool, bytes), nested messages and repeated fields, so a table of their
 * fields (below, as `herald.proto` has them; `test/protobuf.test.mjs`
 * holds the two together) and a varint and length-delimited reader and
 * writer cover it in about a kilobyte. Encoded as prost encodes (fields in
 * number order, a non-`optional` field left out at its default), so that
 * the bytes are the same as the Rust side's; decoded as proto3 reads
 * (unknown fields skipped, a missing field at its default), into the same
 * frames as the JSON protocol's, where `data` fields hold JSON text, parsed
 * here (a binary publication's data stays bytes).
 * @packageDocumentation
 */
import type { Command, DecodedFrame, ProtobufCodec } from './frame.js';
import { openMsg } from './payload.js';

/**
 * Each message's fields, the n-th word being field number n (Herald's
 * messages number their fields 1, 2, 3, … with no gap): `name:type`, where
 * the type is `u` (uint64/uint32), `s` (string), `b` (bool), `j` (bytes of
 * JSON text: any JSON value here), `r` (bytes as they are), or a message's
 * name; a leading `*` is `repeated`, a trailing `?` is `optional` (present
 * only when on the wire, encoded whenever set).
 */
export const SCHEMA: Record<string, string> = {
  ClientCommand: 'hello:Hello? sub:Sub? unsub:Unsub? pub:Pub? ack:Ack? refresh:Refresh? ping:Ping? presence:Presence? history:History? rpc:Rpc?',
  Hello: 'token:s? resume:s? data:j?',
  Sub: 'id:u topic:s since:u? epoch:s? data:j? delta:b?',
  Unsub: 'id:u topic:s',
  Pub: 'id:u topic:s data:j',
  Ack: 'topic:s seq:u epoch:s?',
  Refresh: 'id:u token:s',
  Ping: 'id:u',
  Presence: 'id:u topic:s cursor:s? limit:u?',
  History: 'id:u topic:s since:u? epoch:s? limit:u? reverse:b?',
  Rpc: 'id:u method:s data:j?',
  ServerMessage:
    'welcome:Welcome? ok:Ok? msg:Msg? err:Err? reset:Reset? reconnect:Reconnect? presence_diff:PresenceDiff? unsubscribed:Unsubscribed?',
  Welcome: 'session:s ping_ms:u resumed:b expires:u? reason:s?',
  // `id` 0 (an `ok` the client did not ask for) is absent, as in JSON.
  Ok: 'id:u? topic:s? seq:u? epoch:s? recovered:b? expires:u? position:u? users:u? connections:u? members:*PresenceMember cursor:s? reason:s? publications:*Publication data:j? delta:b?',
  // `delta` and `binary` only when true, as in JSON.
  Msg: 'topic:s seq:u data:r delta:b? binary:b?',
  Err: 'id:u? code:s message:s topic:s?',
  Reset: 'topic:s epoch:s seq:u',
  Reconnect: 'after_ms:u reason:s',
  PresenceDiff: 'topic:s from:u to:u joins:*PresenceMember leaves:*s users:u connections:u',
  Unsubscribed: 'topic:s reason:s',
  Publication: 'seq:u data:r binary:b?',
  PresenceMember: 'user:s info:j?',
};

interface Field {
  name: string;
  type: string;
  optional: boolean;
  repeated: boolean;
}

const fieldsOf = new Map<string, Field[]>();
/** The fields of message `name`, by number - 1. */
function fields(name: string): Field[] {
  let list = fieldsOf.get(name);
  if (!list) {
    list = SCHEMA[name]!.split(' ').map((f) => {
      const [field, type] = f.split(':') as [string, string];
      return { name: field, type: type.replace(/[*?]/g, ''), optional: type.endsWith('?'), repeated: type.startsWith('*') };
    });
    fieldsOf.set(name, list);
  }
  return list;
}

const utf8 = new TextEncoder();
const malformed = (): never => {
  throw new Error('malformed protobuf');
};
const text = new TextDecoder();

// ---------------------------------------------------------------- writing

/** Appends `n` (a non-negative integer, at most 2^53) as a varint. */
function varint(out: number[], n: number): void {
  while (n > 127) {
    out.push((n % 128) | 128);
    n = Math.floor(n / 128);
  }
  out.push(n);
}

function bytesField(out: number[], number: number, bytes: ArrayLike<number>): void {
  varint(out, (number << 3) | 2);
  varint(out, bytes.length);
  for (let i = 0; i < bytes.length; i++) out.push(bytes[i]!);
}

function writeValue(out: number[], number: number, type: string, value: unknown, always: boolean): void {
  if (type === 'u' || type === 'b') {
    const n = Number(value);
    if (n || always) {
      varint(out, number << 3);
      varint(out, n);
    }
    return;
  }
  const bytes =
    type === 's' ? utf8.encode(value as string) : type === 'j' ? utf8.encode(JSON.stringify(value)) : type === 'r' ? (value instanceof Uint8Array ? value : utf8.encode(JSON.stringify(value))) : encodeMessage(type, value as Record<string, unknown>);
  if (bytes.length || always) bytesField(out, number, bytes);
}

/** Message `name` (of {@link SCHEMA}) from an object with its fields' names. */
export function encodeMessage(name: string, value: Record<string, unknown>): Uint8Array {
  const out: number[] = [];
  fields(name).forEach((f, i) => {
    const v = value[f.name];
    if (v === undefined) return;
    if (f.repeated) for (const item of v as unknown[]) writeValue(out, i + 1, f.type, item, true);
    else writeValue(out, i + 1, f.type, v, f.optional);
  });
  return Uint8Array.from(out);
}

// ---------------------------------------------------------------- reading

/** Message `name` (of {@link SCHEMA}) as an object; throws on bytes that are not one. */
export function decodeMessage(name: string, buf: Uint8Array): Record<string, unknown> {
  const list = fields(name);
  const m: Record<string, unknown> = {};
  for (const f of list) {
    if (f.repeated || f.optional) continue;
    m[f.name] = f.type === 'u' ? 0 : f.type === 's' ? '' : f.type === 'b' ? false : new Uint8Array(0);
  }
  let at = 0;
  const read = (): number => {
    let n = 0;
    for (let mul = 1; ; mul *= 128) {
      if (at >= buf.length || mul > 2 ** 63) malformed();
      const b = buf[at++]!;
      n += (b & 127) * mul;
      if (b < 128) return n;
    }
  };
  while (at < buf.length) {
    const key = read();
    const wire = key & 7;
    const f = list[Math.floor(key / 8) - 1];
    let value: unknown;
    if (wire === 0) value = read();
    else if (wire === 2) {
      const length = read();
      if (at + length > buf.length) malformed();
      value = buf.subarray(at, (at += length));
    } else if (wire === 1 || wire === 5) {
      at += wire === 1 ? 8 : 4;
      continue;
    } else malformed();
    if (!f) continue; // a field of a newer server
    if ((wire === 0) !== (f.type === 'u' || f.type === 'b')) malformed();
    const bytes = value as Uint8Array;
    value =
      f.type === 'u' ? value : f.type === 'b' ? value !== 0 : f.type === 's' ? text.decode(bytes) : f.type === 'j' ? JSON.parse(text.decode(bytes)) : f.type === 'r' ? bytes : decodeMessage(f.type, bytes);
    if (f.repeated) ((m[f.name] ??= []) as unknown[]).push(value);
    else m[f.name] = value;
  }
  if (name === 'Publication' && !m.binary) m.data = JSON.parse(text.decode(m.data as Uint8Array));
  return m;
}

/** A frame as one `ServerMessage`: for tests and tools (the client only decodes them). */
export function encodeFrame(frame: { op: string } & Record<string, unknown>): Uint8Array {
  const { op, ...rest } = frame;
  if (op === 'msg' && 'bytes' in rest) {
    const { bytes, ...msg } = rest;
    return encodeMessage('ServerMessage', { msg: { ...msg, data: bytes } });
  }
  return encodeMessage('ServerMessage', { [op]: rest });
}

/** The codec to pass as the client's `protobuf` option. */
export const protobuf: ProtobufCodec = {
  encode(command: Command): Uint8Array {
    const { op, ...rest } = command;
    return encodeMessage('ClientCommand', { [op]: rest });
  },
  decode(bytes: Uint8Array): DecodedFrame | undefined {
    const message = decodeMessage('ServerMessage', bytes);
    // The last case on the wire wins, as in any proto3 reader.
    const op = Object.keys(message).pop();
    if (op === undefined) return undefined; // an op of a newer server
    const frame: Record<string, unknown> = { op, ...(message[op] as Record<string, unknown>) };
    if (op === 'msg') {
      // The data stays bytes: in a subscription with deltas, the base of the next one.
      frame.bytes = frame.data;
      delete frame.data;
    }
    return frame as unknown as DecodedFrame;
  },
  open: openMsg,
};
