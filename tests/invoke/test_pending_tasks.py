"""An invocation leaves nothing running behind it: the handler runs in this process (an
aiohttp endpoint in front of `InvocationHandler.invoke`), behind a real `fusee server
--invoke`, so the test sees the handler's event loop. Its invocations end with clients'
`result()` calls waiting on runs asleep (answered MOVED_WAITING and routed to the next
holder): once the invocation is over, no task of the engine's may be left pending, and
asyncio's own "Task was destroyed but it is pending!" is an error here."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from fusee.invoke import invocation_handler
from tests.server_mode import flows
from tests.support.cluster import SECRET, Cluster, held_by_nobody, quiet
from tests.support.invoked import Endpoint
from tests.support.procs import Proc
from tests.support.waiting import eventually

SLEEPERS = 20


class InProcess(Endpoint):
    """The handler, served on the cluster's handler port, in this process."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.port = cluster.handler_port
        self.handler = invocation_handler(
            f"127.0.0.1:{cluster.port}", workflows=flows.WORKFLOWS, secret=SECRET, trace=False
        )

    async def handle(self, request: web.Request) -> web.Response:
        status, headers, body = await self.handler.invoke(list(request.headers.items()), await request.read())
        return web.Response(status=status, body=body, headers=dict(headers))


class Destroyed(logging.Handler):
    """asyncio's log of a task garbage-collected while pending."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Task was destroyed but it is pending" in message:
            self.found.append(message)


@pytest.fixture
def destroyed() -> Iterator[Destroyed]:
    found = Destroyed()
    logging.getLogger("asyncio").addHandler(found)
    try:
        yield found
    finally:
        logging.getLogger("asyncio").removeHandler(found)


def engine_tasks() -> list[asyncio.Task[Any]]:
    """The pending tasks running the engine's or the invocation's code."""
    found = []
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None)
        filename = code.co_filename if code is not None else ""
        if not task.done() and ("/fusee/engine/" in filename or "/fusee/invoke/" in filename):
            found.append(task)
    return found


@pytest.fixture
def cluster(procs: list[Proc], tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, procs=procs)


async def test_an_invocation_ending_with_results_waiting_leaves_no_task_pending(cluster, destroyed):
    # asyncio reports a task destroyed while pending to the loop's exception handler (it
    # logs it, unless a handler of the application's takes it): both are watched.
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if "Task was destroyed but it is pending" in str(context.get("message")):
            destroyed.found.append(str(context.get("task")))
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    try:
        await _invocations_end_with_results_waiting(cluster, destroyed)
    finally:
        loop.set_exception_handler(previous)


async def _invocations_end_with_results_waiting(cluster: Cluster, destroyed: Destroyed) -> None:
    endpoint = InProcess(cluster)
    await endpoint.start()
    try:
        server = cluster.start_invoked()
        client = await cluster.client()
        await quiet(client)
        runs = [await client.start("sleeper", f"nap-{i}", 1.0) for i in range(SLEEPERS)]
        # Asked at once, while the start's invocation holds the shards: each waits there,
        # and is answered MOVED_WAITING when the invocation lets its shard go.
        results = [asyncio.ensure_future(run.result()) for run in runs]
        await eventually(lambda: held_by_nobody(server), timeout=5, every=0.05)  # the invocations are over
        assert not any(result.done() for result in results)
        await asyncio.sleep(0.05)  # what the invocation cancelled has run its cancellation
        left = engine_tasks()
        assert not left, [task.get_coro() for task in left]
        gc.collect()
        assert not destroyed.found, destroyed.found
        woke = await asyncio.gather(*results)
        assert len(woke) == SLEEPERS
        await eventually(lambda: held_by_nobody(server), timeout=5, every=0.05)
        await asyncio.sleep(0.05)
        left = engine_tasks()
        assert not left, [task.get_coro() for task in left]
        gc.collect()
        assert not destroyed.found, destroyed.found
        await client.close()
    finally:
        await endpoint.stop()
