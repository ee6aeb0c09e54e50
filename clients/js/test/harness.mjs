// What the JS tests share: the real `herald` binary and `redis-server` on
// free loopback ports, HS256 tokens minted with node:crypto, a static server
// for the SDK and the pages, headless Chromium through playwright-core, and
// waits that end on an event or a deadline (never a fixed sleep).
//
// Every test has a bound of its own (`test` below, not node's
// `--test-timeout`, which in Node 20 bounds a whole file and kills it with
// the test in progress, skipping its cleanup). A test that overruns fails,
// says what it was waiting for, keeps its pods' logs, and is cleaned up;
// the next test runs. Every process a test starts (herald, redis-server) is
// ended by its cleanup, by this process's exit or a signal to it, and, if
// this process is killed outright, by the kernel (`setpriv --pdeathsig`).
// Chromium, driven through a pipe, exits when the pipe closes.

import { spawn, spawnSync } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { EventEmitter, once } from 'node:events';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { basename, dirname, extname, join, normalize, resolve } from 'node:path';
import { test as nodeTest } from 'node:test';
import { fileURLToPath } from 'node:url';

export const JS_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const REPO = resolve(JS_ROOT, '../..');
/** The binary under test: HERALD_BIN, else the debug build in CARGO_TARGET_DIR (or target/). */
export const HERALD_BIN =
  process.env.HERALD_BIN ?? join(process.env.CARGO_TARGET_DIR ?? join(REPO, 'target'), 'debug', 'herald');
/** Longest a process may take to start, a browser to launch, a page to load. */
export const START_WAIT = 20_000;
/** Longest one step of a story may take (a message to arrive, a client to come back). */
export const STEP = 15_000;
/** Longest one test may take, unless it says otherwise: well past the sum of its steps on a loaded machine. */
export const TEST_TIMEOUT = 90_000;
/** A wait that lasts this long is said in the output, with what it waits for. */
const SLOW = 5_000;
/** Where a failed test's pods' logs are kept: under the cargo target directory, out of the work tree. */
export const LOGS = join(process.env.CARGO_TARGET_DIR ?? join(REPO, 'target'), 'herald-js', 'logs');

// ------------------------------------------------------------------ tests

const FAILED = Symbol('failed');
/** What the test in progress waits for now, and since when: said when it times out. */
const waiting = { what: 'nothing yet', since: Date.now() };

/** Marks the start of a wait for `what`; returns the function that ends it. Says so if it lasts past {@link SLOW}. */
export function waitingFor(what, bound) {
  const before = { ...waiting };
  Object.assign(waiting, { what, since: Date.now() });
  const slow = setTimeout(() => console.log(`# slow: still waiting for ${what} after ${SLOW} ms (bound: ${bound} ms)`), SLOW);
  slow.unref();
  return () => {
    clearTimeout(slow);
    Object.assign(waiting, before);
  };
}

