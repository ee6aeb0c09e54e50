"""What Herald's Python client tests share: bounded waits on a `websockets`
connection and a backend publish over HTTP. Every wait is bounded by
TIMEOUT; a broken expectation raises Failure with what was wrong."""

import asyncio
import inspect
import json
import urllib.request

import websockets

TIMEOUT = 10.0


class Failure(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failure(what)


async def connect(url):
    kwargs = {"open_timeout": TIMEOUT, "close_timeout": TIMEOUT}
    # Recent versions honour proxy variables; the server is on loopback.
    if "proxy" in inspect.signature(websockets.connect).parameters:
        kwargs["proxy"] = None
    return await asyncio.wait_for(websockets.connect(url, **kwargs), TIMEOUT)


async def send(ws, message):
    await asyncio.wait_for(ws.send(json.dumps(message)), TIMEOUT)


async def recv(ws, op, who):
    """The next message, which must be a text frame with `op`."""
    try:
        raw = await asyncio.wait_for(ws.recv(), TIMEOUT)
    except asyncio.TimeoutError:
        raise Failure(f"{who}: no `{op}` within {TIMEOUT}s") from None
    check(isinstance(raw, str), f"{who}: expected a text frame, got {raw!r}")
    message = json.loads(raw)
    check(message.get("op") == op, f"{who}: expected `{op}`, got {message}")
    return message


def http_publish(http_base, topic, data):
    body = json.dumps({"topic": topic, "data": data}).encode()
    request = urllib.request.Request(
        http_base.rstrip("/") + "/v1/publish",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=TIMEOUT) as response:
        check(response.status == 200, f"HTTP publish: status {response.status}")
        return json.loads(response.read())
