#!/usr/bin/env python3
"""permessage-deflate with a client the project did not write: Python's
`websockets`, which offers it by default (RFC 7692).

Usage: deflate.py ws://127.0.0.1:PORT/ws http://127.0.0.1:PORT

Two clients connect; Herald must accept the offer, answering
`server_no_context_takeover` and `client_no_context_takeover`. The publisher
sends a large `pub`, compressed (RSV1 set by the client); the subscriber must
receive it compressed (RSV1 on the frame) and read it back exactly; a small
HTTP publish (under `min_bytes`) must arrive uncompressed. Exits 0 and prints
`deflate: ok`, or 1 with `deflate: FAIL: <what>` on stderr.
"""

import asyncio
import sys

import websockets

import wire
from wire import TIMEOUT, check, connect, http_publish, recv, send

TOPIC = "chat:deflate"


def watch(ws):
    """The RSV1 bit of every data frame received and sent, in order."""
    extensions = ws.protocol.extensions
    check(len(extensions) == 1 and extensions[0].name == "permessage-deflate",
          f"permessage-deflate negotiated: {extensions}")
    ext = extensions[0]
    received, sent = [], []
    decode, encode = ext.decode, ext.encode

    def watched_decode(frame, *args, **kwargs):
        if frame.opcode.name in ("TEXT", "BINARY"):
            received.append(frame.rsv1)
        return decode(frame, *args, **kwargs)

    def watched_encode(frame, *args, **kwargs):
        out = encode(frame, *args, **kwargs)
        if out.opcode.name in ("TEXT", "BINARY"):
            sent.append(out.rsv1)
        return out

    ext.decode, ext.encode = watched_decode, watched_encode
    return received, sent


async def scenario(ws_url, http_base):
    subscriber = await connect(ws_url)
    publisher = await connect(ws_url)
    try:
        for ws in (subscriber, publisher):
            answer = ws.response.headers.get("Sec-WebSocket-Extensions", "")
            check(answer.startswith("permessage-deflate"), f"the answer names the extension: {answer!r}")
            check("server_no_context_takeover" in answer and "client_no_context_takeover" in answer,
                  f"no context takeover either way: {answer!r}")
        received, _ = watch(subscriber)
        _, sent = watch(publisher)

        await send(subscriber, {"op": "hello"})
        await recv(subscriber, "welcome", "subscriber")
        await send(publisher, {"op": "hello"})
        await recv(publisher, "welcome", "publisher")
        await send(subscriber, {"op": "sub", "id": 1, "topic": TOPIC})
        await recv(subscriber, "ok", "subscriber")

        # A scoreboard-like state, about 3 KiB of JSON.
        data = {"players": [{"name": f"player {i}", "score": i * 37, "team": "blue" if i % 2 else "red"}
                            for i in range(60)]}
        await send(publisher, {"op": "pub", "id": 7, "topic": TOPIC, "data": data})
        check(sent and sent[-1], f"the client compressed its pub: {sent}")
        ok = await recv(publisher, "ok", "publisher")
        check(ok.get("id") == 7 and ok.get("seq") == 1, f"ok for the compressed pub: {ok}")
        message = await recv(subscriber, "msg", "subscriber")
        check(message.get("data") == data and message.get("seq") == 1, f"the msg as published: {message}")
        check(received[-1] is True, f"the msg came compressed (RSV1): {received}")

        small = {"n": 1}
        await asyncio.wait_for(asyncio.to_thread(http_publish, http_base, TOPIC, small), TIMEOUT)
        message = await recv(subscriber, "msg", "subscriber")
        check(message.get("data") == small, f"the small msg: {message}")
        check(received[-1] is False, f"a message under min_bytes comes uncompressed: {received}")
    finally:
        for ws in (subscriber, publisher):
            try:
                await asyncio.wait_for(ws.close(), TIMEOUT)
            except Exception:
                pass


def main():
    args = sys.argv[1:3] if len(sys.argv) == 3 else None
    return wire.run("deflate", scenario, args, __doc__, f"websockets {websockets.__version__}")


if __name__ == "__main__":
    sys.exit(main())
