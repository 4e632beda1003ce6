"""Code that no longer matches its journal: a deploy between a crash and the replay.

Each test starts a run under version 1 of a workflow, lets it record some operations,
then swaps in version 2 (the same workflow name) and crashes, so recovery replays the
journal against the new code. Also `fusee.engine.replay.Replayer` used directly.
"""

from __future__ import annotations

import asyncio

import pytest

import fusee
from fusee import journal as R
from fusee.engine.replay import Replayer

calls: list[str] = []


def counted(name: str, value: object = None):
    def fn() -> object:
        calls.append(name)
        return value if value is not None else name

    return fn


async def _stuck_error(t, wid: str) -> fusee.DeterminismError:
    """result() of a stuck run raises at once under the dev profile (no timer, no waiting)."""
    with pytest.raises(fusee.DeterminismError) as caught:
        await asyncio.wait_for(t.engine.run(wid).result(), 5)
    assert caught.value.code == "Determinism"
    return caught.value


async def _deploy(t, *workflows) -> None:
    """Swap the registered code and crash: every run recovers under the new code."""
    await t.settle()
    t.workflows = list(workflows)
    await t.crash()


# -- a renamed step -----------------------------------------------------------------------------


@fusee.workflow("pay")
async def pay_v1(ctx: fusee.Ctx, amount: int) -> str:
    charged = await ctx.step("charge", counted("charge"))
    await ctx.sleep("hold", "1h")
    return f"{charged}:{amount}"


@fusee.workflow("pay")
async def pay_v2(ctx: fusee.Ctx, amount: int) -> str:
    refunded = await ctx.step("refund", counted("refund"))
    await ctx.sleep("hold", "1h")
    return f"{refunded}:{amount}"


async def test_renamed_step_is_a_determinism_error(kit):
    calls.clear()
    t = await kit(pay_v1)
    await t.start(pay_v1, "pay-1", 10)
    await _deploy(t, pay_v2)
    error = await _stuck_error(t, "pay-1")
    assert "recorded step 'charge' here but the code called step 'refund'" in str(error)
    assert "'pay-1'" in str(error)
    assert (await t.engine.run("pay-1").status()).status == "stuck"
    assert calls == ["charge"]  # the new code's step never ran
    # The journal is unchanged: replay appended nothing.
    assert [row["kind"] for row in await t.journal("pay-1")] == ["Started", "StepDone", "TimerStarted"]


async def test_stuck_run_continues_once_matching_code_is_deployed(kit):
    calls.clear()
    t = await kit(pay_v1)
    await t.start(pay_v1, "pay-2", 7)
    await _deploy(t, pay_v2)
    await _stuck_error(t, "pay-2")
    await _deploy(t, pay_v1)  # fix 1: deploy code that matches the journal
    assert await t.result("pay-2") == "charge:7"
    assert calls == ["charge"]
    await t.check()


async def test_stuck_run_keeps_its_journal_across_a_clean_restart(kit):
    """A stuck run waits unchanged: a clean close (which checkpoints) must keep its whole
    journal, so the fixed code replays it and the recorded step does not run again."""
    calls.clear()
    t = await kit(pay_v1)
    await t.start(pay_v1, "pay-3", 9)
    await _deploy(t, pay_v2)
    await _stuck_error(t, "pay-3")
    await t.engine.close()  # a clean close, while the run is stuck
    await _deploy(t, pay_v1)  # reopen on the same storage with matching code
    assert await t.result("pay-3") == "charge:9"
    assert calls == ["charge"]
    assert [row["kind"] for row in await t.journal("pay-3")] == [
        "Started",
        "StepDone",
        "TimerStarted",
        "TimerFired",
        "Finished",
    ]
    await t.check()


