#!/usr/bin/env python3
"""Herald's token auth seen from Python: a token minted by PyJWT, a client
speaking through `websockets`.

Usage: auth.py ws://127.0.0.1:PORT/ws http://127.0.0.1:PORT HMAC_SECRET

A client says hello with an HS256 token for `py-user` (exp in ten minutes),
gets a `welcome` whose `expires` is the token's `exp`, subscribes to
`chat:py` and receives a backend's HTTP publish. Then a client whose token is
signed with another secret gets `err` `unauthorized` and close code 4502.
Exits 0 and prints `auth: ok`, or exits 1 with `auth: FAIL: <what>` on
stderr. Every wait is bounded.
"""

import asyncio
import sys
import time

import jwt
import websockets

import wire
from wire import TIMEOUT, Failure, check, connect, http_publish, recv, send

TOPIC = "chat:py"


def token(secret, sub, exp):
    return jwt.encode({"sub": sub, "exp": exp}, secret, algorithm="HS256")


async def accepted(ws_url, http_base, secret):
    exp = int(time.time()) + 600
    ws = await connect(ws_url)
    try:
        await send(ws, {"op": "hello", "token": token(secret, "py-user", exp)})
        welcome = await recv(ws, "welcome", "client")
        check(welcome.get("expires") == exp, f"welcome carries the token's exp {exp}: {welcome}")
        check(welcome.get("resumed") is False, f"a fresh session: {welcome}")

        await send(ws, {"op": "sub", "id": 1, "topic": TOPIC})
        ok = await recv(ws, "ok", "client")
        check(ok.get("id") == 1, f"ok for the sub: {ok}")

        data = {"for": "py-user"}
        await asyncio.wait_for(asyncio.to_thread(http_publish, http_base, TOPIC, data), TIMEOUT)
        message = await recv(ws, "msg", "client")
        check(message.get("topic") == TOPIC and message.get("data") == data, f"msg: {message}")
    finally:
        try:
            await asyncio.wait_for(ws.close(), TIMEOUT)
        except Exception:
            pass


async def refused(ws_url):
    forged = token("another-secret-another-secret-another-secret", "py-user", int(time.time()) + 600)
    ws = await connect(ws_url)
    await send(ws, {"op": "hello", "token": forged})
    err = await recv(ws, "err", "forger")
    check(err.get("code") == "unauthorized", f"err unauthorized: {err}")
    try:
        extra = await asyncio.wait_for(ws.recv(), TIMEOUT)
        raise Failure(f"forger: expected the close, got {extra!r}")
    except websockets.ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd else None
        check(code == 4502, f"forger: close code 4502, got {code}")
    except asyncio.TimeoutError:
        raise Failure(f"forger: not closed within {TIMEOUT}s") from None


async def run(ws_url, http_base, secret):
    await accepted(ws_url, http_base, secret)
    await refused(ws_url)


def main():
    args = sys.argv[1:4] if len(sys.argv) == 4 else None
    versions = f"pyjwt {jwt.__version__}, websockets {websockets.__version__}"
    return wire.run("auth", run, args, __doc__, versions)


if __name__ == "__main__":
    sys.exit(main())
