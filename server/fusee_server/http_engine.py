"""The HTTP API served by an engine in this process (`serve(engine, host, port, token=)`),
for an engine opened on a data directory or in memory, with no server: the same routes,
web UI, guard and document as `fusee server --http`, each call answered by the engine itself
as a worker answers the server's (fusee/engine/remote_calls.py).

`Engine.serve(addr, token=)` calls `serve_at`.
"""

from __future__ import annotations

import socket
from typing import Any

from aiohttp import web

from fusee import _secrets
from fusee._errors import RejectedError
from fusee.engine.remote_calls import ServedEngine, answer_here
from fusee.protocol import messages as m
from fusee_server.access import Tokens
from fusee_server.http_guard import Guard, is_loopback
from fusee_server.http_objects import OBJECT_ROUTES
from fusee_server.http_runs import RunsApi
from fusee_server.ui import WebUi, engine_shards

SHUTDOWN_S = 1.0


class EngineCalls:
    """Calls answered by `engine`: `invocations` (nothing invokes an engine) here, the
    rest by the engine's methods."""

    def __init__(self, engine: ServedEngine, shards: int) -> None:
        self.engine = engine
        self.shards = shards

    async def call(self, method: str, shard: int, args: dict[str, Any]) -> m.Answer:
        if method == "invocations":
            return m.Answer(0, m.encode_value({"endpoints": []}))
        return await answer_here(self.engine, m.Call(0, method, shard, m.encode_value(args)))


class Served:
    """The site an engine serves; `close()` stops it (before the engine closes)."""

    def __init__(self, runner: web.AppRunner, port: int, host: str = "127.0.0.1") -> None:
        self.runner = runner
        self.port = port
        # The host served, or loopback for a wildcard (which names no host a caller uses).
        name = "127.0.0.1" if host in ("0.0.0.0", "::", "") else f"[{host}]" if ":" in host else host
        self.url = f"http://{name}:{port}"

    async def close(self) -> None:
        await self.runner.cleanup()


async def serve(engine: Any, host: str = "127.0.0.1", port: int = 7601, token: str | None = None) -> Served:
    """Serve `engine`'s HTTP API on `host:port` (0: a free port) until `close()`. With
    `token` (at least 16 bytes), every request needs it as its bearer (the worker
    scope); without one, listening on loopback, only this machine's names are answered."""
    tokens = Tokens(_secrets.given(token, "token=") if token is not None else None)
    guard = Guard(tokens, tls=False)
    runs = RunsApi(EngineCalls(engine, engine.shard_count))
    app = runs.app(guard, OBJECT_ROUTES)
    WebUi(runs, engine_shards(engine.shard_count)).add_to(app, guard)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        await web.SockSite(runner, sock).start()
    except BaseException:
        sock.close()
        await runner.cleanup()
        raise
    bound = int(sock.getsockname()[1])
    if token is None and is_loopback(host):
        guard.local_port = bound
    return Served(runner, bound, host)


async def serve_at(engine: Any, addr: str, token: str | None = None) -> Served:
    """`serve` on `addr`, `HOST:PORT` (`[::1]:PORT` for IPv6)."""
    host, colon, port = addr.rpartition(":")
    if not colon or not port.isdigit() or not host or int(port) > 65535:
        raise RejectedError(f"serve({addr!r}): expected HOST:PORT (127.0.0.1:7601; port 0 for a free one)")
    return await serve(engine, host.strip("[]"), int(port), token)