async def test_other_runs_are_not_affected(kit):
    calls.clear()
    t = await kit(pay_v1)
    await t.start(pay_v1, "old", 1)
    await _deploy(t, pay_v2)
    await t.start(pay_v2, "new", 2)  # a run that starts under the new code is fine
    assert await t.result("new") == "refund:2"
    await _stuck_error(t, "old")
    summaries = {s.id: s.status async for s in t.engine.list(type="pay")}
    assert summaries == {"old": "stuck", "new": "ok"}


# -- a step added before the others -----------------------------------------------------------


@fusee.workflow("ship")
async def ship_v1(ctx: fusee.Ctx) -> list[str]:
    packed = await ctx.step("pack", counted("pack"))
    await ctx.sleep("wait", "1h")
    return [packed]


@fusee.workflow("ship")
async def ship_v2(ctx: fusee.Ctx) -> list[str]:
    weighed = await ctx.step("weigh", counted("weigh"))
    packed = await ctx.step("pack", counted("pack"))
    await ctx.sleep("wait", "1h")
    return [weighed, packed]


async def test_step_added_before_others(kit):
    calls.clear()
    t = await kit(ship_v1)
    await t.start(ship_v1, "ship-1")
    await _deploy(t, ship_v2)
    error = await _stuck_error(t, "ship-1")
    assert "recorded step 'pack' here but the code called step 'weigh'" in str(error)
    assert "position 0" in str(error)
    assert calls == ["pack"]


# -- a step removed ---------------------------------------------------------------------------------


@fusee.workflow("audit")
async def audit_v1(ctx: fusee.Ctx) -> str:
    await ctx.step("load", counted("load"))
    await ctx.step("verify", counted("verify"))
    await ctx.sleep("cool", "1h")
    return "v1"


@fusee.workflow("audit")
async def audit_v2_middle(ctx: fusee.Ctx) -> str:
    await ctx.step("load", counted("load"))
    await ctx.sleep("cool", "1h")
    return "v2"


@fusee.workflow("audit")
async def audit_v2_tail(ctx: fusee.Ctx) -> str:
    await ctx.step("load", counted("load"))
    return "v2"


async def test_step_removed_before_a_later_operation(kit):
    calls.clear()
    t = await kit(audit_v1)
    await t.start(audit_v1, "audit-1")
    await _deploy(t, audit_v2_middle)
    error = await _stuck_error(t, "audit-1")
    assert "recorded step 'verify' here but the code called sleep 'cool'" in str(error)
    assert calls == ["load", "verify"]


async def test_step_removed_at_the_end(kit):
    """The journal holds a step the code never calls: the code returned first."""
    calls.clear()
    t = await kit(audit_v1)
    await t.start(audit_v1, "audit-2")
    await _deploy(t, audit_v2_tail)
    error = await _stuck_error(t, "audit-2")
    assert "step 'verify'" in str(error) and "did not call it" in str(error)
    assert calls == ["load", "verify"]
    # The run did not end with the new code's result.
    assert [row["kind"] for row in await t.journal("audit-2")][-1] != "Finished"


# -- a sleep replaced by a step ---------------------------------------------------------------------


@fusee.workflow("remind")
async def remind_v1(ctx: fusee.Ctx) -> str:
    await ctx.step("draft", counted("draft"))
    await ctx.sleep("pause", "10m")
    return await ctx.step("send", counted("send"))


@fusee.workflow("remind")
async def remind_v2(ctx: fusee.Ctx) -> str:
    await ctx.step("draft", counted("draft"))
    await ctx.step("pause", counted("pause-step"))
    return await ctx.step("send", counted("send"))


async def test_sleep_replaced_by_a_step(kit):
    calls.clear()
    t = await kit(remind_v1)
    await t.start(remind_v1, "remind-1")
    await _deploy(t, remind_v2)
    error = await _stuck_error(t, "remind-1")
    assert "recorded sleep 'pause' here but the code called step 'pause'" in str(error)
    assert calls == ["draft"]
    # Time passing changes nothing: the run waits, stuck, for matching code.
    await t.advance("11m")
    assert calls == ["draft"]
    assert (await t.engine.run("remind-1").status()).status == "stuck"


