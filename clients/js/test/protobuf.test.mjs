// The protobuf codec of `@herald/client/protobuf` against bytes made by the
// Rust side: test/fixtures/protobuf.json holds commands and server frames
// encoded by prost with the gateway's own types (proto/tests/sdk_fixtures.rs
// writes it, and fails when it is stale). Every command encodes to prost's
// bytes exactly, every frame decodes to what the client reads (and encodes
// back to the same bytes); the codec's table of fields is herald.proto's;
// and bytes that are not a message are refused, a field or an op of a newer
// server skipped.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { SCHEMA, decodeMessage, encodeFrame, encodeMessage, protobuf } from '../dist/protobuf.js';

const JS_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const REPO = resolve(JS_ROOT, '../..');
const FIXTURES = JSON.parse(readFileSync(join(JS_ROOT, 'test/fixtures/protobuf.json'), 'utf8'));
const PROTO = readFileSync(join(REPO, 'proto/proto/herald/v1/herald.proto'), 'utf8');

const hex = (bytes) => Buffer.from(bytes).toString('hex');
const unhex = (text) => new Uint8Array(Buffer.from(text, 'hex'));

/** A fixture's frame as the SDK has it: `{"$bytes": "<hex>"}` is a Uint8Array. */
function revive(value) {
  if (Array.isArray(value)) return value.map(revive);
  if (value && typeof value === 'object') {
    if (typeof value.$bytes === 'string') return unhex(value.$bytes);
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, revive(v)]));
  }
  return value;
}

test('every command encodes to the bytes prost makes of it', () => {
  assert.ok(FIXTURES.commands.length >= 10);
  for (const { name, frame, hex: bytes } of FIXTURES.commands) {
    assert.equal(hex(protobuf.encode(revive(frame))), bytes, name);
  }
});

test('every server frame prost encodes decodes to the frame the client reads, and encodes back to the same bytes', () => {
  assert.ok(FIXTURES.frames.length >= 10);
  for (const { name, frame, hex: bytes } of FIXTURES.frames) {
    assert.deepEqual(protobuf.decode(unhex(bytes)), revive(frame), name);
    assert.equal(hex(encodeFrame(revive(frame))), bytes, name);
  }
});

test('a msg envelope (seq below 2^21, data below 16 KiB): at most 12 bytes beside the topic and the data, 2 more per flag', () => {
  const topic = 'scores:match-1';
  for (const [seq, size] of [[1, 1], [2 ** 21 - 1, 16 * 1024 - 64]]) {
    const data = new Uint8Array(size).fill(7);
    for (const flags of [{}, { delta: true }, { binary: true }]) {
      const bytes = encodeFrame({ op: 'msg', topic, seq, bytes: data, ...flags });
      const envelope = bytes.length - topic.length - size;
      assert.ok(envelope <= 12 + 2 * Object.keys(flags).length, `seq ${seq}, ${size} bytes, ${JSON.stringify(flags)}: ${envelope}`);
      assert.deepEqual(protobuf.decode(bytes), { op: 'msg', topic, seq, bytes: data, ...flags });
    }
  }
});

test('integers up to 2^53 - 1 survive the varint both ways', () => {
  for (const seq of [0, 1, 127, 128, 2 ** 31, 2 ** 32 + 1, 2 ** 53 - 1]) {
    assert.equal(decodeMessage('Ack', encodeMessage('Ack', { topic: 't', seq })).seq, seq);
  }
});

test('bytes that are not a message throw; a field or an op of a newer server is skipped', () => {
  const msg = encodeFrame({ op: 'msg', topic: 'news', seq: 5, bytes: new TextEncoder().encode('{"a":1}') });
  for (let cut = 1; cut < msg.length; cut++) assert.throws(() => protobuf.decode(msg.subarray(0, cut)), `cut at ${cut}`);
  assert.throws(() => protobuf.decode(Uint8Array.of(0x0f)), 'wire type 7');
  assert.throws(() => protobuf.decode(Uint8Array.of(0x1a, 0x02, 0x10, 0x80)), 'a varint past the end');
  assert.throws(() => protobuf.decode(Uint8Array.of(0x1a, 0x02, 0x0a, 0x05)), 'a string past the end');
  assert.throws(() => protobuf.decode(Uint8Array.of(0x1a, 0x01, 0x12)), 'a length-delimited key with no length');
  // The topic (field 1, a string) as a varint: not the message.
  assert.throws(() => protobuf.decode(Uint8Array.of(0x1a, 0x02, 0x08, 0x01)));
  // Fields 9 (varint), 10 (bytes), 11 (fixed64), 12 (fixed32) inside the msg: skipped.
  const inner = [...msg.subarray(2), 0x48, 0x96, 0x01, 0x52, 0x02, 0x61, 0x62, 0x59, 1, 2, 3, 4, 5, 6, 7, 8, 0x65, 1, 2, 3, 4];
  const newer = Uint8Array.of(0x1a, inner.length, ...inner);
  assert.deepEqual(protobuf.decode(newer), protobuf.decode(msg));
  // A ServerMessage of an op this client does not know (field 20): nothing.
  assert.equal(protobuf.decode(Uint8Array.of(0xa2, 0x01, 0x00)), undefined);
  assert.equal(protobuf.decode(new Uint8Array(0)), undefined);
});

/** herald.proto's messages: name -> fields by number (name, type, label). */
function protoMessages() {
  const messages = new Map();
  for (const [, name, body] of PROTO.matchAll(/^message (\w+) \{([\s\S]*?)^\}/gm)) {
    const fields = [];
    for (const [, label, type, field, number] of body.replace(/\/\/.*$/gm, '').matchAll(/^\s*(optional |repeated )?(\w+)\s+(\w+)\s*=\s*(\d+);/gm)) {
      fields[Number(number) - 1] = { field, type, label: label?.trim() };
    }
    messages.set(name, fields);
  }
  return messages;
}

/**
 * Where the codec's table says more than the proto: `bytes` that are not
 * JSON text (`r`), and fields the JSON protocol leaves out at their default
 * (`?`): an `ok`'s `id` 0, a `msg`'s `delta` and `binary`, a publication's
 * `binary`.
 */
const REFINED = new Set(['Msg.data:r', 'Publication.data:r', 'Ok.id:u?', 'Msg.delta:b?', 'Msg.binary:b?', 'Publication.binary:b?']);

test("the codec's table is herald.proto's messages: every field, by number, with its type and label", () => {
  const proto = protoMessages();
  const CODE = { uint64: 'u', uint32: 'u', string: 's', bool: 'b', bytes: 'j' };
  for (const [name, spec] of Object.entries(SCHEMA)) {
    const fields = proto.get(name);
    assert.ok(fields, `message ${name} in herald.proto`);
    const want = fields.map(({ field, type, label }, i) => {
      assert.ok(field, `${name}: field ${i + 1} in herald.proto (the codec needs numbers without gaps)`);
      // A oneof's cases read as optional messages.
      const oneof = name === 'ClientCommand' || name === 'ServerMessage';
      const base = `${field}:${label === 'repeated' ? '*' : ''}${CODE[type] ?? type}${label === 'optional' || oneof ? '?' : ''}`;
      const refined = [...REFINED].find((r) => r.startsWith(`${name}.${field}:`));
      return refined ? refined.slice(name.length + 1) : base;
    });
    assert.equal(spec, want.join(' '), name);
  }
  // Every message a frame or a command carries is in the table.
  for (const name of ['ClientCommand', 'ServerMessage', 'PresenceMember', 'Publication']) assert.ok(SCHEMA[name], name);
});
