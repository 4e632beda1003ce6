"""Patches (docs/engine.md, *Patching*): `ctx.patched(id)` keeps an old and a new branch of
a change in one function. Runs that went past the change under the old code replay the
old branch; new runs, and running ones reaching the change for the first time after the
deploy, take the new one. The choice is a marker with no journal position.

Each deploy below swaps the code and crashes, so recovery replays under the new code.
"""

from __future__ import annotations

import pytest

import fusee
from fusee import journal as R
from fusee.engine.replay import Replayer

calls: list[str] = []


def counted(name: str):
    def fn() -> str:
        calls.append(name)
        return name

    return fn


async def _deploy(t, *workflows) -> None:
    await t.settle()
    t.workflows = list(workflows)
    await t.crash()


async def _kinds(t, wid: str) -> list[str]:
    return [row["kind"] for row in await t.journal(wid)]


@fusee.workflow("fee")
async def fee_v1(ctx: fusee.Ctx) -> list[str]:
    first = await ctx.step("charge", counted("charge"))
    await ctx.sleep("hold", "1h")
    second = await ctx.step("round-down", counted("round-down"))
    return [first, second]


@fusee.workflow("fee")
async def fee_v2(ctx: fusee.Ctx) -> list[str]:
    # Two patches: one before the sleep (old runs asleep went past it), one after.
    if ctx.patched("charge-v2"):
        first = await ctx.step("charge-v2", counted("charge-v2"))
    else:
        first = await ctx.step("charge", counted("charge"))
    await ctx.sleep("hold", "1h")
    if ctx.patched("rounding"):
        second = await ctx.step("round-half", counted("round-half"))
    else:
        second = await ctx.step("round-down", counted("round-down"))
    return [first, second]


@fusee.workflow("fee")
async def fee_v3(ctx: fusee.Ctx) -> list[str]:
    # Once no run predates them: the patches deprecated, only the new branches left.
    ctx.deprecate_patch("charge-v2")
    first = await ctx.step("charge-v2", counted("charge-v2"))
    await ctx.sleep("hold", "1h")
    ctx.deprecate_patch("rounding")
    second = await ctx.step("round-half", counted("round-half"))
    return [first, second]


async def test_a_run_parked_before_the_deploy_takes_the_old_branch_then_the_new(kit):
    calls.clear()
    t = await kit(fee_v1)
    await t.start(fee_v1, "old")
    await _deploy(t, fee_v2)
    await t.advance("1h")
    # Replay went past 'charge-v2' before the patch existed: the old branch, nothing run
    # again. 'rounding' is reached for the first time after the deploy: the new branch.
    assert await t.result("old") == ["charge", "round-half"]
    assert calls == ["charge", "round-half"]
    journal = await t.journal("old")
    assert [row["kind"] for row in journal] == [
        "Started",
        "StepDone",
        "TimerStarted",
        "TimerFired",
        "Patched",
        "StepDone",
        "Finished",
    ]
    assert [row["id"] for row in journal if row["kind"] == "Patched"] == ["rounding"]
    await t.check()
    await t.crash()  # and again after the end: the same branches on every replay
    await t.check()


async def test_a_new_run_takes_every_new_branch_and_its_positions_do_not_move(kit):
    calls.clear()
    t = await kit(fee_v2)
    await t.start(fee_v2, "new")
    await t.advance("1h")
    assert await t.result("new") == ["charge-v2", "round-half"]
    journal = await t.journal("new")
    assert [row["id"] for row in journal if row["kind"] == "Patched"] == ["charge-v2", "rounding"]
    # Markers take no position: the operations are numbered as if there were no patch.
    assert [row["seq"] for row in journal if "seq" in row] == [0, 1, 1, 2]
    await t.crash()
    await t.check()
    assert calls == ["charge-v2", "round-half"]


async def test_a_run_mid_way_under_the_patched_code_replays_its_markers(kit):
    calls.clear()
    t = await kit(fee_v2)
    await t.start(fee_v2, "mid")  # takes charge-v2, then sleeps
    await t.crash()  # replays: the marker says new branch, the step is not run again
    await t.advance("1h")
    assert await t.result("mid") == ["charge-v2", "round-half"]
    assert calls == ["charge-v2", "round-half"]
    await t.check()


async def test_deprecated_patches_replay_runs_that_took_them_and_still_mark_new_runs(kit):
    calls.clear()
    t = await kit(fee_v2)
    await t.start(fee_v2, "before")
    await _deploy(t, fee_v3)
    await t.start(fee_v3, "after")
    await t.advance("1h")
    assert await t.result("before") == ["charge-v2", "round-half"]
    assert await t.result("after") == ["charge-v2", "round-half"]
    # The run started under v3 still carries the markers, so a rollback to v2 replays it
    # down the branches it took.
    for wid in ("before", "after"):
        assert [r["id"] for r in await t.journal(wid) if r["kind"] == "Patched"] == ["charge-v2", "rounding"]
    t.workflows = [fee_v2]
    await t.check()


@fusee.workflow("order")
async def order_v1(ctx: fusee.Ctx) -> list[str]:
    return [await ctx.step("reserve", counted("reserve")), await ctx.step("ship", counted("ship"))]


