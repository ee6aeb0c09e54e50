// Type tests, compiled (`npm run test:types`: tsc --noEmit) in the SDK's test
// run: what an app's editor sees. The client comes from dist/ (the emitted
// .d.ts files, as an app gets them); the frames and commands, internal to the
// SDK, from src/. Every `@ts-expect-error` must meet an error: if the types
// grew loose enough to accept the line below it, tsc fails the run.

import { HeraldClient, type Message, type Subscription } from '../dist/index.js';
import { parseFrame, type Command, type ServerFrame } from '../src/frame.js';

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
      same<typeof frame.id, number>(true);
      same<typeof frame.seq, number | undefined>(true);
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