# -- check() --------------------------------------------------------------------------------------


async def test_check_names_each_run_and_its_difference(kit):
    calls.clear()
    t = await kit(pay_v1, ship_v1)
    await t.start(pay_v1, "chk-pay", 3)
    await t.start(ship_v1, "chk-ship")
    assert await t.result("chk-pay") == "charge:3"
    await t.settle()
    await t.check()  # matches while the code is unchanged
    t.workflows = [pay_v2, ship_v1]
    with pytest.raises(fusee.DeterminismError) as caught:
        await t.check()
    message = str(caught.value)
    assert "'chk-pay'" in message
    assert "recorded step 'charge' here but the code called step 'refund'" in message
    assert "'chk-ship'" not in message
    t.workflows = [pay_v2, ship_v2]
    with pytest.raises(fusee.DeterminismError) as caught:
        await t.check()
    assert "'chk-pay'" in str(caught.value) and "'chk-ship'" in str(caught.value)
    assert "called step 'weigh'" in str(caught.value)


# -- a change after the last recorded operation ----------------------------------------------------


@fusee.workflow("order")
async def order_v1(ctx: fusee.Ctx, item: str) -> str:
    await ctx.step("reserve", counted("reserve"))
    await ctx.sleep("grace", "1h")
    return f"v1:{item}"


@fusee.workflow("order")
async def order_v2(ctx: fusee.Ctx, item: str) -> str:
    await ctx.step("reserve", counted("reserve"))
    await ctx.sleep("grace", "1h")
    await ctx.step("notify", counted("notify"))  # new: after the last recorded operation
    return f"v2:{item}"


async def test_change_after_the_last_recorded_operation_continues(kit):
    calls.clear()
    t = await kit(order_v1)
    await t.start(order_v1, "order-1", "lamp")
    await _deploy(t, order_v2)
    assert await t.result("order-1") == "v2:lamp"
    assert calls == ["reserve", "notify"]  # reserve not again; notify once
    assert await t.steps("order-1") == ["reserve", "notify"]
    await t.check()


@fusee.workflow("stamp")
async def stamp(ctx: fusee.Ctx) -> dict[str, object]:
    at = ctx.now()
    draw = ctx.random()
    ident = ctx.uuid()
    await ctx.sleep("later", "1h")
    return {"at": at.isoformat(), "draw": draw, "id": str(ident)}


async def test_recorded_values_replay_after_a_crash(kit):
    """Unchanged code that read now/random/uuid replays with the recorded values."""
    t = await kit(stamp)
    await t.start(stamp, "stamp-1")
    await t.settle()
    drawn = [row["value"] for row in await t.journal("stamp-1") if row["kind"] == "Drawn"]
    assert len(drawn) == 3
    await t.crash()
    out = await t.result("stamp-1")
    assert out["draw"] == drawn[1] and out["id"] == drawn[2]
    assert out["at"] == "2026-01-01T00:00:00+00:00"
    await t.check()


# -- the Replayer, directly --------------------------------------------------------------------------


async def test_replayer_on_a_recorded_journal(kit):
    t = await kit(pay_v1)
    await t.start(pay_v1, "rp-1", 5)
    assert await t.result("rp-1") == "charge:5"
    records = (await t.engine.run("rp-1").describe()).journal
    Replayer([pay_v1]).replay(records)  # matches: no error
    with pytest.raises(fusee.DeterminismError) as caught:
        Replayer([pay_v2]).replay(records, "rp-1")
    assert "recorded step 'charge' here but the code called step 'refund'" in str(caught.value)
    assert "'rp-1'" in str(caught.value)


