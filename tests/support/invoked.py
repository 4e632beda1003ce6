"""What the invoked tests add to the cluster (tests/support/cluster.py): a run that sleeps
through an invocation, and fake endpoints (`Flaky`, in front of the handler, fails on
demand)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

import fusee
from fusee import journal as R
from tests.support.cluster import Cluster, held_by_nobody
from tests.support.procs import free_port
from tests.support.waiting import eventually


async def sleeps_one_second(
    cluster: Cluster, wid: str, settle: Callable[[fusee.Client], Awaitable[Any]]
) -> None:
    """A run asleep for 1 s wakes through an invocation for its timer, not before the
    timer's due time, and nothing holds a shard while it sleeps (`settle`: waits until the
    server's first invocations are over). Orderings, not a bound on how late it wakes
    (bench/invoke_cost.py measures that): the step after the sleep ran after the due time
    the journal recorded, and an invocation the handler received after the start names
    the timer as its reason, for the run's shard."""
    handler = cluster.start_handler()
    server = cluster.start_invoked()
    client = await cluster.client()
    await settle(client)
    mark = len(handler.lines)
    run = await client.start("sleeper", wid, 1.0)
    await eventually(lambda: held_by_nobody(server), timeout=5, every=0.05)  # nothing runs while it sleeps
    woke = await run.result()
    journal = (await client.run(wid).describe()).journal
    due_ms = next(rec.due for rec in journal if isinstance(rec, R.TimerStarted))
    assert woke * 1000 >= due_ms, (woke, due_ms)
    received = received_reasons(handler.lines[mark:])
    assert any("timer" in reasons and client.shard_of(wid) in shards for shards, reasons in received), (
        received
    )
    await client.close()


_RECEIVED = re.compile(r" received shards=\[([\d, ]*)\].* reasons=\[([^\]]*)\]")


def received_reasons(lines: list[str]) -> list[tuple[list[int], list[str]]]:
    """(shards, reasons) of each invocation a handler's trace (FUSEE_INVOKE_TRACE=1) says
    it received."""
    found = []
    for line in lines:
        if match := _RECEIVED.search(line):
            shards = [int(s) for s in match.group(1).split(",") if s.strip()]
            found.append((shards, [r.strip(" '") for r in match.group(2).split(",") if r.strip()]))
    return found


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
