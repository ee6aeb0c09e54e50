#!/usr/bin/env python3
"""The `herald.v1.protobuf` subprotocol with a client the project did not
write: Python's `websockets`, offering `subprotocols=["herald.v1.protobuf"]`
(and permessage-deflate, which it offers by default).

Usage: protobuf.py ws://127.0.0.1:PORT/ws http://127.0.0.1:PORT

Herald must select the subprotocol (and the extension). Every message is
then one protobuf message in one binary WebSocket message: a subscriber's
`hello` and `sub` are answered by `welcome` and `ok`; a publisher's large
`pub` (compressed by the client) is answered by `ok` with its seq, and the
subscriber gets the `msg` compressed, its `data` the publisher's JSON text
byte for byte; a backend's small HTTP publish arrives uncompressed; a text
message closes the connection with 1003. Exits 0 and prints `protobuf: ok`,
or 1 with `protobuf: FAIL: <what>` on stderr.

The few messages are encoded and decoded by hand (a varint and a
length-delimited field are all they use), against the field numbers of
proto/proto/herald/v1/herald.proto: no protobuf package to install.
"""

import asyncio
import json
import sys

import websockets

import wire
from wire import TIMEOUT, check, http_publish

TOPIC = "chat:protobuf"
PROTOCOL = "herald.v1.protobuf"

# ClientCommand's oneof cases.
HELLO, SUB, PUB, PING = 1, 2, 4, 7
# ServerMessage's.
WELCOME, OK, MSG, ERR = 1, 2, 3, 4
NAMES = {WELCOME: "welcome", OK: "ok", MSG: "msg", ERR: "err"}


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, value):
    """One field: an int as a varint, bytes or str length-delimited."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def message(*fields):
    return b"".join(field(n, v) for n, v in fields)


def command(case, *fields):
    return field(case, message(*fields))


def decode(data):
    """The fields of a message: number -> the last value (an int, or bytes)."""
    fields, at = {}, 0

    def read_varint():
        nonlocal at
        shift, value = 0, 0
        while True:
            check(at < len(data), f"a varint past the end of {data!r}")
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while at < len(data):
        key = read_varint()
        number, kind = key >> 3, key & 7
        if kind == 0:
            fields[number] = read_varint()
        elif kind == 2:
            length = read_varint()
            fields[number] = data[at:at + length]
            at += length
        else:
            raise wire.Failure(f"wire type {kind} in {data!r}")
    return fields


def watch(ws):
    """The RSV1 bit of every data frame received and sent, in order."""
    ext = ws.protocol.extensions[0]
    received, sent = [], []
    decode_frame, encode_frame = ext.decode, ext.encode

    def watched_decode(frame, *args, **kwargs):
        if frame.opcode.name in ("TEXT", "BINARY"):
            received.append(frame.rsv1)
        return decode_frame(frame, *args, **kwargs)

    def watched_encode(frame, *args, **kwargs):
        out = encode_frame(frame, *args, **kwargs)
        if out.opcode.name in ("TEXT", "BINARY"):
            sent.append(out.rsv1)
        return out

    ext.decode, ext.encode = watched_decode, watched_encode
    return received, sent


async def connect(url):
    ws = await wire.connect(url, subprotocols=[PROTOCOL])
    check(ws.subprotocol == PROTOCOL, f"the subprotocol selected: {ws.subprotocol!r}")
    answer = ws.response.headers.get("Sec-WebSocket-Protocol")
    check(answer == PROTOCOL, f"the 101 names it: {answer!r}")
    extensions = ws.protocol.extensions
    check(len(extensions) == 1 and extensions[0].name == "permessage-deflate",
          f"permessage-deflate beside it: {extensions}")
    return ws


async def send(ws, case, *fields):
    await asyncio.wait_for(ws.send(command(case, *fields)), TIMEOUT)


async def recv(ws, case, who):
    """The next message, which must be a binary `ServerMessage` of `case`."""
    try:
        raw = await asyncio.wait_for(ws.recv(), TIMEOUT)
    except asyncio.TimeoutError:
        raise wire.Failure(f"{who}: no `{NAMES[case]}` within {TIMEOUT}s") from None
    check(isinstance(raw, bytes), f"{who}: expected a binary message, got {raw!r}")
    outer = decode(raw)
    check(list(outer) == [case], f"{who}: expected `{NAMES[case]}`, got {outer}")
    return decode(outer[case])


async def scenario(ws_url, http_base):
    subscriber = await connect(ws_url)
    publisher = await connect(ws_url)
    try:
        received, _ = watch(subscriber)
        _, sent = watch(publisher)
        for ws, who in ((subscriber, "subscriber"), (publisher, "publisher")):
            await send(ws, HELLO)
            welcome = await recv(ws, WELCOME, who)
            check(len(welcome.get(1, b"")) == 32, f"{who}: a session in the welcome: {welcome}")
        await send(subscriber, SUB, (1, 1), (2, TOPIC))
        ok = await recv(subscriber, OK, "subscriber")
        check(ok.get(1) == 1 and ok.get(2) == TOPIC.encode(), f"the sub's ok: {ok}")

        # A scoreboard-like state, about 3 KiB of JSON text.
        data = json.dumps({"players": [{"name": f"player {i}", "score": i * 37} for i in range(60)]})
        await send(publisher, PUB, (1, 7), (2, TOPIC), (3, data))
        check(sent and sent[-1], f"the client compressed its pub: {sent}")
        ok = await recv(publisher, OK, "publisher")
        check(ok.get(1) == 7 and ok.get(3) == 1, f"the pub's ok, with its seq: {ok}")
        msg = await recv(subscriber, MSG, "subscriber")
        check(msg.get(1) == TOPIC.encode() and msg.get(2) == 1, f"the msg's topic and seq: {msg}")
        check(msg.get(3) == data.encode(), "the msg's data, the published JSON text byte for byte")
        check(received[-1] is True, f"the msg came compressed (RSV1): {received}")

        await asyncio.wait_for(asyncio.to_thread(http_publish, http_base, TOPIC, {"n": 1}), TIMEOUT)
        msg = await recv(subscriber, MSG, "subscriber")
        check(msg.get(2) == 2 and json.loads(msg.get(3)) == {"n": 1}, f"the small msg: {msg}")
        check(received[-1] is False, f"a message under min_bytes comes uncompressed: {received}")

        # Text is not this subprotocol's: 1003.
        await asyncio.wait_for(publisher.send(json.dumps({"op": "ping", "id": 1})), TIMEOUT)
        try:
            await asyncio.wait_for(publisher.recv(), TIMEOUT)
            raise wire.Failure("a text message was answered")
        except websockets.ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            check(code == 1003, f"closed with 1003, not {code}")
    finally:
        for ws in (subscriber, publisher):
            try:
                await asyncio.wait_for(ws.close(), TIMEOUT)
            except Exception:
                pass


def main():
    args = sys.argv[1:3] if len(sys.argv) == 3 else None
    return wire.run("protobuf", scenario, args, __doc__, f"websockets {websockets.__version__}")


if __name__ == "__main__":
    sys.exit(main())
