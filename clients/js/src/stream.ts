import type { HelloCommand } from './frame.js';
import type { Link, LinkHandlers } from './link.js';
import { Lines } from './ndjson.js';

/** The `fetch` the stream uses: the global one, or the app's (Node with a cookie, say). */
export type Fetch = typeof fetch;

/** At most this many commands in one post: the server takes 64. */
export const BATCH_MAX = 64;
/**
 * A post stops growing past this many bytes (of JSON text), half the
 * server's default `websocket.max_message_bytes` (64 KiB): a body over the
 * server's limit would be refused whole (413). One command larger than this
 * goes alone.
 */
export const BATCH_BYTES = 32 * 1024;

/** Waits after a `429` (the session's command queue was full), before the same batch again: `backoff` from this to the max. */
const BUSY_INITIAL_MS = 50;
const BUSY_MAX_MS = 2_000;

/**
 * The HTTP-streaming endpoint beside a WebSocket URL: `wss://host/ws` is
 * `https://host/stream` (`ws://` `http://`; a path that ends in `/ws` has it
 * replaced, any other has `/stream` appended; the query is kept).
 */
export function streamUrl(url: string): string {
  const u = new URL(url);
  u.protocol = u.protocol === 'wss:' ? 'https:' : u.protocol === 'ws:' ? 'http:' : u.protocol;
  u.pathname = `${u.pathname.replace(/\/ws\/?$|\/$/, '')}/stream`;
  return u.href;
}

/**
 * How many of `queue`'s commands (JSON texts) go in the next post, at
 * least one: at most {@link BATCH_MAX}, and no more than
 * {@link BATCH_BYTES} bytes unless the first alone is larger.
 */
export function batchSize(queue: readonly string[]): number {
  let n = 0;
  let bytes = 0;
  while (n < queue.length && n < BATCH_MAX) {
    // Length in UTF-16 units: at most 3 UTF-8 bytes each, so this bounds the body.
    bytes += queue[n]!.length * 3 + 1;
    if (n > 0 && bytes > BATCH_BYTES) break;
    n++;
  }
  return n;
}

/**
 * How a stream that ended without a word on why (1005) was ended, by the
 * `err` that refused its `hello` (a WebSocket's close code would say).
 */
const HELLO_REFUSALS: Record<string, number> = { unauthorized: 4502, forbidden: 4502, token_expired: 4004 };

/** A refused `POST /stream`'s status, as the close code a WebSocket would have been given. */
const REFUSALS: Record<number, number> = { 400: 1002, 401: 4502, 403: 4502, 413: 1009, 429: 4003, 503: 1012 };

/**
 * What a refused `POST /stream` means, as the close code a WebSocket would
 * have been given, from its status and Herald's error `code` (`undefined`
 * when the answer is not Herald's: a proxy's, say, which says nothing
 * about the session). `undefined` back: the stream could not be opened.
 */
export function refusalCode(status: number, code: string | undefined): number | undefined {
  if (code === undefined) return undefined;
  return code === 'token_expired' ? 4004 : code === 'unavailable' ? 4003 : REFUSALS[status];
}

/**
 * A link over HTTP-streaming: `POST <stream url>` with `hello` as its body,
 * whose response is the session's frames, one JSON text a line (an empty
 * line: the server's heartbeat); commands by `POST <stream url>/<session>`,
 * one post at a time so that they arrive in order, those that waited
 * meanwhile batched in the next (newline-delimited). The token goes as
 * `Authorization: Bearer` with each command post (the session's user must
 * be its user). Without a token, cookies go with every request
 * (`credentials: 'include'`), for a connect proxy that reads them; with
 * one, only to the page's own origin (`same-origin`), so that a pod on
 * another origin needs no credentialed CORS.
 */
