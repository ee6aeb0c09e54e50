// The reconnect backoff: exponential with full jitter, the same waits as
// Herald's Rust `Backoff` (backoff/src/lib.rs), whose tests these mirror.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { backoff } from '../dist/backoff.js';

/** `backoff(...)` with `Math.random()` returning `unit`. */
function at(unit, ...args) {
  const random = Math.random;
  Math.random = () => unit;
  try {
    return backoff(...args);
  } finally {
    Math.random = random;
  }
}

test('ceilings double up to the cap and stay there, however many attempts failed', () => {
  const nearlyOne = 1 - Number.EPSILON;
  const ceilings = [0, 1, 2, 3, 4, 5, 6, 7, 8].map((n) => at(nearlyOne, 100, 5000, n) + 1);
  assert.deepEqual(ceilings, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
  assert.equal(at(nearlyOne, 100, 5000, 5000) + 1, 5000, 'no overflow past 2^1024');
});

test('a wait spans zero to the ceiling', () => {
  assert.equal(at(0, 100, 5000, 3), 0);
  assert.equal(at(0.5, 100, 5000, 3), 400);
  for (let n = 0; n < 40; n++) {
    const wait = backoff(100, 5000, n);
    assert.ok(wait >= 0 && wait < Math.min(5000, 100 * 2 ** n), `attempt ${n}: ${wait}`);
  }
});