/** Resolves as `promise` does, or rejects after `ms` naming `what`: for a step with no bound of its own. */
export async function bounded(what, ms, promise) {
  const done = waitingFor(what, ms);
  let timer;
  try {
    return await Promise.race([
      promise,
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
    done();
  }
}

/**
 * node:test's `test`, bounded by `timeout` (each test its own: one that
 * overruns fails, its cleanup runs, the file goes on).
 */
export function test(name, fn, { timeout = TEST_TIMEOUT, skip } = {}) {
  return nodeTest(name, { timeout, skip }, async (t) => {
    try {
      await fn(t);
    } catch (e) {
      t[FAILED] = true;
      throw e;
    }
  });
}

/** Resolves once `poll()` is truthy (its value), or rejects after `ms`: for what has no event (a port that starts listening). */
export async function poll(what, ms, fn, every = 20) {
  const done = waitingFor(what, ms);
  try {
    const deadline = Date.now() + ms;
    for (;;) {
      const value = await fn().catch(() => undefined);
      if (value) return value;
      if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
      await new Promise((r) => setTimeout(r, every));
    }
  } finally {
    done();
  }
}

/** A loopback port nobody listens on right now (the caller's process binds it itself, and retries if it was taken). */
export async function freePort() {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address();
  server.close();
  await once(server, 'close');
  return port;
}

/** A temp directory removed by `cleanup`. */
export function tempDir(cleanup, name) {
  const dir = mkdtempSync(join(tmpdir(), `herald-js-${name}-`));
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * Things to undo when test `t` ends, last first, whether it passed, failed
 * or timed out. `list.logs` is the directory its pods write their logs to:
 * removed if it passed, kept (and named) if not.
 */
export function cleanups(t) {
  const list = [];
  const slug = t.name.replace(/[^A-Za-z0-9]+/g, '-').slice(0, 80);
  list.logs = join(LOGS, basename(process.argv[1] ?? 'test', '.mjs'), slug);
  rmSync(list.logs, { recursive: true, force: true });
  t.after(async () => {
    const timedOut = t.signal.aborted;
    if (timedOut) console.log(`# ${t.name}: timed out while waiting for ${waiting.what} (for ${Date.now() - waiting.since} ms)`);
    for (const fn of list.reverse()) {
      try {
        await fn();
      } catch (e) {
        console.error('cleanup:', e);
      }
    }
    if (timedOut || t[FAILED]) {
      if (existsSync(list.logs)) console.log(`# ${t.name}: the pods' logs are in ${list.logs}`);
    } else {
      rmSync(list.logs, { recursive: true, force: true });
    }
  });
  return list;
}

// ------------------------------------------------------------------ processes

/** The processes started here and not yet exited: killed when this process exits or is told to stop. */
const children = new Set();
/** Whether `setpriv --pdeathsig` (util-linux) is here: the kernel then kills a child if this process is killed outright. */
const SETPRIV = spawnSync('setpriv', ['--pdeathsig', 'KILL', '--', 'true'], { stdio: 'ignore' }).status === 0;
if (!SETPRIV) console.log('# no `setpriv --pdeathsig` (util-linux): a test process killed outright may leave its processes running');

/** `spawn`, for a process that must not outlive this one (see the top of this file). */
export function spawnOwned(program, args, options) {
  const child = SETPRIV
    ? spawn('setpriv', ['--pdeathsig', 'KILL', '--', program, ...args], options)
    : spawn(program, args, options);
  children.add(child);
  child.on('exit', () => children.delete(child));
  return child;
}

function killChildren() {
  for (const child of children) {
    try {
      child.kill('SIGKILL');
    } catch {
      // Gone already.
    }
  }
}
process.on('exit', killChildren);
for (const [signal, number] of [['SIGINT', 2], ['SIGTERM', 15], ['SIGHUP', 1]]) {
  process.on(signal, () => {
    killChildren();
    process.exit(128 + number);
  });
}

// ------------------------------------------------------------------ redis

async function redisPing(port) {
  const socket = net.connect(port, '127.0.0.1');
  try {
    await once(socket, 'connect');
    socket.write('PING\r\n');
    const [data] = await once(socket, 'data');
    return String(data).startsWith('+PONG');
  } finally {
    socket.destroy();
  }
}

/** A `redis-server` on a free loopback port, nothing saved; `restartEmpty()` brings it back on the same port with no data. */
export async function startRedis(cleanup) {
  const port = await freePort();
  const dir = tempDir(cleanup, 'redis');
  let child;
  const start = async () => {
    child = spawnOwned(
      'redis-server',
      ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--protected-mode', 'no', '--dir', dir],
      { stdio: 'ignore' },
    );
    await poll('redis-server answers PING', START_WAIT, () => redisPing(port));
  };
  const stop = async () => {
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await once(child, 'exit');
    }
  };
  await start();
  cleanup.push(stop);
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    get pid() {
      return child.pid;
    },
    async restartEmpty() {
      await stop();
      await start();
    },
  };
}

// ------------------------------------------------------------------ herald

/** TOML for `settings`: `{ top: value, section: { key: value } }`, one level of sections (dotted names allowed). */
function toml(settings) {
  // A string or an array of strings is JSON's spelling in TOML too.
  const value = (v) => (typeof v === 'string' || Array.isArray(v) ? JSON.stringify(v) : String(v));
  const lines = [];
  for (const [k, v] of Object.entries(settings)) if (typeof v !== 'object') lines.push(`${k} = ${value(v)}`);
  for (const [k, v] of Object.entries(settings)) {
    if (typeof v !== 'object') continue;
    lines.push(`[${k}]`);
    for (const [kk, vv] of Object.entries(v)) lines.push(`${kk} = ${value(vv)}`);
  }
  return lines.join('\n') + '\n';
}

/** The test config: the default namespace open to anyone with a long history, `chat` open to client publishes. */
export function config(extra = {}) {
  return {
    'namespaces.default': { history_size: 2000, history_ttl: '5m', subscribe: 'anyone', publish: 'nobody' },
    'namespaces.chat': { history_size: 100, subscribe: 'anyone', publish: 'authenticated' },
    log: { level: 'info' },
    ...extra,
  };
}

/**
 * The real `herald` with `settings` (see {@link config}) on a free port
 * (or `port`), ready once `/readyz` says 200. `kill9()`, `sigterm()`,
 * `exited` (a promise of the exit code) and `log()` for a failure; its log
 * is written to `cleanup.logs` when the test ends.
 */
export async function startHerald(cleanup, settings = config(), { port } = {}) {
  if (!existsSync(HERALD_BIN)) throw new Error(`no herald binary at ${HERALD_BIN}: cargo build -p gateway --bin herald`);
  const dir = tempDir(cleanup, 'herald');
  const file = join(dir, 'herald.toml');
  writeFileSync(file, toml(settings));
  let lastLog = '';
  for (let attempt = 0; attempt < 5; attempt++) {
    const listen = port ?? (await freePort());
    const grpc = await freePort();
    const logFile = join(cleanup.logs ?? dir, `herald-${listen}-${attempt}.log`);
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('HERALD_')));
    const child = spawnOwned(HERALD_BIN, ['--config', file], {
      env: { ...env, HERALD_LISTEN: `127.0.0.1:${listen}`, HERALD_GRPC__LISTEN: `127.0.0.1:${grpc}`, NO_COLOR: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let log = '';
    child.stdout.on('data', (d) => (log += d));
    child.stderr.on('data', (d) => (log += d));
    const exited = new Promise((r) => child.on('exit', (code, signal) => r(code ?? signal)));
    let gone = false;
    exited.then(() => (gone = true));
    const http = `http://127.0.0.1:${listen}`;
    const ready = await poll(`herald /readyz on ${listen}`, START_WAIT, async () => {
      if (gone) return 'exited';
      const res = await fetch(`${http}/readyz`, { signal: AbortSignal.timeout(STEP) });
      return res.status === 200 ? 'ready' : undefined;
    });
    if (ready === 'ready') {
      const pod = {
        port: listen,
        pid: child.pid,
        http,
        ws: `ws://127.0.0.1:${listen}/ws`,
        exited,
        log: () => log,
        kill9() {
          child.kill('SIGKILL');
          return exited;
        },
        sigterm() {
          child.kill('SIGTERM');
          return exited;
        },
      };
      cleanup.push(async () => {
        mkdirSync(dirname(logFile), { recursive: true });
        writeFileSync(logFile, log);
        if (!gone) {
          child.kill('SIGKILL');
          await exited;
        }
      });
      return pod;
    }
    lastLog = log;
    if (!log.includes('binding') || port !== undefined) break;
  }
  throw new Error(`herald did not start:\n${lastLog}`);
}

/** A pod of a cluster sharing `redis`, sessions flushed every 50 ms. */
export function pod(cleanup, redis, extra = {}, options) {
  return startHerald(
    cleanup,
    config({ broker: 'redis', redis: { url: redis.url }, session: { flush_interval: '50ms' }, ...extra }),
    options,
  );
}

/** `POST /v1/publish`: `{seq, epoch}`; bounded by {@link STEP}. */
export async function publish(pod, topic, data) {
  const done = waitingFor(`a publish to ${topic} on ${pod.http}`, STEP);
  try {
    const res = await fetch(`${pod.http}/v1/publish`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ topic, data }),
      signal: AbortSignal.timeout(STEP),
    });
    const body = await res.json();
    if (res.status !== 200) throw new Error(`publish: ${res.status} ${JSON.stringify(body)}`);
    return body;
  } finally {
    done();
  }
}

