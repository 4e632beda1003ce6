"""The product on a uvloop event loop. `uvicorn[standard]` installs uvloop and then serves
the invocation handler on it by default, and an application may run its workers and
clients on it too. uvloop differs from asyncio where it bit us: its transports are not
`asyncio.Transport` subclasses (every connection failed), and its `loop.time()` moves in
whole milliseconds once per loop turn (shard opens and handler answers measured 0 ms).
Every part is a real process on loopback, as in test_end_to_end.py."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest
import uvloop

import fusee
from tests.server_mode.flows import WORKFLOWS
from tests.support.cluster import Cluster, held_by_nobody, metrics, quiet
from tests.support.invoked import sleeps_one_second
from tests.support.procs import Proc, Server, retry
from tests.support.waiting import eventually


@pytest.fixture
def cluster(procs: list[Proc], tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, procs=procs, loop="uvloop")


def runs_uvloop(proc: Proc) -> bool:
    """Whether uvloop's loop extension is loaded in `proc` (uvicorn imports it only to
    run on it: `--loop asyncio` never does)."""
    return "uvloop/loop.cpython" in Path(f"/proc/{proc.popen.pid}/maps").read_text()


async def settled(client: fusee.Client, timeout: float = 10.0) -> dict[str, Any]:
    """`quiet`, failing well inside the test's timeout (invoked workers that cannot
    connect keep their shards due, backing off, for ever)."""
    try:
        return await asyncio.wait_for(quiet(client), timeout)
    except TimeoutError:
        raise AssertionError(f"still invoking after {timeout} s: {await metrics(client)}") from None


async def test_the_handler_under_uvicorn_on_uvloop_runs_a_start_and_measures_its_opens(cluster):
    handler = cluster.start_handler()
    assert runs_uvloop(handler), "uvicorn --loop uvloop did not load uvloop"
    server = cluster.start_invoked()
    client = await cluster.client()
    await settled(client)  # the start's invocation of every shard, done
    run = await client.start("steps", "uv-first", 3)
    assert len(await run.result()) == 3
    endpoint = (await settled(client))["endpoints"][0]
    assert endpoint["succeeded"] >= 1 and endpoint["failed"] == 0, endpoint
    # Engines' open times as the workers reported them: 0 when timed by uvloop's clock.
    assert endpoint["openUsTotal"] > 0, endpoint
    # Every answer's summary timed too (an answer spans loop turns: > 0 on either clock).
    answered = [
        float(found.group(1))
        for line in list(handler.lines)
        if (found := re.search(r"answered status=200 elapsed_ms=([\d.]+)", line))
    ]
    assert answered and all(ms > 0 for ms in answered), "\n".join(handler.lines[-40:])
    await eventually(lambda: held_by_nobody(server), timeout=10, every=0.05)
    await client.close()


async def test_a_one_second_sleep_is_invoked_again_on_time_on_uvloop(cluster):
    await sleeps_one_second(cluster, "uv-nap", settled)


async def on_uvloop(address: str) -> dict[str, Any]:
    """A long-lived worker and a client on the running loop (uvloop's): starts, a signal,
    results, both closed."""
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    async with asyncio.timeout(10):
        engine = await fusee.Engine.open(durability="server", address=address, workflows=WORKFLOWS)
        shards = [shard.index for shard in engine.shards]
        try:
            client = await retry(lambda: fusee.Client.connect(address))
            try:
                waiting = await client.start("waiter", "uv-waiter", 2)
                runs = [await client.start("steps", f"uv-{i}", 3) for i in range(6)]
                await waiting.signal("go", 7)
                await client.run("uv-waiter").signal("go", 8)
                results = [await run.result() for run in runs]
                waited = await waiting.result()
                listed = sorted([row.id async for row in client.list(type="steps")])
            finally:
                await client.close()
        finally:
            reports = await engine.close()
    return {
        "shards": shards,
        "results": results,
        "waited": waited,
        "listed": listed,
        "closed": sorted(report.shard for report in reports),
    }


async def test_a_worker_and_a_client_on_a_uvloop_loop(procs, tmp_path):
    server = Server(tmp_path / "data")
    procs.append(server)
    # The test itself runs on asyncio: the uvloop loop runs on a thread of its own.
    got = await asyncio.to_thread(uvloop.run, on_uvloop(server.address()))
    assert got["shards"] == [0, 1, 2, 3]
    assert got["waited"] == [7, 8]
    assert len(got["results"]) == 6
    for result in got["results"]:
        assert len(result) == 3 and all(value.startswith(f"{os.getpid()}:") for value in result), result
    assert got["listed"] == sorted(f"uv-{i}" for i in range(6))
    assert got["closed"] == [0, 1, 2, 3]
    await eventually(lambda: held_by_nobody(server), timeout=5, every=0.05)
    assert server.stop() == 0
