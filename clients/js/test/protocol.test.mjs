// The SDK's frame types in step with the protocol. The wire messages are
// defined in proto/proto/herald/v1/herald.proto (the JSON protocol is the same
// messages: `op` names the oneof case, the other keys are its fields; the Rust
// side's proto/tests/lockstep.rs holds the server to it), and docs/protocol.md
// lists them in two tables. This reads the `.proto`, the tables, and the SDK's
// `ServerFrame` and `Command` unions (src/frame.ts, through the TypeScript
// compiler's type checker), and fails on any op or field that one has and
// another lacks, or that differs in optionality or type. Then the parser:
// what it lets through, and what it turns away.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

import { parseFrame } from '../dist/frame.js';

const JS_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const REPO = resolve(JS_ROOT, '../..');

const PROTO = readFileSync(join(REPO, 'proto/proto/herald/v1/herald.proto'), 'utf8');
const DOCS = readFileSync(join(REPO, 'docs/protocol.md'), 'utf8');
const FRAMES = join(JS_ROOT, 'src/frame.ts');

/** The TypeScript type of each proto3 scalar the JSON protocol uses; `bytes` is JSON text on the wire, any JSON value here. */
const TS_TYPE = { uint64: 'number', uint32: 'number', string: 'string', bool: 'boolean', bytes: 'unknown' };

/**
 * Where the SDK's type says more than the proto can: `ok.id` is absent from
 * an `ok` the server sends on its own (proto3's 0, left out of the JSON), and
 * `info` is a JSON object (the proto's JSON text). A `msg` comes in one of
 * three forms in JSON: `data` (with `binary`, base64), or in a subscription
 * with deltas `full` or `delta` (a string, one char per byte); a binary
 * publication's `binary` is there only when true.
 */
const REFINED = new Map([
  ['ok.id', { optional: true, type: 'number' }],
  ['PresenceMember.info', { optional: true, type: 'Record<string, unknown>' }],
  ['msg.data', { optional: true, type: 'unknown' }],
  ['msg.delta', { optional: true, type: 'string' }],
  ['msg.binary', { optional: true, type: 'boolean' }],
  ['Publication.binary', { optional: true, type: 'boolean' }],
]);

/** Fields of the JSON protocol that protobuf does without: a `msg`'s `full` (protobuf's `data` is the exact bytes). */
const JSON_ONLY = new Map([['msg.full', { optional: true, type: 'string' }]]);

/** The body of `message <name> { ... }`, without comments. */
function messageBody(name) {
  const start = PROTO.indexOf(`message ${name} {`);
  assert.ok(start >= 0, `message ${name} in herald.proto`);
  const body = PROTO.slice(PROTO.indexOf('{', start) + 1, PROTO.indexOf('\n}', start));
  return body.replace(/\/\/.*$/gm, '');
}

/** The cases of a `oneof op` message: op name -> message name (`welcome` -> `Welcome`). */
function oneofCases(name) {
  const cases = new Map();
  for (const [, type, op] of messageBody(name).matchAll(/^\s*(\w+)\s+(\w+)\s*=\s*\d+;/gm)) cases.set(op, type);
  return cases;
}

/**
 * A proto message's fields: name -> `{ optional, type }` with the TypeScript
 * type the JSON form has (`key`: how {@link REFINED} names the message). A
 * message type is the SDK's interface of the same name; a `repeated` field
 * is an array, and optional (left out when empty).
 */
function protoFields(name, key = name) {
  const fields = new Map();
  const pattern = /^\s*(optional\s+|repeated\s+)?(\w+)\s+(\w+)\s*=\s*\d+;/gm;
  for (const [, label, type, field] of messageBody(name).matchAll(pattern)) {
    const message = PROTO.includes(`message ${type} {`);
    assert.ok(type in TS_TYPE || message, `${name}.${field}: a proto type (${type}) this test does not map`);
    const ts = message ? type : TS_TYPE[type];
    const repeated = label?.trim() === 'repeated';
    fields.set(
      field,
      REFINED.get(`${key}.${field}`) ?? { optional: label !== undefined, type: repeated ? `${ts}[]` : ts },
    );
  }
  for (const [path, f] of JSON_ONLY) if (path.startsWith(`${key}.`)) fields.set(path.slice(key.length + 1), f);
  return fields;
}

/** The protocol as the proto has it: for the oneof `name`, op -> its fields. */
function protoOps(name) {
  return new Map([...oneofCases(name)].map(([op, type]) => [op, protoFields(type, op)]));
}

/** The SDK's source, compiled once. */
let program;

