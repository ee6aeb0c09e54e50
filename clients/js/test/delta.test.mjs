// The Fossil delta decoder of `@herald/client/delta` against deltas made by
// the `fossil-delta` crate, the one the gateway makes them with
// (test/fixtures/fossil.json, written by proto/tests/sdk_fixtures.rs):
// each applies to its source and gives its target; applied to any other
// base, or cut or garbled, it is refused (size, bounds, checksum), never
// turned into other data. Then how a message's data is made from its form
// (`openMsg`, what the client runs on each `msg`): JSON's `data`, `full`
// and `delta` (one char per byte), protobuf's bytes, a chain of updates.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { applyDelta, checksum, fossil } from '../dist/delta.js';
import { openMsg } from '../dist/payload.js';

const JS_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const { vectors } = JSON.parse(readFileSync(join(JS_ROOT, 'test/fixtures/fossil.json'), 'utf8'));
const unhex = (text) => new Uint8Array(Buffer.from(text, 'hex'));
const VECTORS = vectors.map((v) => ({ name: v.name, source: unhex(v.source), target: unhex(v.target), delta: unhex(v.delta) }));
/** A delta's bytes as a JSON delta message carries them: one char per byte. */
const latin1 = (bytes) => String.fromCharCode(...bytes);
const utf8 = (bytes) => new TextDecoder().decode(bytes);

test("every delta the crate made applies to its source and gives its target", () => {
  assert.ok(VECTORS.length >= 10);
  for (const { name, source, target, delta } of VECTORS) assert.deepEqual(applyDelta(source, delta), target, name);
});

test('the checksum is Fossil\'s: big-endian 32-bit words, the last one padded with zeros, summed modulo 2^32', () => {
  assert.equal(checksum(new Uint8Array(0)), 0);
  assert.equal(checksum(Uint8Array.of(1)), 0x01000000);
  assert.equal(checksum(Uint8Array.of(1, 2, 3)), 0x01020300);
  assert.equal(checksum(Uint8Array.of(0xff, 0xff, 0xff, 0xff, 0, 0, 0, 2)), 1);
  assert.equal(checksum(Uint8Array.of(0x80, 0, 0, 0, 0x80)), 0);
});

test('a delta applied to another base than its own is refused, never turned into other data', () => {
  let refused = 0;
  for (const { name, source, delta } of VECTORS) {
    if (source.length === 0) continue;
    // Each byte of the source changed in turn (a sample): wherever the delta copies it, the checksum no longer holds.
    for (let i = 0; i < source.length; i += Math.max(1, Math.floor(source.length / 64))) {
      const other = source.slice();
      other[i] ^= 0x20;
      let out;
      try {
        out = applyDelta(other, delta);
      } catch (e) {
        assert.match(String(e), /bad delta/, name);
        refused++;
        continue;
      }
      // Not refused: the delta does not copy that byte, and gives its target all the same.
      assert.deepEqual(out, applyDelta(source, delta), `${name}: byte ${i}`);
    }
    // A shorter base: refused, unless the delta copies nothing from it (all inserts: the target all the same).
    try {
      assert.deepEqual(applyDelta(source.subarray(1), delta), applyDelta(source, delta), `${name}: a shorter base`);
    } catch (e) {
      assert.match(String(e), /bad delta/, name);
    }
  }
  assert.ok(refused > 100, `refused ${refused}`);
  // A scoreboard delta applied to another scoreboard: refused.
  const [a, b] = VECTORS;
  assert.throws(() => applyDelta(b.source, a.delta), /bad delta/);
});

test('a cut or garbled delta is refused', () => {
  const { source, delta } = VECTORS[0];
  for (let cut = 0; cut < delta.length; cut++) assert.throws(() => applyDelta(source, delta.subarray(0, cut)), /bad delta/, `cut at ${cut}`);
  const garbled = [
    'x\n1;',
    '5',
    '5x',
    '5\n5#0,0;',
    '5\n6:abcdef0;',
    '5\n3:ab',
    '2\n3@0,0;',
    'zzzzzzz\n0;',
    '3\n3@0;',
  ];
  for (const text of garbled) assert.throws(() => applyDelta(source, new TextEncoder().encode(text)), /bad delta/, JSON.stringify(text));
  // The size said is not the size made.
  const bigger = new TextEncoder().encode(`${'8'}\n` + utf8(delta).slice(utf8(delta).indexOf('\n') + 1));
  assert.throws(() => applyDelta(source, bigger), /bad delta/);
});

