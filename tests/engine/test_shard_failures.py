"""A shard that fails stops alone, says why, and never wedges the rest: a run-store write
the disk refuses, step functions that never return, a load under way. Failures are
injected at the disk's edge (a real data directory whose run-store write raises OSError as
a full disk would). Each test here failed before its fix."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.storage import MemoryShardStore, MemoryStorage
from fusee.testing import TestEngine
from tests.support.engine_kit import slow_reads


@fusee.workflow("quick")
async def quick(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: n * 2)


def two_ids(t: TestEngine) -> tuple[str, str]:
    a = "q-0"
    b = next(f"q-{i}" for i in range(1, 100) if t.engine.shard_index(f"q-{i}") != t.engine.shard_index(a))
    return a, b


def refuse_run_store(store: Any) -> None:
    """The disk under a local shard's run store fills up."""
    files = store.files

    class Full:
        def __getattr__(self, name: str) -> Any:
            return getattr(files, name)

        def append_run(self, offset: int, frame: bytes) -> None:
            raise OSError(28, "No space left on device")

    store.files = Full()


async def test_a_run_store_write_refused_in_a_flush_callback_stops_that_shard_alone(tmp_path: Path):
    t = await TestEngine.open([quick], shards=2, dir=tmp_path / "data")
    a, b = two_ids(t)
    bad = t.engine.shard_of(a)
    refuse_run_store(bad.store)
    # The end of a is released by the flush that also acknowledges b's start: the frame a
    # writes then fails inside the writer's callback, which serves both shards.
    first = asyncio.ensure_future(t.start(quick, a, 1))
    await asyncio.sleep(0)
    run_b = await asyncio.wait_for(t.start(quick, b, 2), 5)
    await first
    with pytest.raises(fusee.IoError, match="run store"):
        await asyncio.wait_for(t.engine.run(a).result(), 5)
    assert await asyncio.wait_for(run_b.result(), 5) == 4
    # The stopped shard left the engine: its calls fail at once, naming why.
    assert bad not in t.engine.shards
    with pytest.raises(fusee.IoError, match="run store"):
        await asyncio.wait_for(t.start(quick, a + "-again", 3), 5) if t.engine.shard_index(
            a + "-again"
        ) == bad.index else await asyncio.wait_for(t.engine.run(a).status(), 5)
    assert all(shard.idle() for shard in t.engine.shards)
    await asyncio.wait_for(t.close(), 10)
    # Reopened, what was acknowledged is there.
    t = await TestEngine.open([quick], shards=2, dir=tmp_path / "data")
    assert await t.result(b) == 4
    assert await t.result(a) == 2
    await t.close()


release = threading.Event()


def stuck() -> str:
    release.wait(20)
    return "late"


@fusee.workflow("hung")
async def hung(ctx: fusee.Ctx) -> str:
    result: str = await ctx.step("stuck", stuck, timeout="20ms", retry=fusee.Retry(attempts=2, initial=1))
    return result


@fusee.workflow("threaded")
async def threaded(ctx: fusee.Ctx) -> str:
    result: str = await ctx.step("t", lambda: "ran", thread=True)
    return result


async def test_timed_out_sync_steps_starve_neither_thread_steps_nor_checkpoints(tmp_path: Path):
    """Twelve attempts of synchronous steps time out and keep their threads (Python cannot
    stop one), more than the loop's default executor holds on this machine: thread steps
    still run, and a checkpoint and a close still finish, on threads of their own."""
    release.clear()
    t = await TestEngine.open([hung, threaded], shards=2, dir=tmp_path / "data")
    try:
        for n in range(6):
            await t.start(hung, f"h-{n}")
        for n in range(6):
            with pytest.raises(fusee.StepError):
                await t.result(f"h-{n}")
        await t.start(threaded, "t-1")
        assert await asyncio.wait_for(t.result("t-1"), 5) == "ran"
        for shard in t.engine.shards:
            await asyncio.wait_for(shard.checkpoint(wait=True), 5)
        await asyncio.wait_for(t.close(), 5)
    finally:
        release.set()


@fusee.workflow("napper")
async def napper(ctx: fusee.Ctx) -> str:
    got: str = await ctx.wait_for("wake")
    return got


async def test_a_shard_is_not_idle_while_a_parked_run_loads_for_a_call():
    clock = fusee.VirtualClock()
    engine = await fusee.Engine.open(workflows=[napper], storage=slow_reads(1), clock=clock, park_after="1s")
    await engine.start(napper, "n-1")
    await asyncio.sleep(0)  # its first turn
    clock.set(clock.now_ms() + 5_000)  # the sweep parks it
    await asyncio.sleep(0)
    shard = engine.shards[0]
    assert not shard.runs and shard.idle()
    signal = asyncio.ensure_future(engine.run("n-1").signal("wake", "up"))
    await asyncio.sleep(0.01)  # the load is under way
    assert not shard.idle()
    await signal
    assert await engine.run("n-1").result() == "up"
    await engine.close()


class BrokenCheckpoints(MemoryStorage):
    """Memory storage whose checkpoint write hits a bug (not an I/O error)."""

    def __init__(self, shards: int) -> None:
        super().__init__(shards)
        self.stores = [BrokenCheckpointStore() for _ in range(shards)]


class BrokenCheckpointStore(MemoryShardStore):
    async def checkpoint(self, position: int, data: bytes) -> None:
        raise RuntimeError("a bug in the checkpoint writer")


async def test_a_shard_task_that_fails_stops_its_shard_and_its_callers_hear_of_it():
    """A shard's tasks (a timed checkpoint here) are its task group: one that fails stops
    the shard with the error, and a caller waiting on it gets IoError naming it, instead
    of the failure ending as a line in the loop's log while the caller waits for ever."""
    clock = fusee.VirtualClock()
    engine = await fusee.Engine.open(
        workflows=[napper], storage=BrokenCheckpoints(1), clock=clock, park_after="1s"
    )
    try:
        await engine.start(napper, "parks")
        waiting = asyncio.ensure_future(engine.start(napper, "waits"))
        run = await waiting
        result = asyncio.ensure_future(run.result())
        await asyncio.sleep(0)
        clock.set(clock.now_ms() + 5_000)  # both park: the idle shard checkpoints, and fails
        with pytest.raises(fusee.IoError, match="a bug in the checkpoint writer"):
            await asyncio.wait_for(result, 5)
        assert not engine.shards and 0 in engine.stopped
        with pytest.raises(fusee.IoError, match="internal error"):
            await engine.run("parks").status()
    finally:
        engine.abandon()
