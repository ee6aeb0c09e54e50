// Type tests, compiled (`npm run test:types`: tsc --noEmit) in the SDK's test
// run: what an app's editor sees. The client comes from dist/ (the emitted
// .d.ts files, as an app gets them); the frames and commands, internal to the
// SDK, from src/. Every `@ts-expect-error` must meet an error: if the types
// grew loose enough to accept the line below it, tsc fails the run.

import {
  DisabledError,
  HeraldError,
  HistoryLostError,
  HeraldClient,
  type HistoryPage,
  type Message,
  type PresenceMember,
  type PresencePage,
  type Subscription,
  type Transport,
  type TransportChange,
} from '../dist/index.js';
import { parseFrame, type Command, type ServerFrame } from '../src/frame.js';
import { protobuf } from '../dist/protobuf.js';
import { fossil } from '../dist/delta.js';
import { followPresence, presenceAll, type Presence, type PresenceSnapshot } from '../dist/presence.js';

/** `true` only if `A` and `B` are the same type. */
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function same<A, B>(proof: Equal<A, B>): void {
  void proof;
}

interface Price {
  bid: number;
  ask: number;
}

declare const client: HeraldClient;

// ---------------------------------------------------------------- subscribe<T>()

// `T` types a message's `data`, in the emitted declarations.
const prices = client.subscribe<Price>('prices');
same<typeof prices, Subscription<Price>>(true);
prices.on('message', (m) => {
  same<typeof m, Message<Price>>(true);
  const bid: number = m.data.bid;
  void bid;
  // @ts-expect-error: a Price has no `volume`
  void m.data.volume;
});

// Without `T`, `data` is `unknown`: the app narrows it before use, as before.
const news = client.subscribe('news', { since: 41, epoch: '9f3c' });
same<typeof news, Subscription<unknown>>(true);
same<Subscription, Subscription<unknown>>(true);
news.on('message', (m) => {
  same<typeof m.data, unknown>(true);
  // @ts-expect-error: `unknown` has no properties
  void m.data.headline;
});

// The other events are the same whatever `T`.
prices.on('reset', ({ epoch, seq }) => same<[typeof epoch, typeof seq], [string | undefined, number]>(true));
// @ts-expect-error: no such event
prices.on('messages', () => {});

// ---------------------------------------------------------------- server frames

// Narrowing on `op` gives each frame its own fields.
function read(frame: ServerFrame): void {
  switch (frame.op) {
    case 'welcome':
      same<typeof frame.session, string>(true);
      same<typeof frame.expires, number | undefined>(true);
      // @ts-expect-error: a welcome has no seq
      void frame.seq;
      return;
    case 'msg':
      same<[typeof frame.topic, typeof frame.seq, typeof frame.data], [string, number, unknown]>(true);
      return;
    case 'ok':
      // No `id`: a subscription the server made.
      same<typeof frame.id, number | undefined>(true);
      same<typeof frame.seq, number | undefined>(true);
      same<typeof frame.members, PresenceMember[] | undefined>(true);
      return;
    case 'presence_diff':
      same<[typeof frame.from, typeof frame.to], [number, number]>(true);
      same<typeof frame.leaves, string[] | undefined>(true);
      return;
    case 'unsubscribed':
      same<typeof frame.reason, string>(true);
      return;
    case 'err':
      same<typeof frame.id, number | undefined>(true);
      return;
    case 'reset':
      same<typeof frame.epoch, string>(true);
      return;
    case 'reconnect':
      same<typeof frame.after_ms, number>(true);
      return;
    default:
      // Every op is handled above.
      same<typeof frame, never>(true);
  }
}
const parsed = parseFrame('{"op":"reconnect","after_ms":1500,"reason":"draining"}');
if (parsed) read(parsed);
// @ts-expect-error: the parser can turn a frame away: `undefined` must be handled
read(parsed);

// ---------------------------------------------------------------- commands

const commands: Command[] = [
  { op: 'hello' },
  { op: 'hello', token: 'jwt', resume: 'session' },
  { op: 'sub', id: 1, topic: 'news' },
  { op: 'sub', id: 2, topic: 'news', since: 41, epoch: '9f3c' },
  { op: 'unsub', id: 3, topic: 'news' },
  { op: 'pub', id: 4, topic: 'chat:room-1', data: { text: 'hi' } },
  { op: 'ack', topic: 'news', seq: 42, epoch: '9f3c' },
  { op: 'refresh', id: 5, token: 'jwt' },
  { op: 'ping', id: 6 },
  { op: 'presence', id: 7, topic: 'room:1', cursor: 'c', limit: 10 },
  { op: 'history', id: 8, topic: 'news', since: 40, epoch: '9f3c', limit: 50, reverse: true },
];
void commands;

// A wrong command does not compile.
// @ts-expect-error: `sub` needs an `id`
const noId: Command = { op: 'sub', topic: 'news' };
// @ts-expect-error: no such op
const unknownOp: Command = { op: 'subscribe', id: 1, topic: 'news' };
// @ts-expect-error: `seq` is a number
const badSeq: Command = { op: 'ack', topic: 'news', seq: '42' };
// @ts-expect-error: `topic` belongs to other commands than `ping`
const foreignField: Command = { op: 'ping', id: 1, topic: 'news' };
void [noId, unknownOp, badSeq, foreignField];

// ---------------------------------------------------------------- presence, history, server subscriptions

