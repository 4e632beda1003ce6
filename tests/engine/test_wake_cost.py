"""What a woken run costs, counted rather than timed (issue 19: no per-run work repeated):
a `result()` waiting on a parked run reads the run's frame once, and not again once the
run has ended; a frame asked for twice in one loop turn is read once; a loaded run's next
due time is its heap's top, the shard's sweep kept apart."""

from __future__ import annotations

import asyncio
from typing import Any

import fusee
from fusee.engine.index import BUCKET_MS, LOAD_AHEAD_MS
from fusee.testing import TestEngine


@fusee.workflow("wake-cost-nap")
async def nap(ctx: fusee.Ctx, ms: int) -> str:
    await ctx.sleep("nap", ms)
    return await ctx.step("woke", lambda: "up")


def count_frames_read(t: TestEngine) -> list[int]:
    """How many run-store frames the (only) shard reads from now on."""
    store: Any = t.engine.shards[0].store
    read = [0]
    get_runs = store.get_runs

    async def counted(offsets: Any) -> list[bytes]:
        read[0] += len(offsets)
        return list(await get_runs(offsets))

    store.get_runs = counted
    return read


async def parked_nap(t: TestEngine, wid: str) -> int:
    """A nap parked, due 50 ms into a bucket 10 s ahead: its due time."""
    start = t.now_ms()
    due = (start + 10_000) // BUCKET_MS * BUCKET_MS + 50
    await t.start(nap, wid, due - start)
    await t.advance("1s")
    assert wid not in t.engine.shards[0].runs  # parked
    return due


async def test_a_result_waiting_on_a_parked_run_reads_its_frame_once(kit):
    t = await kit(nap, shards=1, park_after="100ms")
    due = await parked_nap(t, "a")
    # Asked for shortly before its bucket loads (as a call routed to the invocation made
    # for it): loaded by the call, not parked again before its timer.
    await t.advance(due // BUCKET_MS * BUCKET_MS - LOAD_AHEAD_MS - 60 - t.now_ms())
    read = count_frames_read(t)
    waiting = asyncio.ensure_future(t.engine.run("a").result())
    await t.settle()
    assert read[0] == 1  # the call loaded it
    await t.advance(due + 10 - t.now_ms())
    assert await asyncio.wait_for(waiting, 5) == "up"
    # Its end was handed to the waiting call: not read back from the run store.
    assert read[0] == 1


async def test_a_frame_asked_for_twice_in_one_turn_is_read_once(kit):
    t = await kit(nap, shards=1, park_after="100ms")
    await parked_nap(t, "b")
    shard = t.engine.shards[0]
    ref = shard.index_entries.get("b").ref  # type: ignore[union-attr]
    read = count_frames_read(t)
    # As a woken run's load and a result() call's, asked for in the same loop turn.
    first, second = await asyncio.gather(shard.loader.reads.read([ref]), shard.loader.reads.read([ref, ref]))
    assert read[0] == 1
    assert second == [first[0], first[0]] and first[0]


async def test_a_loaded_runs_next_due_time_is_its_timer_and_nothing_once_it_ended(kit):
    t = await kit(nap, shards=1, park_after="1h")
    start = t.now_ms()
    await t.start(nap, "c", 5_000)
    await t.settle()
    timers = t.engine.shards[0].timers
    assert timers.next_due_ms() == start + 5_000
    assert all(entry[0] != start + 5_000 for entry in timers.ticks)  # the sweep's apart
    await t.advance("6s")
    assert await t.engine.run("c").result() == "up"
    # The fired timer's entry is gone from the top, though the sweep still ticks.
    assert timers.next_due_ms() == 0
    assert not timers.heap
