// The browser bundle (one minified ESM file, dist/herald.min.js) and its size
// minified and gzipped, the figure docs/clients.md reports; over the budget,
// it fails (test.sh runs it), so that growth is a decision, not a drift.
import { build } from 'esbuild';
import { readFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';

/**
 * Most bytes minified and gzipped: 8 KiB, everything included (the
 * WebSocket and the HTTP-streaming fallback, presence, history, the hooks;
 * 7.3 KiB when it was set).
 */
const BUDGET = 8 * 1024;

const out = 'dist/herald.min.js';
await build({ entryPoints: ['src/index.ts'], bundle: true, minify: true, format: 'esm', target: 'es2022', outfile: out, logLevel: 'warning' });
const code = readFileSync(out);
const gzipped = gzipSync(code, { level: 9 }).length;
console.log(`${out}: ${code.length} bytes minified, ${gzipped} bytes minified+gzipped (${(gzipped / 1024).toFixed(1)} KiB; budget ${BUDGET})`);
if (gzipped > BUDGET) {
  console.error(`${out}: over its budget of ${BUDGET} bytes minified and gzipped (scripts/bundle.mjs)`);
  process.exit(1);
}
