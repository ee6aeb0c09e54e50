/**
 * `@herald/client/delta`: what applies the deltas of a subscription with
 * `delta: true`, kept out of the core bundle (an app without deltas does not
 * carry it):
 *
 * ```ts
 * import { HeraldClient } from '@herald/client';
 * import { fossil } from '@herald/client/delta';
 * const client = new HeraldClient({ urls, delta: fossil });
 * client.subscribe('scores', { delta: true }).on('message', (m) => show(m.data)); // the full data
 * ```
 *
 * Herald makes its deltas in the Fossil delta format (the `fossil-delta`
 * crate; https://fossil-scm.org/home/doc/tip/www/delta_format.wiki). This
 * is its decoder only (apply, never make), a port of `delta_apply` of
 * Fossil's delta.c: the target's size, then copy (`n@offset,`) and insert
 * (`n:bytes`) commands, then the target's checksum (`sum;`), which is
 * checked, as are every size and offset, so that a delta applied to the wrong
 * base is refused rather than turned into wrong data.
 * @packageDocumentation
 */
import type { DeltaDecoder } from './frame.js';
import { openMsg } from './payload.js';

/** The digits of Fossil's integers, base 64, most significant first. */
const DIGITS = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~';
/** Each byte's digit value, -1 for a byte that is not a digit. */
const VALUE = new Int8Array(256).fill(-1);
for (let i = 0; i < 64; i++) VALUE[DIGITS.charCodeAt(i)] = i;

/**
 * Fossil's checksum of `z`: the sum of its bytes taken as big-endian 32-bit
 * words (the last one padded with zeros), modulo 2^32.
 */
export function checksum(z: Uint8Array): number {
  let sum = 0;
  const whole = z.length & ~3;
  for (let i = 0; i < whole; i += 4) sum = (sum + ((z[i]! << 24) | (z[i + 1]! << 16) | (z[i + 2]! << 8) | z[i + 3]!)) | 0;
  let tail = 0;
  for (let i = whole, shift = 24; i < z.length; i++, shift -= 8) tail |= z[i]! << shift;
  return (sum + tail) >>> 0;
}

/** Applies the Fossil delta `delta` to `base`; throws if it is malformed, or its size or checksum is not the target's. */
export function applyDelta(base: Uint8Array, delta: Uint8Array): Uint8Array {
  let at = 0;
  const fail = (why: string): never => {
    throw new Error(`bad delta: ${why}`);
  };
  /** An integer (at least one digit) at `at`; Fossil's are at most 32 bits. */
  const int = (): number => {
    let n = 0;
    const start = at;
    while (at < delta.length && VALUE[delta[at]!]! >= 0) {
      n = n * 64 + VALUE[delta[at++]!]!;
      if (n > 0xffffffff) fail('an integer over 32 bits');
    }
    if (at === start) fail(`no integer at ${start}`);
    return n;
  };
  const size = int();
  if (delta[at++] !== 10) fail('the size is not followed by a newline');
  const out = new Uint8Array(size);
  let total = 0;
  while (at < delta.length) {
    const n = int();
    const op = delta[at++];
    if (op === 64 /* @: copy n bytes of the base from offset */) {
      const offset = int();
      if (delta[at++] !== 44 /* , */) fail('a copy not ended by a comma');
      if (total + n > size) fail('a copy past the size');
      if (offset + n > base.length) fail('a copy past the end of the base');
      out.set(base.subarray(offset, offset + n), total);
      total += n;
    } else if (op === 58 /* : insert n bytes */) {
      if (total + n > size) fail('an insert past the size');
      if (at + n > delta.length) fail('an insert past the end of the delta');
      out.set(delta.subarray(at, at + n), total);
      at += n;
      total += n;
    } else if (op === 59 /* ; the checksum */) {
      if (total !== size) fail(`${total} bytes made of ${size}`);
      if (n !== checksum(out)) fail('the checksum does not match: not the base it was made from');
      return out;
    } else {
      fail(`unknown command at ${at - 1}`);
    }
  }
  return fail('no checksum at the end');
}

/** The decoder to pass as the client's `delta` option. */
export const fossil: DeltaDecoder = { apply: applyDelta, open: openMsg };
