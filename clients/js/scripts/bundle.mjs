// The browser bundles (minified ESM files in dist/) and their sizes minified
// and gzipped, the figures docs/clients.md reports: the core, each extra
// entry point (`@herald/client/protobuf`, `@herald/client/delta`) by
// itself, and an app's bundle with all three (what the extras add to the
// core, shared code counted once). Over its budget, a bundle fails the
// script (test.sh runs it), so that growth is a decision, not a drift.
import { build } from 'esbuild';
import { readFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';

/**
 * Each bundle, and its most bytes minified and gzipped. The core: 8 KiB,
 * everything included (the WebSocket and the HTTP-streaming fallback,
 * presence, history, the hooks, binary data and what reads a delta
 * subscription's messages; 7.3 KiB before binary data and deltas, 7.8 after).
 * The extras, each by itself: the protobuf codec 2 KiB, the Fossil delta
 * decoder 1.25 KiB (1.8 and 1.0 when set; each carries the code that reads
 * a `msg`'s data, shared in an app's bundle); all three, 10 KiB (9.8).
 */
const BUNDLES = [
  { name: 'core', out: 'dist/herald.min.js', entry: { entryPoints: ['src/index.ts'] }, budget: 8 * 1024 },
  { name: 'protobuf', out: 'dist/herald-protobuf.min.js', entry: { entryPoints: ['src/protobuf.ts'] }, budget: 2048 },
  { name: 'delta', out: 'dist/herald-delta.min.js', entry: { entryPoints: ['src/delta.ts'] }, budget: 1280 },
  {
    name: 'core+protobuf+delta',
    out: 'dist/herald-all.min.js',
    entry: {
      stdin: {
        contents: "export * from './src/index.ts'; export * from './src/protobuf.ts'; export * from './src/delta.ts';",
        resolveDir: '.',
        loader: 'ts',
      },
    },
    budget: 10 * 1024,
  },
];

let over = false;
for (const { name, out, entry, budget } of BUNDLES) {
  await build({ ...entry, bundle: true, minify: true, format: 'esm', target: 'es2022', outfile: out, logLevel: 'warning' });
  const code = readFileSync(out);
  const gzipped = gzipSync(code, { level: 9 }).length;
  console.log(
    `${name} (${out}): ${code.length} bytes minified, ${gzipped} bytes minified+gzipped (${(gzipped / 1024).toFixed(1)} KiB; budget ${budget})`,
  );
  if (gzipped > budget) {
    console.error(`${out}: over its budget of ${budget} bytes minified and gzipped (scripts/bundle.mjs)`);
    over = true;
  }
}
if (over) process.exit(1);