@fusee.workflow("order")
async def order_v2(ctx: fusee.Ctx) -> list[str]:
    done = [await ctx.step("reserve", counted("reserve"))]
    if ctx.patched("insure"):
        done.append(await ctx.step("insure", counted("insure")))
    done.append(await ctx.step("ship", counted("ship")))
    return done


async def test_a_reset_to_the_patch_point_records_the_marker_when_the_run_goes_live(kit):
    """A reset's copy ends just before the patch: its replay reaches the patch with no
    record past it, so the new branch, and the marker waits until the run is live (in
    the middle of the replay it would precede records the log holds before it)."""
    calls.clear()
    t = await kit(order_v1)
    await t.start(order_v1, "o")
    assert await t.result("o") == ["reserve", "ship"]
    await _deploy(t, order_v2)
    assert await t.engine.run("o").reset("ship") == 2
    assert await t.result("o") == ["reserve", "insure", "ship"]
    assert calls == ["reserve", "ship", "insure", "ship"]
    kinds = await _kinds(t, "o")
    assert kinds == ["Started", "StepDone", "Reset", "Patched", "StepDone", "StepDone", "Finished"]
    await t.crash()
    await t.check()


async def test_a_journal_that_ended_before_the_patch_existed_replays_the_old_branch(kit):
    calls.clear()
    t = await kit(order_v1)
    await t.start(order_v1, "done")
    assert await t.result("done") == ["reserve", "ship"]
    await _deploy(t, order_v2)
    await t.check()  # the end is recorded: the old code went past every point
    assert "Patched" not in await _kinds(t, "done")


async def test_a_stuck_run_names_the_three_fixes(kit):
    t = await kit(fee_v1)
    await t.start(fee_v1, "s")  # asleep after 'charge'

    @fusee.workflow("fee")
    async def renamed(ctx: fusee.Ctx) -> str:
        return await ctx.step("pack", counted("pack"))

    await _deploy(t, renamed)
    with pytest.raises(fusee.DeterminismError) as caught:
        await t.engine.run("s").result()
    message = str(caught.value)
    assert "deploy code that matches its journal" in message
    assert "ctx.patched('<id>')" in message
    assert "run.reset(before_step=...)" in message


@pytest.mark.parametrize("bad", ["", 3, None])
async def test_a_patch_id_is_a_non_empty_string(kit, bad):
    @fusee.workflow("bad-patch")
    async def wf(ctx: fusee.Ctx) -> bool:
        return ctx.patched(bad)

    t = await kit(wf)
    await t.start(wf, "b")
    with pytest.raises(fusee.RejectedError, match="a patch ID is a non-empty string"):
        await t.result("b")


def test_the_replayer_reads_markers_and_takes_no_position_for_them():
    started = R.Started("order", 1, b"null", 0, 0)
    taken = [
        started,
        R.StepDone(0, "reserve", b'"reserve"'),
        R.Patched("insure"),
        R.StepDone(1, "insure", b'"insure"'),
        R.StepDone(2, "ship", b'"ship"'),
        R.Finished("ok", b'["reserve","insure","ship"]'),
    ]
    Replayer([order_v2]).replay(taken, "r")
    before = [started, R.StepDone(0, "reserve", b'"reserve"'), R.StepDone(1, "ship", b'"ship"')]
    before.append(R.Finished("ok", b'["reserve","ship"]'))
    Replayer([order_v2]).replay(before, "r")  # no marker: the old branch, the same positions
    with pytest.raises(
        fusee.DeterminismError, match="recorded step 'ship' here but the code called step 'insure'"
    ):
        Replayer([order_v2]).replay([*before[:2], R.Patched("insure"), *before[2:]], "r")


async def test_a_step_function_may_not_ask_for_a_patch(kit):
    """ctx is for the workflow's code: a step's function asking `patched` is refused, as
    any other ctx call from it is, and nothing is recorded."""

    @fusee.workflow("patch-in-step")
    async def wf(ctx: fusee.Ctx) -> bool:
        return await ctx.step("inner", lambda: ctx.patched("p"), retry=fusee.Retry(attempts=1))

    t = await kit(wf)
    await t.start(wf, "in-step")
    with pytest.raises(fusee.StepError, match=r"ctx.patched called inside a step's function"):
        await t.result("in-step")
    assert "Patched" not in await _kinds(t, "in-step")


BUMP = fusee.update("bump", arg=int, result=bool)


@fusee.workflow("patch-in-update")
async def patch_in_update(ctx: fusee.Ctx) -> None:
    async def bump(n: int) -> bool:
        return ctx.patched("bump-v2")

    ctx.on_update(BUMP, bump)
    await ctx.wait_for("done")


async def test_an_update_handler_takes_a_patch_and_replays_it_after_a_crash(kit):
    t = await kit(patch_in_update)
    run = await t.start(patch_in_update, "upd")
    await t.settle()
    assert await run.update(BUMP, 1) is True
    assert await run.update(BUMP, 2) is True  # the first choice holds for the run
    assert [r["id"] for r in await t.journal("upd") if r["kind"] == "Patched"] == ["bump-v2"]
    await t.crash()
    await t.engine.run("upd").signal("done")
    assert await t.result("upd") is None
    await t.check()