test('JSON: `data` as it is (bytes in base64 read back, no base kept), `full` and `delta` made into the data and kept as the base', () => {
  assert.deepEqual(openMsg({ op: 'msg', topic: 't', seq: 1, data: { a: 1 } }, undefined, fossil), { data: { a: 1 }, base: undefined });
  const bytes = openMsg({ op: 'msg', topic: 't', seq: 2, data: 'AP/DKA==', binary: true }, undefined, fossil);
  assert.deepEqual(bytes, { data: Uint8Array.of(0x00, 0xff, 0xc3, 0x28), base: undefined });
  // A chain of updates: the first full, each next a delta against the one before.
  const chain = VECTORS.filter((v) => v.name.startsWith('scoreboard update'));
  assert.ok(chain.length >= 5);
  let opened = openMsg({ op: 'msg', topic: 't', seq: 10, full: utf8(chain[0].source) }, undefined, fossil);
  assert.deepEqual(opened.data, JSON.parse(utf8(chain[0].source)));
  chain.forEach(({ target, delta }, i) => {
    assert.deepEqual(opened.base.bytes, chain[i].source, `the base before update ${i + 1}`);
    opened = openMsg({ op: 'msg', topic: 't', seq: 11 + i, delta: latin1(delta) }, opened.base, fossil);
    assert.deepEqual(opened.data, JSON.parse(utf8(target)));
    assert.deepEqual(opened.base, { seq: 11 + i, bytes: target });
  });
  // A full text with characters beyond ASCII: the base is its UTF-8 bytes.
  const text = '{"name":"Zoë ✓"}';
  assert.deepEqual(openMsg({ op: 'msg', topic: 't', seq: 3, full: text }, undefined, fossil).base.bytes, new TextEncoder().encode(text));
});

test('a delta without the base of the seq before it is refused, as is one with no decoder', () => {
  const [v] = VECTORS;
  const base = { seq: 4, bytes: v.source };
  const delta = latin1(v.delta);
  assert.deepEqual(openMsg({ op: 'msg', topic: 't', seq: 5, delta }, base, fossil).base.bytes, v.target);
  assert.throws(() => openMsg({ op: 'msg', topic: 't', seq: 6, delta }, base, fossil), /no base/, 'a seq skipped');
  assert.throws(() => openMsg({ op: 'msg', topic: 't', seq: 5, delta }, undefined, fossil), /no base/, 'no base');
  assert.throws(() => openMsg({ op: 'msg', topic: 't', seq: 5, delta }, base, undefined), /no base/, 'no decoder');
  // A char beyond U+00FF is not a byte: the delta cannot hold.
  assert.throws(() => openMsg({ op: 'msg', topic: 't', seq: 5, delta: delta.replace('@', 'Ā') }, base, fossil), /bad delta/);
});

test('protobuf: the bytes are the data (JSON text, or binary as they are) and the base; a delta applies to it, binary too', () => {
  const json = new TextEncoder().encode('{"a":[1,2]}');
  assert.deepEqual(openMsg({ op: 'msg', topic: 't', seq: 1, bytes: json }, undefined, fossil), { data: { a: [1, 2] }, base: { seq: 1, bytes: json } });
  const bin = VECTORS.find((v) => v.name.startsWith('binary, a byte'));
  const first = openMsg({ op: 'msg', topic: 't', seq: 7, bytes: bin.source, binary: true }, undefined, fossil);
  assert.deepEqual(first.data, bin.source);
  const next = openMsg({ op: 'msg', topic: 't', seq: 8, bytes: bin.delta, binary: true, delta: true }, first.base, fossil);
  assert.deepEqual(next, { data: bin.target, base: { seq: 8, bytes: bin.target } });
  assert.throws(() => openMsg({ op: 'msg', topic: 't', seq: 9, bytes: bin.delta, binary: true, delta: true }, next.base, fossil), /bad delta/);
});