/** The SDK's union `name` (in src/frame.ts): op -> its fields (besides `op`), each `{ optional, type }`. */
function sdkOps(name) {
  program ??= ts.createProgram([FRAMES], { strict: true, noEmit: true, target: ts.ScriptTarget.ES2022, types: [] });
  const checker = program.getTypeChecker();
  const source = program.getSourceFile(FRAMES);
  const alias = source.statements.find((s) => ts.isTypeAliasDeclaration(s) && s.name.text === name);
  assert.ok(alias, `type ${name} in src/frame.ts`);
  const union = checker.getTypeAtLocation(alias.name);
  assert.ok(union.isUnion(), `${name} is a union`);
  const ops = new Map();
  for (const member of union.types) {
    const fields = new Map();
    let op;
    for (const property of checker.getPropertiesOfType(member)) {
      const type = checker.getTypeOfSymbolAtLocation(property, alias);
      const optional = (property.flags & ts.SymbolFlags.Optional) !== 0;
      if (property.name === 'op') {
        assert.ok(type.isStringLiteral(), `${checker.typeToString(member)}: \`op\` is one string literal`);
        op = type.value;
      } else {
        // An optional key's type reads `T | undefined` under strict checks: the `?` says that part.
        // `Publication<unknown>` is the proto's `Publication`.
        const text = checker.typeToString(type).replace(/ \| undefined$/, '').replace(/<unknown>/g, '');
        fields.set(property.name, { optional, type: text });
      }
    }
    assert.ok(op !== undefined, `${checker.typeToString(member)} has an \`op\``);
    assert.ok(!ops.has(op), `\`${op}\` once in ${name}`);
    ops.set(op, fields);
  }
  return ops;
}

/** The SDK's interface `name` (in src/frame.ts): its fields, each `{ optional, type }`. */
function sdkInterface(name) {
  program ??= ts.createProgram([FRAMES], { strict: true, noEmit: true, target: ts.ScriptTarget.ES2022, types: [] });
  const checker = program.getTypeChecker();
  const source = program.getSourceFile(FRAMES);
  const declaration = source.statements.find((s) => ts.isInterfaceDeclaration(s) && s.name.text === name);
  assert.ok(declaration, `interface ${name} in src/frame.ts`);
  const fields = new Map();
  for (const property of checker.getPropertiesOfType(checker.getTypeAtLocation(declaration.name))) {
    const type = checker.getTypeOfSymbolAtLocation(property, declaration);
    const text = checker.typeToString(type).replace(/ \| undefined$/, '');
    // A type parameter (`Publication<T>`'s `data`) stands for any JSON value.
    fields.set(property.name, { optional: (property.flags & ts.SymbolFlags.Optional) !== 0, type: text === 'T' ? 'unknown' : text });
  }
  return fields;
}

/** The docs' table under `heading`: op -> the field names its row lists. */
function docsOps(heading) {
  const section = DOCS.slice(DOCS.indexOf(`\n## ${heading}\n`), DOCS.indexOf('\n## ', DOCS.indexOf(`\n## ${heading}\n`) + 1));
  const ops = new Map();
  for (const [, op, fields] of section.matchAll(/^\| `(\w+)` \| ([^|]*) \|/gm)) {
    ops.set(op, new Set([...fields.matchAll(/`(\w+)`/g)].map(([, f]) => f)));
  }
  assert.ok(ops.size > 0, `a table of ops under "## ${heading}" in docs/protocol.md`);
  return ops;
}

/** Every difference between the protocol (`expected`) and the SDK (`actual`), one line each. */
function differences(expected, actual) {
  const found = [];
  for (const op of new Set([...expected.keys(), ...actual.keys()])) {
    const want = expected.get(op);
    const have = actual.get(op);
    if (!have) found.push(`\`${op}\`: in the protocol, missing from the SDK`);
    else if (!want) found.push(`\`${op}\`: in the SDK, not in the protocol`);
    else {
      for (const field of new Set([...want.keys(), ...have.keys()])) {
        const w = want.get(field);
        const h = have.get(field);
        if (!h) found.push(`\`${op}.${field}\`: in the protocol, missing from the SDK`);
        else if (!w) found.push(`\`${op}.${field}\`: in the SDK, not in the protocol`);
        else if (w.optional !== h.optional || w.type !== h.type) {
          const show = (f) => `${f.optional ? 'optional ' : ''}${f.type}`;
          found.push(`\`${op}.${field}\`: ${show(w)} in the protocol, ${show(h)} in the SDK`);
        }
      }
    }
  }
  return found;
}

/** Op -> field names only, for the docs (whose tables say optionality in words). */
function names(ops) {
  return new Map([...ops].map(([op, fields]) => [op, new Set(fields.keys())]));
}

function sameNames(expected, actual, what) {
  const found = [];
  for (const op of new Set([...expected.keys(), ...actual.keys()])) {
    const want = [...(expected.get(op) ?? [])].sort().join(', ');
    const have = [...(actual.get(op) ?? [])].sort().join(', ');
    if (!expected.has(op) || !actual.has(op) || want !== have) found.push(`\`${op}\`: proto [${want}], ${what} [${have}]`);
  }
  assert.deepEqual(found, [], `${what} and herald.proto disagree`);
}

test('every server frame of herald.proto is in the SDK\'s ServerFrame union, with the same fields, optionality and types, and nothing else is', () => {
  const proto = protoOps('ServerMessage');
  assert.deepEqual([...proto.keys()].sort(), ['err', 'msg', 'ok', 'presence_diff', 'reconnect', 'reset', 'unsubscribed', 'welcome']);
  assert.deepEqual(differences(proto, sdkOps('ServerFrame')), []);
});

