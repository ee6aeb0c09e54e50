"""What Herald's Python client tests share: bounded waits on a `websockets`
connection and a backend publish over HTTP. Every wait is bounded by
TIMEOUT; a broken expectation raises Failure with what was wrong."""

import asyncio
import inspect
import json
import sys
import urllib.request

import websockets

TIMEOUT = 10.0


class Failure(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failure(what)


async def connect(url, **options):
    """A connection to `url`; `options` for `websockets.connect`
    (`subprotocols`, say)."""
    kwargs = {"open_timeout": TIMEOUT, "close_timeout": TIMEOUT, **options}
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


def run(name, scenario, args, doc, done):
    """Runs `scenario(*args)` within six TIMEOUTs, and says how it went: exit
    0 with `<name>: ok (<done>)`, 1 with `<name>: FAIL: <what>` on stderr, or
    2 with `doc` when `args` is None (the wrong number of arguments)."""
    if args is None:
        print(doc, file=sys.stderr)
        return 2
    try:
        asyncio.run(asyncio.wait_for(scenario(*args), 6 * TIMEOUT))
    except Failure as e:
        print(f"{name}: FAIL: {e}", file=sys.stderr)
        return 1
    except asyncio.TimeoutError:
        print(f"{name}: FAIL: the whole exchange took over {6 * TIMEOUT}s", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - any error is a failure, said plainly
        print(f"{name}: FAIL: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"{name}: ok ({done})")
    return 0
