#!/usr/bin/env python3
"""Herald seen from a client the project did not write: Python's `websockets`.

Usage: smoke.py ws://127.0.0.1:PORT/ws http://127.0.0.1:PORT

Two clients say hello; one subscribes to `chat:py`, the other publishes to it
with a `pub` command; then a backend publishes over HTTP. The subscriber must
get both, in order (seq 1 then 2), with the data as sent. Exits 0 and prints
`smoke: ok`, or exits 1 with `smoke: FAIL: <what>` on stderr. Every wait is
bounded.
"""

import asyncio
import sys

import websockets

import wire
from wire import TIMEOUT, Failure, check, connect, http_publish, recv, send

TOPIC = "chat:py"


async def hello(ws, who):
    await send(ws, {"op": "hello"})
    welcome = await recv(ws, "welcome", who)
    check(isinstance(welcome.get("session"), str) and welcome["session"], f"{who}: welcome has a session: {welcome}")
    return welcome


async def expect_msg(ws, seq, data):
    message = await recv(ws, "msg", "subscriber")
    check(message.get("topic") == TOPIC, f"msg topic: {message}")
    check(message.get("seq") == seq, f"msg seq {seq}: {message}")
    check(message.get("data") == data, f"msg data {data!r}: {message}")


async def smoke(ws_url, http_base):
    subscriber = await connect(ws_url)
    publisher = await connect(ws_url)
    try:
        a = await hello(subscriber, "subscriber")
        b = await hello(publisher, "publisher")
        check(a["session"] != b["session"], "two sessions")

        await send(subscriber, {"op": "sub", "id": 1, "topic": TOPIC})
        ok = await recv(subscriber, "ok", "subscriber")
        check(ok.get("id") == 1, f"ok for the sub: {ok}")

        data = {"text": "héllo from python", "n": [1, 2.5, None, True]}
        await send(publisher, {"op": "pub", "id": 7, "topic": TOPIC, "data": data})
        ok = await recv(publisher, "ok", "publisher")
        check(ok.get("id") == 7 and ok.get("seq") == 1, f"ok for the pub: {ok}")
        await expect_msg(subscriber, 1, data)

        backend = ["from", "the", "backend"]
        answer = await asyncio.wait_for(asyncio.to_thread(http_publish, http_base, TOPIC, backend), TIMEOUT)
        check(answer.get("seq") == 2 and answer.get("epoch"), f"HTTP publish answer: {answer}")
        await expect_msg(subscriber, 2, backend)
    finally:
        for ws in (subscriber, publisher):
            try:
                await asyncio.wait_for(ws.close(), TIMEOUT)
            except Exception:
                pass


def main():
    args = sys.argv[1:3] if len(sys.argv) == 3 else None
    return wire.run("smoke", smoke, args, __doc__, f"websockets {websockets.__version__}")


if __name__ == "__main__":
    sys.exit(main())