test('every command of herald.proto is in the SDK\'s Command union, with the same fields, optionality and types, and nothing else is', () => {
  const proto = protoOps('ClientCommand');
  assert.deepEqual([...proto.keys()].sort(), ['ack', 'hello', 'history', 'ping', 'presence', 'pub', 'refresh', 'rpc', 'sub', 'unsub']);
  assert.deepEqual(differences(proto, sdkOps('Command')), []);
});

test('the messages inside frames (a presence member, a history publication) have the fields of herald.proto', () => {
  for (const name of ['PresenceMember', 'Publication']) {
    assert.deepEqual(differences(new Map([[name, protoFields(name)]]), new Map([[name, sdkInterface(name)]])), []);
  }
});

test("docs/protocol.md's tables list the ops and fields of herald.proto", () => {
  sameNames(names(protoOps('ServerMessage')), docsOps('Server to client'), 'docs/protocol.md "Server to client"');
  sameNames(names(protoOps('ClientCommand')), docsOps('Client to server'), 'docs/protocol.md "Client to server"');
});

test('the parser: a frame the client knows passes as it came; anything else is undefined, and text that is not JSON throws', () => {
  const frames = [
    { op: 'welcome', session: 's', ping_ms: 25000, resumed: false, expires: 1_700_000_000 },
    { op: 'ok', id: 1, topic: 'news', seq: 41, epoch: '9f3c' },
    { op: 'msg', topic: 'news', seq: 42, data: { any: 'json' } },
    { op: 'err', id: 3, code: 'forbidden', message: 'no', topic: 'news' },
    { op: 'reset', topic: 'news', epoch: '77ab', seq: 130 },
    { op: 'reconnect', after_ms: 1500, reason: 'draining' },
    { op: 'ok', topic: 'news', seq: 42, epoch: '9f3c', reason: 'server' },
    { op: 'ok', id: 4, topic: 'room:1', position: 17, users: 2, connections: 3, members: [{ user: 'alice', info: { name: 'Alice' } }, { user: 'bob' }], cursor: 'c' },
    { op: 'ok', id: 5, topic: 'news', epoch: '9f3c', seq: 42, publications: [{ seq: 41, data: 1 }, { seq: 42, data: { a: 2 } }] },
    { op: 'presence_diff', topic: 'room:1', from: 17, to: 19, joins: [{ user: 'carol' }], leaves: ['bob'], users: 2, connections: 2 },
    { op: 'presence_diff', topic: 'room:1', from: 19, to: 20, users: 20001, connections: 20400 },
    { op: 'unsubscribed', topic: 'news', reason: 'server' },
    { op: 'ok', id: 6, data: { cart: ['A-1'] } },
    { op: 'ok', id: 7, topic: 'room:1', seq: 0, epoch: '9f3c', data: { role: 'guest' } },
    { op: 'err', id: 8, code: 'insufficient_funds', message: 'balance 0' },
    { op: 'ok', id: 9, topic: 'scores', seq: 42, epoch: '9f3c', delta: true },
    { op: 'msg', topic: 'scores', seq: 43, full: '{"round":1}' },
    { op: 'msg', topic: 'scores', seq: 44, delta: '9\n3@0,6:"2}\u00ff1ZDO;' },
    { op: 'msg', topic: 'frames', seq: 7, data: 'AP/DKA==', binary: true },
    { op: 'ok', id: 10, topic: 'frames', epoch: '9f3c', seq: 7, publications: [{ seq: 7, data: 'AP/DKA==', binary: true }] },
  ];
  for (const frame of frames) assert.deepEqual(parseFrame(JSON.stringify(frame)), frame);
  const turnedAway = [
    'null',
    '42',
    '"msg"',
    '[]',
    '{}',
    '{"op":"presence","topic":"news"}',
    '{"op":"toString"}',
    '{"op":"welcome","ping_ms":25000,"resumed":false}',
    '{"op":"ok"}',
    '{"op":"ok","topic":"news"}',
    '{"op":"presence_diff","topic":"room:1","from":1}',
    '{"op":"presence_diff","topic":"room:1","from":1,"to":2,"joins":{"user":"a"}}',
    '{"op":"presence_diff","topic":"room:1","from":1,"to":2,"leaves":"bob"}',
    '{"op":"unsubscribed","reason":"server"}',
    '{"op":"msg","topic":"news","seq":"42","data":1}',
    '{"op":"msg","seq":42,"data":1}',
    '{"op":"err","message":"no"}',
    '{"op":"reset","topic":"news","epoch":"77ab"}',
    '{"op":"reset","topic":"news","seq":130}',
    '{"op":"reconnect","after_ms":"soon","reason":"draining"}',
  ];
  for (const text of turnedAway) assert.equal(parseFrame(text), undefined, text);
  assert.throws(() => parseFrame('{"op":"msg",'), SyntaxError);
});
