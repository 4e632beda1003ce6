"""A client waiting on results through the server while the worker's timers wake the
parked runs (issue 17, item 28, relayed): each `result()` goes to the shard's holder, whose
engine reads the parked run's frame back from the server as the run's own timer wakes it
there. Every wait is answered once its run ended."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

import fusee
from fusee.testing.faults import held_read
from tests.support.engine_kit import napper, parked_ref
from tests.support.waiting import eventually

RUNS = 300


async def advance(clock: fusee.VirtualClock, ms: int) -> None:
    """Move a worker's virtual clock in steps, with real time between them for what goes
    over the wire (flushes, reads) to come back."""
    for _ in range(ms // 50):
        clock.set(clock.now_ms() + 50)
        await asyncio.sleep(0.01)


async def test_a_relayed_result_asked_while_the_timer_wakes_the_run_and_it_finishes_answers(start_server):
    """The race of tests/engine/test_waits.py through the server: the client's result()
    goes to the worker, whose engine reads the parked run's frame back from the server
    while the run's timer wakes it and it ends."""
    server = start_server(shards=1)
    clock = fusee.VirtualClock()
    engine = await fusee.Engine.open(
        durability="server", address=server.address(), workflows=[napper], clock=clock, park_after="100ms"
    )
    client = await fusee.Client.connect(server.address())
    try:
        await client.start("waits.napper", "n-1", 1_000)
        await advance(clock, 500)
        shard = engine.shard_of("n-1")
        with held_read(shard.store, (await eventually(lambda: [parked_ref(engine, "n-1")]))[0]) as held:
            waiting = asyncio.ensure_future(client.run("n-1").result())
            await asyncio.wait_for(held.asked.wait(), 5)
            await advance(clock, 600)  # the timer wakes it (its own read goes through) and it ends
            await eventually(lambda: shard.index_entries.get("n-1").status == "ok")  # type: ignore[union-attr]
            held.release()
            assert await asyncio.wait_for(waiting, 5) == 1_000
    finally:
        await client.close()
        await engine.close()


@pytest.mark.timeout(60)
async def test_results_relayed_as_the_workers_timers_wake_the_parked_runs(start_server, start_worker):
    server = start_server()
    start_worker(server.address())  # parks a run idle for 200 ms
    client = await fusee.Client.connect(server.address())
    tasks: dict[str, asyncio.Future[float]] = {}
    try:
        rng = random.Random(28)
        naps = {f"nap-{i}": rng.uniform(0.6, 1.4) for i in range(RUNS)}
        began = time.monotonic()
        await asyncio.gather(*(client.start("sleeper", wid, s) for wid, s in naps.items()))
        await asyncio.sleep(max(0.0, began + 0.45 - time.monotonic()))  # parked, none due yet
        tasks = {wid: asyncio.ensure_future(client.run(wid).result()) for wid in naps}
        await asyncio.wait(list(tasks.values()), timeout=began + 1.4 + 3.0 - time.monotonic())
        waiting = [wid for wid, task in tasks.items() if not task.done()]
        for wid in waiting:
            assert (await client.run(wid).status()).status == "ok", wid  # it ended, durably
        if waiting:
            await asyncio.wait([tasks[wid] for wid in waiting], timeout=2.0)
        lost = [wid for wid in waiting if not tasks[wid].done()]
        assert not lost, f"{len(lost)} relayed results never came though their runs ended: {lost[:5]}"
        assert all(isinstance(task.result(), float) for task in tasks.values())
    finally:
        for task in tasks.values():
            task.cancel()
        await client.close()