/**
 * The application's backend behind Herald's proxies (docs/hooks.md), as a
 * plain node:http server on a loopback port: `routes` maps a path to a
 * handler of the request's JSON body (and its headers) returning `[status,
 * body]` (or a promise of it). Every request is kept in `requests` (with
 * `path`), in order. Closed at cleanup.
 */
export async function startBackend(cleanup, routes) {
  const requests = new Events();
  const server = createServer(async (req, res) => {
    let text = '';
    for await (const chunk of req) text += chunk;
    let body;
    try {
      body = JSON.parse(text);
    } catch {
      res.writeHead(400).end();
      return;
    }
    const path = new URL(req.url, 'http://x').pathname;
    requests.push({ path, body, headers: req.headers });
    const route = routes[path];
    const [status, reply] = route ? await route(body, req.headers) : [404, {}];
    res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(reply));
  });
  server.keepAliveTimeout = 60_000;
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  cleanup.push(() => {
    server.closeAllConnections();
    return new Promise((r) => server.close(r));
  });
  return { url: `http://127.0.0.1:${server.address().port}`, requests };
}

// ------------------------------------------------------------------ tokens

const b64url = (x) => Buffer.from(typeof x === 'string' ? x : JSON.stringify(x)).toString('base64url');

/** An HS256 JWT over `secret` with `claims`. */
export function hs256(secret, claims) {
  const head = `${b64url({ alg: 'HS256', typ: 'JWT' })}.${b64url(claims)}`;
  return `${head}.${createHmac('sha256', secret).update(head).digest('base64url')}`;
}