export function openStream(fetcher: Fetch, url: string, hello: HelloCommand, on: LinkHandlers): Link {
  const base = streamUrl(url);
  const abort = new AbortController();
  let token = hello.token;
  const credentials: RequestCredentials = token ? 'same-origin' : 'include';
  let session: string | undefined;
  /** Commands not yet posted, as JSON texts, in order. */
  const queue: string[] = [];
  let posting = false;
  /** `close()` was called: nothing is told any more, and no post is started after the last queued ones. */
  let closing = false;
  /** Ended: by `close()`, or by a failure already told. */
  let ended = false;

  /** The stream's `200` came. */
  let opened = false;
  /** The `code` of an `err` before `welcome` (the `hello` refused): what the stream's end means. */
  let refused: string | undefined;

  const end = (code: number, reason: string): void => {
    if (ended) return;
    ended = true;
    abort.abort();
    if (!closing) on.closed(code, reason);
  };

  const post = async (): Promise<void> => {
    if (posting || session === undefined) return;
    posting = true;
    const to = new URL(base);
    to.pathname += `/${encodeURIComponent(session)}`;
    for (let busy = 0; queue.length > 0 && !(ended && !closing); ) {
      const n = batchSize(queue);
      const headers: Record<string, string> = { 'content-type': 'application/x-ndjson' };
      if (token) headers.authorization = `Bearer ${token}`;
      let status: number;
      try {
        const res = await fetcher(to.href, { method: 'POST', body: queue.slice(0, n).join('\n'), headers, credentials });
        status = res.status;
        // Its body says no more than its status, but read whole (a few bytes) the connection can carry the next post.
        await res.arrayBuffer();
      } catch (e) {
        end(1006, `POST ${to.pathname}: ${e}`);
        break;
      }
      if (status === 429 && !closing) {
        // Nothing of it was taken: the same batch again, after a wait.
        // Full jitter, as `backoff` (backoff.ts; not imported: the core and this chunk would share a chunk of one line).
        await new Promise((r) => setTimeout(r, Math.random() * Math.min(BUSY_MAX_MS, BUSY_INITIAL_MS * 2 ** busy++)));
        continue;
      }
      queue.splice(0, n);
      busy = 0;
      if (status < 300 || closing) continue;
      // 401: a token no longer good (come back with a fresh one); 404: the
      // session is gone (or not this user's); 413: a command too large for
      // the server, as over a WebSocket; anything else: the link is lost.
      end(status === 401 ? 4004 : status === 413 ? 1009 : 1006, `POST ${to.pathname}: ${status}`);
    }
    posting = false;
  };

  const read = async (): Promise<void> => {
    let res: Response;
    try {
      res = await fetcher(base, {
        method: 'POST',
        body: JSON.stringify(hello),
        headers: { 'content-type': 'application/json' },
        credentials,
        cache: 'no-store',
        signal: abort.signal,
      });
    } catch (e) {
      end(1006, `POST ${base}: ${e}`);
      return;
    }
    if (res.status === 200 && !res.body) {
      // A `fetch` that cannot stream a response: as good as no stream.
      end(1006, `POST ${base}: no response stream`);
      return;
    }
    if (res.status !== 200 || !res.body) {
      // Herald says why in JSON (`{"error":{"code","message"}}`); a proxy's page says nothing of the session.
      let error: { code?: unknown; message?: unknown } | undefined;
      try {
        error = (await res.json())?.error;
      } catch {
        // Not Herald's answer.
      }
      const code = typeof error?.code === 'string' ? error.code : undefined;
      const close = refusalCode(res.status, code);
      if (close === undefined) {
        end(1006, `POST ${base}: ${res.status}`);
        return;
      }
      // Herald answered: the transport works. As a WebSocket's `hello` would have been answered: `err`, then the close.
      opened = true;
      if (!ended) on.frame(JSON.stringify({ op: 'err', code, message: String(error?.message ?? code) }));
      end(close, `POST ${base}: ${res.status}`);
      return;
    }
    opened = true;
    const lines = new Lines();
    const reader = res.body.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        for (const line of lines.push(value)) {
          if (ended) return;
          if (line === '') {
            on.beat();
            continue;
          }
          if (session === undefined) {
            // The first frame is `welcome`: its session names where commands go.
            try {
              const f = JSON.parse(line);
              if (typeof f?.session === 'string') session = f.session;
              else if (f?.op === 'err' && typeof f.code === 'string') refused = f.code;
            } catch {
              // Not JSON: the client ignores it too.
            }
            on.frame(line);
            void post();
            continue;
          }
          on.frame(line);
        }
      }
    } catch (e) {
      end(1006, `the stream broke: ${e}`);
      return;
    }
    end(refused !== undefined && Object.hasOwn(HELLO_REFUSALS, refused) ? HELLO_REFUSALS[refused]! : 1005, 'the stream ended');
  };

  void read();
  return {
    get opened() {
      return opened;
    },
    beats: true,
    send(command) {
      if (ended) return;
      queue.push(JSON.stringify(command));
      void post();
    },
    auth(t) {
      token = t;
    },
    close() {
      if (ended) return;
      closing = true;
      end(1000, 'closed');
      // What was queued (the acks `close()` flushes) still goes, once.
      void post();
    },
  };
}
