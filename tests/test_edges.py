"""Edges the mutation run (scripts/mutation, docs/mutation.md) found untested: each test
here fails under a mutant that survived the rest of the suite, and asserts what a user or
the guarantees care about, through the public API or, for what invoked workers and the
shard read (the run index, the outbox, idle and next due), through the engine's own
objects."""

from __future__ import annotations

from typing import Any

import fusee
from fusee._index import RunIndex
from fusee._messages import IndexEntry
from fusee.testing import TestEngine
from tests.conftest import eventually
from tests.test_shard_failures import SlowReads

woken: list[str] = []


@fusee.workflow("edges-nap")
async def nap(ctx: fusee.Ctx, seconds: int) -> int:
    """Sleeps, then has an effect of its own: what a reminder or an expiry does."""
    await ctx.sleep("nap", seconds * 1000)
    await ctx.step("after", lambda: woken.append(ctx.workflow_id))
    return seconds


def _parked(t: Any, count: int) -> bool:
    shard = t.engine.shards[0]
    return not shard.runs and len(shard.index_entries) == count


# -- the run index: parked runs wake on their own timers -------------------------------------


async def test_runs_parked_until_the_same_moment_all_wake_on_their_own(kit):
    """Runs due in one 100 ms bucket are all listed in it and all loaded when it comes due,
    each under its own key: nobody calls them, their timers alone bring the step after the
    sleep (a bucket's list replaced by its last run, or wakes that share one load, leave
    the others asleep for good)."""
    woken.clear()
    t = await kit(nap, shards=1, park_after="100ms")
    for n in range(3):
        await t.start(nap, f"same-{n}", 10)
    await t.advance("1s")
    assert _parked(t, 3)
    await t.advance("10s")
    await eventually(lambda: sorted(woken) == ["same-0", "same-1", "same-2"])


async def test_runs_that_wake_together_from_a_slow_run_store_each_load_their_own_frame():
    """Wakes by timer are loads keyed by each run's index key: with a run store whose reads
    take a while (a remote one), the second wake must not wait on the first's load and
    take that run for its own."""
    woken.clear()
    t = await TestEngine.open([nap], shards=1, park_after="100ms", storage=SlowReads(1))
    try:
        for n in range(3):
            await t.start(nap, f"slow-{n}", 10)
        await t.advance("1s")
        assert _parked(t, 3)
        await t.advance("10s")
        await eventually(lambda: sorted(woken) == ["slow-0", "slow-1", "slow-2"])
    finally:
        await t.close()


async def test_runs_whose_timers_passed_while_the_engine_was_closed_all_wake(kit):
    """An engine that opens after several buckets came due (an invoked worker started late,
    a machine that slept) wakes the runs of every one of them, not only the last."""
    woken.clear()
    t = await kit(nap, shards=1, park_after="100ms")
    for n, seconds in enumerate((10, 20, 30)):
        await t.start(nap, f"late-{n}", seconds)
    await t.advance("1s")
    assert _parked(t, 3)
    await t.close()
    t.clock.set(t.now_ms() + 60_000)
    await t.restart()
    await eventually(lambda: sorted(woken) == ["late-0", "late-1", "late-2"])


def test_the_run_index_keeps_each_runs_type_and_offset_past_65536_entries():
    """A type is numbered once, however many runs of it are parked: a number per entry
    would pass the 16 bits the packed value gives it and spill into the frame offset."""
    index = RunIndex()
    for n in range(70_000):
        index.put(f"run-{n}", IndexEntry(f"run-{n}", 1 + n % 3, "a" if n % 2 else "b", "ok", n * 64))
    for n in (0, 1, 65_535, 65_536, 65_537, 69_999):
        entry = index.get(f"run-{n}")
        assert entry is not None
        assert (entry.type, entry.ref, entry.run_no, entry.status) == (
            "a" if n % 2 else "b",
            n * 64,
            1 + n % 3,
            "ok",
        )
