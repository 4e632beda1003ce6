"""What the invoked tests add to the cluster (tests/support/cluster.py): a run that sleeps
through an invocation, and fake endpoints (`Flaky`, in front of the handler, fails on
demand)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

import fusee
from tests.support.cluster import Cluster, held_by_nobody
from tests.support.procs import free_port
from tests.support.waiting import eventually


async def sleeps_one_second(
    cluster: Cluster, wid: str, settle: Callable[[fusee.Client], Awaitable[Any]]
) -> None:
    """A run asleep for 1 s wakes through an invocation on time, and nothing holds a shard
    while it sleeps (`settle`: waits until the server's first invocations are over)."""
    cluster.start_handler()
    server = cluster.start_invoked()
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