def test_replayer_on_hand_made_records():
    calls.clear()
    records = [
        R.Started("pay", 1, b"4", 0, 0),
        R.StepDone(0, "charge", b'"ok"'),
        R.TimerStarted(1, "hold", 3_600_000),
        R.TimerFired(1),
        R.Finished("ok", b'"ok:4"'),
    ]
    Replayer([pay_v1]).replay(records)
    assert calls == []  # replay runs no step function
    with pytest.raises(fusee.DeterminismError, match="called step 'refund'"):
        Replayer([pay_v2]).replay(records)
    # The code's result differs from the recorded one.
    wrong_end = [*records[:-1], R.Finished("ok", b'"ok:5"')]
    with pytest.raises(fusee.DeterminismError, match="result"):
        Replayer([pay_v1]).replay(wrong_end)
    # The journal ends where the code did not.
    with pytest.raises(fusee.DeterminismError, match="ended"):
        Replayer([pay_v1]).replay([records[0], R.Finished("ok", b'"x"')])
    # A type with no code, and a journal that does not start with Started.
    with pytest.raises(fusee.DeterminismError, match="ship"):
        Replayer([pay_v1]).replay([R.Started("ship", 1, b"null", 0, 0)])
    with pytest.raises(fusee.DeterminismError, match="Started"):
        Replayer([pay_v1]).replay(records[1:])
    # An unfinished journal that matches so far is fine.
    Replayer([pay_v1]).replay(records[:3])
    assert calls == []


# -- the same kind of operation, another identity -----------------------------------------


def _v(name: str, body):
    @fusee.workflow(name)
    async def wf(ctx: fusee.Ctx, version: int) -> str:
        await body(ctx, version)
        await ctx.wait_for("finish")
        return "done"

    return wf


async def _sleep_named(ctx: fusee.Ctx, v: int) -> None:
    await ctx.sleep("nap" if v == 1 else "doze", "1s")


async def _wait_named(ctx: fusee.Ctx, v: int) -> None:
    await ctx.wait_for("approve" if v == 1 else "confirm", timeout="1s")


async def _child_id(ctx: fusee.Ctx, v: int) -> None:
    await ctx.child(helper, "kid-a" if v == 1 else "kid-b")


async def _child_type(ctx: fusee.Ctx, v: int) -> None:
    await ctx.child(helper if v == 1 else other_helper, "kid-a")


async def _signal_target(ctx: fusee.Ctx, v: int) -> None:
    await ctx.signal_workflow("peer-a" if v == 1 else "peer-b", "poke", 1)


@fusee.workflow("det.helper")
async def helper(ctx: fusee.Ctx) -> int:
    return 1


@fusee.workflow("det.other_helper")
async def other_helper(ctx: fusee.Ctx) -> int:
    return 2


@fusee.workflow("det.peer")
async def peer(ctx: fusee.Ctx) -> None:
    await ctx.wait_for("poke")


@pytest.mark.parametrize(
    ("body", "recorded", "called"),
    [
        (_sleep_named, "sleep 'nap'", "sleep 'doze'"),
        (_wait_named, "wait_for 'approve'", "wait_for 'confirm'"),
        (_child_id, "child 'det.helper kid-a'", "child 'det.helper kid-b'"),
        (_child_type, "child 'det.helper kid-a'", "child 'det.other_helper kid-a'"),
        (_signal_target, "signal_workflow 'poke to peer-a'", "signal_workflow 'poke to peer-b'"),
    ],
)
async def test_the_same_kind_of_operation_with_another_name_or_target_is_a_determinism_error(
    kit, body, recorded, called
):
    wf = _v("det.same_kind", body)
    t = await kit(wf, helper, other_helper, peer)
    for target in ("peer-a", "peer-b"):
        await t.start(peer, target)
    await t.start(wf, "d-1", 1)
    await t.advance("5s")  # the operation of version 1 is recorded and done
    assert any(type(r).__name__ != "Started" for r in (await t.engine.run("d-1").describe()).journal)
    wf2 = _v("det.same_kind", lambda ctx, v: body(ctx, 2))
    await _deploy(t, wf2, helper, other_helper, peer)
    error = await _stuck_error(t, "d-1")
    assert recorded in str(error) and called in str(error)
