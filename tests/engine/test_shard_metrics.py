"""`engine.shard_metrics()` (docs/telemetry.md, *Metrics per shard*): one dict of counters
per shard, the shard number its position, counted where each event happens."""

from __future__ import annotations

import fusee
from fusee.engine.shard_metrics import COUNTERS


@fusee.workflow("metered")
async def metered(ctx: fusee.Ctx, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step(f"s{i}", lambda i=i: i)
    await ctx.sleep("nap", "1h")
    return total


async def test_each_shard_counts_its_own_records_flushes_steps_parks_and_replays(kit):
    t = await kit(metered, shards=4)
    index = t.engine.shard_index("m-1")
    before = t.engine.shard_metrics()
    assert len(before) == 4 and all(set(row) == set(COUNTERS) for row in before)
    await t.start(metered, "m-1", 5)
    await t.settle()
    await t.advance("2s")  # it sleeps: parked once its second of quiet is over
    after = t.engine.shard_metrics()
    mine = after[index]
    assert mine["steps_executed"] == 5
    assert mine["records"] >= 5 + 2  # its start, five results, the timer
    assert mine["bytes"] > mine["records"] * 8
    assert mine["parks"] == 1
    assert all(row == before[i] for i, row in enumerate(after) if i != index)  # the others untouched
    # Memory storage durable on append has no flush; a disk and a flush a turn later do.
    if not getattr(t.storage.stores[index], "instant", False):
        # Records become durable a turn (or a disk write) later: flushes, and steps that
        # waited at the gate for the record before them.
        assert mine["flushes"] >= 1 and mine["flushed_records"] >= mine["flushes"]
        assert mine["gated_waits"] >= 1
    await t.crash()
    assert await t.result("m-1") == 10
    again = t.engine.shard_metrics()[index]
    # Each load replays the five results (once or more: it may park again before its timer).
    assert again["steps_replayed"] >= 5 and again["steps_replayed"] % 5 == 0
    assert again["steps_executed"] == 0
    shard = t.engine.by_index[index]
    await shard.checkpoint(wait=True)
    assert t.engine.shard_metrics()[index]["checkpoints"] >= 1


async def test_a_run_that_no_longer_matches_its_code_counts_a_determinism_error(kit):
    @fusee.workflow("drifting")
    async def before(ctx: fusee.Ctx, _: None) -> str:
        await ctx.step("a", lambda: 1)
        return await ctx.wait_for(fusee.signal("go", str), timeout="1h")

    t = await kit(before)
    await t.start(before, "d-1")
    await t.settle()
    index = t.engine.shard_index("d-1")

    @fusee.workflow("drifting")
    async def after(ctx: fusee.Ctx, _: None) -> str:
        await ctx.step("b", lambda: 1)  # another step where the journal has "a"
        return "changed"

    t.workflows = [after]
    await t.crash()
    await t.engine.run("d-1").signal("go", "x")  # loads it: the replay finds the change
    await t.settle()
    assert t.engine.shard_metrics()[index]["determinism_errors"] == 1
