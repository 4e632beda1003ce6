"""Signal IDs (docs/engine.md, *Signal IDs*): a signal sent again under an ID its run has
recorded is acknowledged and not recorded twice, while the run is loaded, after it parked,
after a crash and recovery, and after a clean restart."""

from __future__ import annotations

import pytest

import fusee

go = fusee.signal("go", int)


@fusee.workflow("gather")
async def gather(ctx: fusee.Ctx, count: int) -> list[int]:
    got: list[int] = []
    while len(got) < count:
        value = await ctx.wait_for(go, timeout="1h")
        assert value is not None
        got.append(value)
    return got


async def received(t, wid: str) -> int:
    return sum(1 for row in await t.journal(wid) if row["kind"] == "SignalReceived")


@pytest.mark.parametrize("between", ["loaded", "parked", "crash", "restart"])
async def test_a_signal_sent_again_under_its_id_is_recorded_once(kit, between):
    t = await kit(gather, park_after="100ms")
    run = await t.start(gather, "ids-1", 3)
    await run.signal(go, 1, id="first")
    await t.settle()
    if between == "parked":
        await t.advance("1s")
        await t.settle()
        assert "ids-1" not in t.engine.shard_of("ids-1").runs  # out of memory: parked
    elif between == "crash":
        await t.crash()
    elif between == "restart":
        await t.restart()
    run = t.engine.run("ids-1")
    await run.signal(go, 1, id="first")  # the retry of a signal whose answer was lost
    await run.signal(go, 2, id="second")
    await run.signal(go, 2, id="second")
    assert await received(t, "ids-1") == 2
    await run.signal(go, 3)  # no ID: recorded as sent, every time
    assert await t.result("ids-1") == [1, 2, 3]


async def test_signals_without_ids_are_each_recorded(kit):
    t = await kit(gather)
    run = await t.start(gather, "ids-2", 2)
    await run.signal(go, 7)
    await run.signal(go, 7)
    assert await t.result("ids-2") == [7, 7]


async def test_a_signal_id_is_checked_as_a_name(kit):
    t = await kit(gather)
    run = await t.start(gather, "ids-3", 1)
    with pytest.raises(fusee.RejectedError, match="signal ID"):
        await run.signal(go, 1, id="")
