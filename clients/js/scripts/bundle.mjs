// The browser bundles (minified ESM, split into chunks, in dist/bundle/) and
// their sizes minified and gzipped, the figures docs/clients.md reports: the
// core, each extra entry point (`@herald/client/protobuf`,
// `@herald/client/delta`, `@herald/client/presence`) by itself, and an app's
// bundle with all four (what the extras add to the core, shared code counted
// once). Built as an app's bundler builds the SDK (esbuild, `splitting`):
// what a page loads at start (an entry and the chunks it imports statically)
// is counted apart from what is loaded only when needed (the HTTP-streaming
// link, a dynamic `import()` the first time the client falls back). Over its
// budget, a bundle fails the script (test.sh runs it), so that growth is a
// decision, not a drift.
import { build } from 'esbuild';
import { readFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';

/**
 * Each bundle, and its most bytes minified and gzipped, at start (`budget`)
 * and loaded later (`lazyBudget`). The core at start: 6 KiB (5.8: the
 * WebSocket, the fallback's rule, one presence page, history, the hooks,
 * binary data and what reads a delta subscription's messages; 5.6 KiB before
 * the client's calls and subscriptions were classes of their own; 6.7 KiB when
 * presence's merge rule and `Presence` were in it, its budget then 6.75 KiB;
 * 7.8 KiB when the HTTP-streaming link was too). The HTTP-streaming link,
 * loaded when the client first falls back (or is told to use it): 2 KiB
 * (1.5). The extras, each by itself: the protobuf codec 2 KiB, the Fossil
 * delta decoder 1.25 KiB, presence 1.75 KiB (1.8, 1.0 and 1.5 when set; the
 * codec and the decoder each carry the code that reads a `msg`'s data,
 * presence the event emitter, shared in an app's bundle); all four at start,
 * 9 KiB (9.0; 8.8 before those classes).
 */
const BUNDLES = [
  { name: 'core', entries: ['src/index.ts'], budget: 6 * 1024, lazyBudget: 2048 },
  { name: 'protobuf', entries: ['src/protobuf.ts'], budget: 2048, lazyBudget: 0 },
  { name: 'delta', entries: ['src/delta.ts'], budget: 1280, lazyBudget: 0 },
  { name: 'presence', entries: ['src/presence.ts'], budget: 1792, lazyBudget: 0 },
  {
    name: 'core+protobuf+delta+presence',
    entries: ['herald-all'],
    // One module that re-exports the four, as an app that imports them all.
    plugins: [
      {
        name: 'herald-all',
        setup(b) {
          b.onResolve({ filter: /^herald-all$/ }, () => ({ path: 'herald-all', namespace: 'herald-all' }));
          b.onLoad({ filter: /.*/, namespace: 'herald-all' }, () => ({
            contents: [
              "export * from './src/index.ts';",
              "export * from './src/protobuf.ts';",
              "export * from './src/delta.ts';",
              "export * from './src/presence.ts';",
            ].join(' '),
            resolveDir: '.',
            loader: 'ts',
          }));
        },
      },
    ],
    budget: 9 * 1024,
    lazyBudget: 2048,
  },
];

const gzipped = (file) => gzipSync(readFileSync(file), { level: 9 }).length;
const kib = (n) => `${n} bytes (${(n / 1024).toFixed(1)} KiB)`;

let over = false;
for (const { name, entries, plugins = [], budget, lazyBudget } of BUNDLES) {
  const outdir = `dist/bundle/${name}`;
  const { metafile } = await build({
    entryPoints: entries,
    plugins,
    bundle: true,
    splitting: true,
    minify: true,
    format: 'esm',
    target: 'es2022',
    outdir,
    entryNames: 'herald',
    chunkNames: 'chunk-[hash]',
    metafile: true,
    logLevel: 'warning',
  });
  const outputs = metafile.outputs;
  const entry = Object.keys(outputs).find((file) => outputs[file].entryPoint);
  // At start: the entry and what it imports statically, transitively.
  const initial = new Set();
  const visit = (file) => {
    if (initial.has(file)) return;
    initial.add(file);
    for (const i of outputs[file].imports) if (i.kind === 'import-statement') visit(i.path);
  };
  visit(entry);
  const lazy = Object.keys(outputs).filter((file) => !initial.has(file) && file.endsWith('.js'));
  // Each file gzipped by itself, as a server sends it.
  const size = (files) => files.reduce((sum, file) => sum + gzipped(file), 0);
  const minified = (files) => files.reduce((sum, file) => sum + outputs[file].bytes, 0);
  const atStart = size([...initial]);
  const later = size(lazy);
  console.log(
    `${name} (${outdir}): at start ${minified([...initial])} bytes minified, ${kib(atStart)} minified+gzipped, budget ${budget}` +
      `; loaded when needed ${minified(lazy)} bytes minified, ${kib(later)} minified+gzipped, budget ${lazyBudget}`,
  );
  if (atStart > budget || later > lazyBudget) {
    console.error(`${outdir}: over its budget (scripts/bundle.mjs)`);
    over = true;
  }
}
if (over) process.exit(1);
