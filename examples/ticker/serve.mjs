// Serves the ticker page and the SDK it imports (clients/js/dist) on
// loopback: `node examples/ticker/serve.mjs [port]`. scripts/demo.sh runs it.
import { createReadStream, existsSync, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { dirname, extname, join, normalize, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const allowed = ['/examples/ticker/', '/clients/js/dist/'];
const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css' };
const port = Number(process.argv[2] ?? 8000);

createServer((req, res) => {
  let path = normalize(decodeURIComponent(new URL(req.url, 'http://x').pathname));
  if (path === '/') {
    res.writeHead(302, { location: `/examples/ticker/${new URL(req.url, 'http://x').search}` }).end();
    return;
  }
  if (path.endsWith('/')) path += 'index.html';
  const file = join(repo, path);
  if (!allowed.some((p) => path.startsWith(p)) || !existsSync(file) || !statSync(file).isFile()) {
    res.writeHead(404).end('not found\n');
    return;
  }
  res.writeHead(200, { 'content-type': types[extname(file)] ?? 'application/octet-stream' });
  createReadStream(file).pipe(res);
}).listen(port, '127.0.0.1', () => console.log(`ticker page: http://127.0.0.1:${port}/`));
