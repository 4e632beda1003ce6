"""An invoked cluster, every part a real process on loopback: `fusee server --invoke`
POSTing to uvicorn serving `handlers.asgi:app` (`Handler`), its metrics read by a
client, and `Flaky`, an endpoint in front of the handler that fails on demand."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

import fusee
from tests.support.procs import Proc, Server, free_port, retry
from tests.support.waiting import eventually

SECRET = "end-to-end-secret-0123456789abcdef"
# An invoked worker's lease lines are DEBUG (docs/server.md): held_by_nobody reads them.
LEASE_LINES = ("--log-level", "debug")


class Handler(Proc):
    """`uvicorn handlers.asgi:app` on a fixed port (the server's endpoint URL names it),
    on `loop` (pinned: with uvloop installed, uvicorn's default would pick it)."""

    def __init__(
        self,
        port: int,
        server_port: int,
        steps: Path | None = None,
        loop: str = "asyncio",
        workflows: str = "tests.server_mode.flows",
    ) -> None:
        env = {
            "FUSEE_URL": f"127.0.0.1:{server_port}",
            "FUSEE_INVOKE_SECRET": SECRET,
            "FUSEE_WORKFLOWS": workflows,
            "FUSEE_INVOKE_TRACE": "1",
        }
        if steps is not None:
            env["FUSEE_TEST_STEPS"] = str(steps)
        args = [
            sys.executable,
            "-m",
            "uvicorn",
            "handlers.asgi:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--loop",
            loop,
        ]
        super().__init__(args, env)
        self.wait_for(r"Uvicorn running on")


class Cluster:
    def __init__(self, procs: list[Proc], tmp: Path, loop: str = "asyncio") -> None:
        self.procs = procs
        self.loop = loop
        self.tmp = tmp
        self.port = free_port()
        self.handler_port = free_port()
        self.secret = tmp / "secret"
        self.secret.write_text(SECRET)
        self.steps = tmp / "steps.txt"
        self.server: Server | None = None
        self.handler: Handler | None = None

    def start_handler(self) -> Handler:
        self.handler = Handler(self.handler_port, self.port, self.steps, self.loop)
        self.procs.append(self.handler)
        return self.handler

    def start_server(self, *extra: str, shards: int = 4) -> Server:
        url = f"http://127.0.0.1:{self.handler_port}/"
        self.server = Server(
            self.tmp / "data",
            "--invoke",
            url,
            "--invoke-secret-file",
            str(self.secret),
            *LEASE_LINES,
            *extra,
            shards=shards,
            listen=f"127.0.0.1:{self.port}",
        )
        self.procs.append(self.server)
        return self.server

    def start_server_config(self, **endpoint: Any) -> Server:
        """`fusee server --invoke-config` naming the handler as its one endpoint, with
        `endpoint`'s settings (`budgetMs=1000`...); again on the same directory and port
        after a kill."""
        config = self.tmp / "invoke.json"
        url = f"http://127.0.0.1:{self.handler_port}/"
        config.write_text(
            json.dumps({"endpoints": [{"url": url, "secretFile": str(self.secret), **endpoint}]})
        )
        self.server = Server(
            self.tmp / "data", "--invoke-config", str(config), *LEASE_LINES, listen=f"127.0.0.1:{self.port}"
        )
        self.procs.append(self.server)
        return self.server

    async def client(self) -> fusee.Client:
        assert self.server is not None
        return await retry(lambda: fusee.Client.connect(self.server.address()))  # type: ignore[union-attr]


async def metrics(client: fusee.Client) -> dict[str, Any]:
    answer: dict[str, Any] = await client.call("invocations", {})
    return answer


async def quiet(client: fusee.Client) -> dict[str, Any]:
    """Once nothing is due or being invoked: the metrics then."""

    async def settled() -> dict[str, Any] | None:
        now = await metrics(client)
        return now if now["invokingShards"] == 0 and now["dueShards"] == 0 else None

    result: dict[str, Any] = await eventually(settled, timeout=30.0, every=0.05)
    return result


def held_by_nobody(server: Server) -> bool:
    """Every lease the server granted was let go of (from its log lines, which need
    LEASE_LINES), and one was granted at least: a server that logs none proves nothing."""
    held: set[int] = set()
    granted = False
    for line in list(server.lines):
        if "leased to" in line:
            held.add(int(line.split("shard ")[1].split(":")[0]))
            granted = True
        elif "shard " in line and ("released by" in line or "let go" in line):
            held.discard(int(line.split("shard ")[1].split(":")[0]))
    return granted and not held


async def sleeps_one_second(
    cluster: Cluster, wid: str, settle: Callable[[fusee.Client], Awaitable[Any]]
) -> None:
    """A run asleep for 1 s wakes through an invocation on time, and nothing holds a shard
    while it sleeps (`settle`: waits until the server's first invocations are over)."""
    cluster.start_handler()
    server = cluster.start_server()
    client = await cluster.client()
    await settle(client)
    began = time.time()
    run = await client.start("sleeper", wid, 1.0)
    await eventually(lambda: held_by_nobody(server), timeout=5, every=0.05)  # nothing runs while it sleeps
    woke = await run.result()
    assert 1.0 <= woke - began < 1.6, woke - began
    await client.close()


class Endpoint:
    """An HTTP endpoint on a loopback port of its own (aiohttp): `handle` answers every POST,
    on any path (the Lambda Invoke API's too)."""

    def __init__(self) -> None:
        self.runner: web.AppRunner | None = None
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    async def handle(self, request: web.Request) -> web.Response:
        raise NotImplementedError

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{path:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


class Flaky(Endpoint):
    """An endpoint in front of the handler that answers `status` (with `headers` and
    `body`) to the first `count` invocations (a platform's throttle, a broken deploy, a
    redirect), then passes them on; `left = 0` brings it up. It counts every POST, on any
    path (the Lambda Invoke API's too)."""

    def __init__(
        self,
        target_port: int,
        status: int,
        count: int,
        retry_after: str | None = None,
        headers: dict[str, str] | None = None,
        body: str = "not now",
    ) -> None:
        self.target = f"http://127.0.0.1:{target_port}/"
        self.status = status
        self.left = count
        self.headers = {**(headers or {}), **({"retry-after": retry_after} if retry_after else {})}
        self.body = body
        self.seen = 0
        super().__init__()

    async def handle(self, request: web.Request) -> web.Response:
        self.seen += 1
        body = await request.read()
        if self.left > 0:
            self.left -= 1
            return web.Response(status=self.status, headers=self.headers, text=self.body)
        async with aiohttp.ClientSession() as session:
            async with session.post(self.target, data=body, headers=dict(request.headers)) as answer:
                return web.Response(
                    status=answer.status, body=await answer.read(), content_type="application/json"
                )
