// The browser bundle (one minified ESM file, dist/herald.min.js) and its size
// minified and gzipped, the figure docs/clients.md reports.
import { build } from 'esbuild';
import { readFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';

const out = 'dist/herald.min.js';
await build({ entryPoints: ['src/index.ts'], bundle: true, minify: true, format: 'esm', target: 'es2022', outfile: out, logLevel: 'warning' });
const code = readFileSync(out);
const gzipped = gzipSync(code, { level: 9 }).length;
console.log(`${out}: ${code.length} bytes minified, ${gzipped} bytes minified+gzipped (${(gzipped / 1024).toFixed(1)} KiB)`);