// ------------------------------------------------------------------ events

/** Events as they come, and waits on them that end at an event or a deadline. */
export class Events {
  list = [];
  #bus = new EventEmitter();

  push(event) {
    this.list.push(event);
    this.#bus.emit('event');
  }

  /** The events `pred` accepts so far. */
  filter(pred) {
    return this.list.filter(pred);
  }

  /** Resolves with the first event `pred` accepts (looking at past ones too), or rejects after `ms`. */
  wait(what, pred, ms = STEP) {
    return this.until(what, () => this.list.find(pred), ms);
  }

  /** Resolves with `check()` once truthy (checked at each event), or rejects after `ms`. */
  until(what, check, ms = STEP) {
    const waited = waitingFor(what, ms);
    return new Promise((resolve, reject) => {
      const look = () => {
        let value;
        try {
          value = check();
        } catch (e) {
          done();
          reject(e);
          return;
        }
        if (value) {
          done();
          resolve(value);
        }
      };
      const timer = setTimeout(() => {
        done();
        reject(new Error(`${what}: not within ${ms} ms; last events: ${JSON.stringify(this.list.slice(-8))}`));
      }, ms);
      const done = () => {
        clearTimeout(timer);
        this.#bus.off('event', look);
        waited();
      };
      this.#bus.on('event', look);
      look();
    });
  }
}

// ------------------------------------------------------------------ static files and the browser

const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.css': 'text/css', '.json': 'application/json' };

/** Serves `dir` on a loopback port: the SDK's dist/ and the pages. */
export async function serveStatic(cleanup, dir) {
  const server = createServer((req, res) => {
    const path = normalize(decodeURIComponent(new URL(req.url, 'http://x').pathname));
    const file = join(dir, path.endsWith('/') ? `${path}index.html` : path);
    if (!file.startsWith(dir) || !existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'content-type': TYPES[extname(file)] ?? 'application/octet-stream' });
    res.end(readFileSync(file));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  cleanup.push(() => new Promise((r) => server.close(r)));
  return `http://127.0.0.1:${server.address().port}`;
}

/** Debian's Chromium, headless, with a fresh profile. */
export const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--no-first-run',
  '--disable-quic',
  '--disable-sync',
];

/** A browser context of its own (closed at cleanup). */
export async function browser(cleanup) {
  const { chromium } = await import('playwright-core');
  const profile = tempDir(cleanup, 'chromium');
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: FLAGS,
    timeout: START_WAIT,
  });
  cleanup.push(() => bounded('Chromium to close', STEP, context.close()));
  return context;
}

/**
 * A page with the SDK loaded (`window.herald`) and `window.follow(...)`,
 * which starts a client on one topic and reports each event to `events`.
 * `tokens()`, if given, is the page's `getToken`. `origin`: where the page
 * is loaded from (a server of the test's that serves `JS_ROOT`), instead of
 * a static server of its own.
 */
export async function sdkPage(cleanup, events, { tokens, cookie, origin } = {}) {
  const context = await browser(cleanup);
  // `origin`: where the page is served from, when the test serves it itself (the pods' origin, say).
  origin ??= await serveStatic(cleanup, JS_ROOT);
  const page = context.pages()[0] ?? (await context.newPage());
  page.on('pageerror', (e) => events.push({ t: 'pageerror', message: String(e) }));
  await page.exposeFunction('report', (event) => events.push(event));
  if (tokens) await page.exposeFunction('nodeToken', () => tokens());
  await page.goto(`${origin}/test/page.html`, { timeout: START_WAIT });
  // As the app's login would: a cookie for the host (any port: the pods' too).
  if (cookie) await page.evaluate((c) => (document.cookie = `${c}; path=/; SameSite=Lax`), cookie);
  await page.waitForFunction(() => window.herald !== undefined, null, { timeout: START_WAIT });
  return page;
}