async function features(): Promise<void> {
  const page = await client.presence('room:1', { limit: 10 });
  same<typeof page, PresencePage>(true);
  same<typeof page.cursor, string | undefined>(true);
  const all = await presenceAll(client, 'room:1');
  same<typeof all, PresenceSnapshot>(true);
  // @ts-expect-error: `limit` is a number
  await client.presence('room:1', { limit: '10' });
  // @ts-expect-error: the merge of every page is `@herald/client/presence`'s, not the core's
  await client.presenceAll('room:1');

  const room = followPresence(client.subscribe('room:1'));
  same<typeof room, Presence>(true);
  // Whatever its messages carry.
  followPresence(client.subscribe<Price>('prices'));
  // @ts-expect-error: a subscription is followed by `followPresence`, out of the core
  client.subscribe('room:1').presence();
  // @ts-expect-error: a subscription, not a topic
  followPresence('room:1');
  room.on('join', (m) => same<typeof m, PresenceMember>(true));
  room.on('leave', ({ user }) => same<typeof user, string>(true));
  room.on('change', (s) => same<typeof s.users, number>(true));
  // @ts-expect-error: no such event
  room.on('joined', () => {});

  const history = await client.history<Price>('prices', { since: 40, limit: 50, reverse: true });
  same<typeof history, HistoryPage<Price>>(true);
  const bid: number | undefined = history.publications[0]?.data.bid;
  void bid;
  // @ts-expect-error: `reverse` is a boolean
  await client.history('news', { reverse: 'yes' });

  client.on('subscribed', ({ subscription, reason }) => {
    same<typeof subscription, Subscription>(true);
    void reason;
    subscription.on('unsubscribed', (u) => same<typeof u.reason, string>(true));
  });

  try {
    await client.history('news', { since: 1 });
  } catch (e) {
    if (e instanceof HistoryLostError || e instanceof DisabledError) {
      const parent: HeraldError = e;
      void parent;
    }
  }
}
void features;

// ---------------------------------------------------------------- backend hooks

async function hooks(): Promise<void> {
  // `hello.data`: any JSON value, or a function (sync or async) called before each connection.
  new HeraldClient({ urls: 'ws://h/ws', helloData: { csrf: 'x' } });
  new HeraldClient({ urls: 'ws://h/ws', helloData: async () => ({ csrf: await Promise.resolve('x') }) });

  // `rpc<T>` resolves with the backend's `data` as `T` (unknown without it).
  const cart = await client.rpc<{ items: number }>('cart.add', { sku: 'A-1' }, { timeoutMs: 3000 });
  same<typeof cart, { items: number }>(true);
  same<Awaited<ReturnType<typeof client.rpc>>, unknown>(true);
  await client.rpc('ping');
  // @ts-expect-error: `timeoutMs` is a number
  await client.rpc('ping', null, { timeoutMs: '3s' });
  // @ts-expect-error: the method is a string
  await client.rpc(42);

  // `sub.data` out, the subscribe proxy's `data` back on `subscribed`.
  client.subscribe('room:1', { data: { invite: 'abc' } }).on('subscribed', (s) => same<typeof s.data, unknown>(true));

  // A publish the publish proxy swallowed.
  const published = await client.publish('chat:1', 'hi');
  same<typeof published.skipped, true | undefined>(true);

  try {
    await client.rpc('pay');
  } catch (e) {
    // A backend's own code comes as it is.
    if (e instanceof HeraldError && e.code === 'insufficient_funds') void e.message;
  }
}
void hooks;

const rpcCommand: Command = { op: 'rpc', id: 1, method: 'cart.add', data: { sku: 'A-1' } };
void rpcCommand;

// ---------------------------------------------------------------- transports

same<Transport, 'websocket' | 'stream'>(true);
same<typeof client.transport, Transport>(true);
client.on('transport', (change) => same<typeof change, TransportChange>(true));
new HeraldClient({ urls: 'wss://h/ws', transport: 'stream', webSocketRetryMs: 30_000, fetch });
new HeraldClient({ urls: 'wss://h/ws', transport: 'auto' });
// @ts-expect-error: no such transport
new HeraldClient({ urls: 'wss://h/ws', transport: 'long-polling' });
// @ts-expect-error: read-only: `transport` says which is in use, the option picks
client.transport = 'stream';

// ---------------------------------------------------------------- protobuf and deltas

// The extras come from entry points of their own (as an app imports them: dist/protobuf.d.ts, dist/delta.d.ts).
new HeraldClient({ urls: 'wss://h/ws', protocol: 'protobuf', protobuf, delta: fossil });
new HeraldClient({ urls: 'wss://h/ws', protocol: 'json' });
// @ts-expect-error: no such protocol
new HeraldClient({ urls: 'wss://h/ws', protocol: 'msgpack' });
// @ts-expect-error: the codec is an object of the protobuf entry, not a name
new HeraldClient({ urls: 'wss://h/ws', protocol: 'protobuf', protobuf: 'protobuf' });
const board = client.subscribe<{ round: number } | Uint8Array>('scores', { delta: true });
board.on('subscribed', (s) => same<typeof s.delta, boolean | undefined>(true));
board.on('message', (m) => {
  // Binary data is a Uint8Array: an app whose topic carries bytes says so in `T`.
  if (m.data instanceof Uint8Array) same<typeof m.data, Uint8Array>(true);
  else same<typeof m.data.round, number>(true);
});
// @ts-expect-error: `delta` is a flag
client.subscribe('scores', { delta: 'yes' });
