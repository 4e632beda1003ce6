"""Wake-ups that do not wait for loads (docs/engine.md, *Timers, parking, the run index*;
*Durability*): a parked run is loaded LOAD_AHEAD_MS before its bucket begins, so a run due
just after a bucket's start is in memory before its timer; and the steps one flush
releases each run their function before the runs before them go on."""

from __future__ import annotations

import asyncio
import time

import fusee
from fusee.engine.index import BUCKET_MS, LOAD_AHEAD_MS
from fusee.storage import MemoryStorage
from fusee.testing import TestEngine
from fusee.testing.faults import Faults, FaultyStorage

ran: list[tuple[str, str]] = []  # (workflow ID, what): in the order it happened


@fusee.workflow("wakeups-nap")
async def nap(ctx: fusee.Ctx, ms: int) -> float:
    await ctx.sleep("nap", ms)
    woke: float = await ctx.step("woke", lambda: ran.append((ctx.workflow_id, "step")) or time.time())
    ran.append((ctx.workflow_id, "after"))
    return woke


async def test_a_parked_run_due_just_after_a_bucket_starts_is_loaded_before_it(kit):
    ran.clear()
    t = await kit(nap, shards=1, park_after="100ms")
    start = t.now_ms()
    # Due 1 ms into its bucket: loaded at the bucket's start, its load would make it late.
    due = (start + 10_000) // BUCKET_MS * BUCKET_MS + 1
    await t.start(nap, "early", due - start)
    await t.advance("1s")
    shard = t.engine.shards[0]
    assert "early" not in shard.runs  # parked
    # What an invoked worker reports: the timer's bucket, not the load ahead of it.
    assert shard.next_due_ms() == due - 1
    await t.advance(due - 1 - LOAD_AHEAD_MS - t.now_ms())
    await t.settle()
    assert "early" in shard.runs  # loaded ahead, waiting for its own timer
    await t.advance(LOAD_AHEAD_MS // 2)
    assert "early" in shard.runs  # not parked again while its bucket loads
    assert not any(wid == "early" for wid, _ in ran)
    await t.advance(due - t.now_ms())
    assert await t.result("early")
    assert ("early", "step") in ran


async def test_an_invoked_shard_reports_its_runs_bucket_and_loads_it_as_it_opens_for_it(kit):
    """The report's next due time is the parked run's bucket, not the load ahead of it (an
    invocation made for the load would wait out up to 200 ms idle); the shard the server
    opens for it, a lead ahead, loads the bucket at once, before the timer."""
    ran.clear()
    t = await kit(nap, shards=1, park_after="100ms")
    start = t.now_ms()
    bucket = (start + 10_000) // BUCKET_MS * BUCKET_MS
    await t.start(nap, "invoked", bucket + 50 - start)
    await t.advance("1s")
    assert "invoked" not in t.engine.shards[0].runs  # parked
    [report] = await t.engine.close()
    assert report.next_due_ms == bucket - t.now_ms()
    t.clock.set(bucket - 5)  # the server's lead: it invokes a little before the due time
    await t._open()
    await t.settle()
    assert "invoked" in t.engine.shards[0].runs  # loaded by the open, 55 ms before its timer
    assert not ran
    await t.advance(55)
    assert await t.result("invoked")
    assert ("invoked", "step") in ran


async def test_steps_one_flush_releases_run_their_functions_before_any_run_goes_on(kit):
    ran.clear()
    t = await kit(nap, shards=1, flush_on_turn=True)
    ids = [f"together-{i}" for i in range(5)]
    for wid in ids:
        await t.start(nap, wid, 1000)
    await t.advance("1s")
    for wid in ids:
        await t.result(wid)
    steps = [i for i, (_, what) in enumerate(ran) if what == "step"]
    afters = [i for i, (_, what) in enumerate(ran) if what == "after"]
    assert len(steps) == len(afters) == len(ids)
    assert max(steps) < min(afters), ran


effects: list[str] = []  # the workflow IDs whose "after" step ran, each time it ran


@fusee.workflow("wakeups-sleep")
async def sleep_only(ctx: fusee.Ctx, ms: int) -> int:
    await ctx.sleep("nap", ms)
    return ms


@fusee.workflow("wakeups-nap-then-step")
async def nap_then_step(ctx: fusee.Ctx, ms: int) -> int:
    await ctx.sleep("nap", ms)
    return await ctx.step("after", lambda: effects.append(ctx.workflow_id) or len(effects))


async def test_a_step_released_with_a_closes_flush_is_recorded_before_the_close_goes_on():
    """Regression (a step ran twice in one process across a clean close): a close waits
    for a flush, and the same durable position releases a woken run's step behind it.
    The step's function runs; its outcome must be recorded within that release, whose
    end asks for the flush that a store's close still completes. Applied on a later turn
    (as it once was), it came after the close had taken its last checkpoint and let go:
    dropped, or staged with no flush asked, and the next open ran the step again. (Held
    durability reports, as a slow disk delivers them, let the close's wait and the
    wake-up meet in one release.)"""
    effects.clear()
    storage = FaultyStorage(MemoryStorage(1), Faults(delay=1.0, min_turns=8, max_turns=8))
    t = await TestEngine.open(
        workflows=[sleep_only, nap_then_step], shards=1, park_after="1h", storage=storage
    )
    try:
        await t.start(sleep_only, "other", 1000)
        await t.start(nap_then_step, "sleeper", 2000)
        await t.settle()
        shard = t.engine.shards[0]
        t.clock.set(t.now_ms() + 1000)  # `other` ends: records the close will wait for
        closing = asyncio.ensure_future(t.restart())
        for _ in range(4):  # fewer turns than the report is held
            await asyncio.sleep(0)
        assert shard.durability.waiting, "the close waits for its flush"
        t.clock.set(t.now_ms() + 1000)  # `sleeper` wakes: its step waits behind the close
        await closing
        assert effects == ["sleeper"]
        assert await t.result("sleeper") == 1
        assert effects == ["sleeper"]  # not run again after the reopen
    finally:
        await t.close()
