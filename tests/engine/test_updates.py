"""Queries, updates, cancel, terminate, workflow timeouts and compensation."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections import Counter
from typing import Any

import pytest

import fusee
from fusee.testing import TestEngine
from tests.support.waiting import eventually

CALLS: Counter[str] = Counter()
GATE = threading.Event()


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()
    GATE.clear()


def counted(name: str, value: Any = None) -> Any:
    def fn() -> Any:
        CALLS[name] += 1
        return value

    return fn


async def kinds(t: TestEngine, wid: str) -> list[str]:
    return [row["kind"] for row in await t.journal(wid)]


async def journal_len(t: TestEngine, wid: str) -> int:
    return len((await t.engine.run(wid).describe()).journal)


status_q = fusee.query("status", result=dict)
add = fusee.update("add", arg=int, result=int)
priced = fusee.update("priced", arg=int, result=int)
explode = fusee.update("explode", arg=str)
finish = fusee.signal("finish")


# -- workflows --------------------------------------------------------------------------


@fusee.workflow("upd.cart")
async def cart(ctx: fusee.Ctx, owner: str) -> dict[str, Any]:
    items: list[int] = []

    def on_add(n: int) -> int:
        CALLS["add"] += 1
        items.append(n)
        return len(items)

    def validate_add(n: int) -> str | None:
        if n < 0:
            raise ValueError("a quantity must be positive")
        if n == 0:
            return "zero is not an item"
        if n > 1000:
            return False  # a plain no
        return None

    async def on_priced(n: int) -> int:
        CALLS["priced"] += 1
        price = await ctx.step("price", counted("price", n * 100))
        items.append(price)
        return len(items)

    def on_explode(why: str) -> None:
        raise ValueError(f"cannot: {why}")

    ctx.on_query(status_q, lambda _: {"owner": owner, "items": list(items)})
    ctx.on_update(add, on_add, validate=validate_add)
    ctx.on_update(priced, on_priced)
    ctx.on_update(explode, on_explode)
    await ctx.wait_for(finish)
    return {"owner": owner, "items": items}


async def hang() -> str:
    """An async step that waits forever, until asyncio cancels it."""
    CALLS["hang"] += 1
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        CALLS["hang_cancelled"] += 1
        raise
    return "finished"


@fusee.workflow("upd.cancellable")
async def cancellable(ctx: fusee.Ctx, where: str) -> str:
    try:
        if where == "sleep":
            await ctx.sleep("long", "1d")
        elif where == "wait":
            await ctx.wait_for(finish)
        else:
            await ctx.step("hang", hang)
    except fusee.CancelledError as e:
        await ctx.step("cleanup", counted("cleanup"))
        return f"caught at {where}: {e}"
    return "not cancelled"


def ship_fails() -> None:
    CALLS["ship"] += 1
    raise fusee.Fatal("no courier", code="no_courier")


def refund_fails() -> None:
    CALLS["refund"] += 1
    raise fusee.Fatal("refund refused")


async def release_hangs_once() -> None:
    CALLS["release"] += 1
    if CALLS["release"] == 1:
        await asyncio.Event().wait()


@fusee.workflow("upd.saga")
async def saga(ctx: fusee.Ctx, mode: str) -> str:
    await ctx.step("reserve", counted("reserve"))
    ctx.compensate("release", release_hangs_once if mode == "hang-release" else counted("release"))
    await ctx.step("charge", counted("charge"))
    ctx.compensate("refund", refund_fails if mode == "refund-fails" else counted("refund"))
    if mode == "cancel":
        await ctx.wait_for(finish)
    else:
        await ctx.step("ship", ship_fails, retry=fusee.Retry(attempts=1))
    return "shipped"


async def slow() -> str:
    CALLS["slow"] += 1
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        CALLS["slow_cancelled"] += 1
        raise
    return "slow result"


def blocking() -> str:
    """A thread step: it cannot be interrupted, so it returns after the run ended."""
    CALLS["slow"] += 1
    GATE.wait(5)
    CALLS["thread_returned"] += 1
    return "late result"


@fusee.workflow("upd.terminable")
async def terminable(ctx: fusee.Ctx, where: str) -> str:
    await ctx.step("reserve", counted("reserve"))
    ctx.compensate("release", counted("release"))
    if where == "step":
        await ctx.step("slow", slow)
    elif where == "thread":
        await ctx.step("slow", blocking, thread=True)
    else:
        await ctx.sleep("long", "1h")
    await ctx.step("after", counted("after"))
    return "done"


@fusee.workflow("upd.deadline", timeout="1h")
async def deadline_wf(ctx: fusee.Ctx, nap: str) -> str:
    await ctx.step("before", counted("before"))
    await ctx.sleep("nap", nap)
    await ctx.step("after", counted("after"))
    return "woke"


@fusee.workflow("upd.sleeper")
async def sleeper(ctx: fusee.Ctx, nap: str) -> str:
    await ctx.sleep("nap", nap)
    return "woke"


# -- queries ------------------------------------------------------------------------------


async def test_query_answers_from_state_and_writes_nothing(kit):
    t = await kit(cart, shards=4)
    run = await t.start(cart, "c1", "ann")
    await t.settle()
    assert await run.query(status_q) == {"owner": "ann", "items": []}
    await run.update(add, 3)
    size = await journal_len(t, "c1")
    assert await run.query("status") == {"owner": "ann", "items": [3]}
    assert await journal_len(t, "c1") == size
    await t.crash()  # the state is the code's, rebuilt by replay
    run = t.engine.run("c1")
    assert await run.query(status_q) == {"owner": "ann", "items": [3]}
    await t.check()


async def test_unknown_query_is_rejected_naming_the_handlers(kit):
    t = await kit(cart, shards=4)
    run = await t.start(cart, "c1", "ann")
    await t.settle()
    with pytest.raises(fusee.RejectedError) as e:
        await run.query("nope")
    assert "nope" in str(e.value) and "status" in str(e.value)
    assert e.value.code == "Rejected"


async def test_query_on_a_finished_run_is_rejected(kit):
    t = await kit(cart, shards=4)
    run = await t.start(cart, "c1", "ann")
    await t.settle()
    await run.signal(finish)
    assert await t.result("c1") == {"owner": "ann", "items": []}
    with pytest.raises(fusee.RejectedError):
        await run.query(status_q)
    await t.crash()
    with pytest.raises(fusee.RejectedError):
        await t.engine.run("c1").query(status_q)


# -- updates ------------------------------------------------------------------------------


async def test_sync_and_async_update_handlers(kit):
    t = await kit(cart, shards=4)
    run = await t.start(cart, "c1", "ann")
    await t.settle()
    assert await run.update(add, 3) == 1
    assert await run.update(priced, 7) == 2  # the async handler ran a step
    assert await run.update(add, 5) == 3
    assert await t.steps("c1") == ["price"]
    assert CALLS == {"add": 2, "priced": 1, "price": 1}
    await t.crash()
    run = t.engine.run("c1")
    assert CALLS["price"] == 1  # replayed, not run again
    assert await run.query(status_q) == {"owner": "ann", "items": [3, 700, 5]}
    await run.signal(finish)
    assert await t.result("c1") == {"owner": "ann", "items": [3, 700, 5]}
    await t.check()


@pytest.mark.parametrize(
    ("arg", "message"),
    [(-1, "must be positive"), (0, "zero is not an item"), (1001, "validator said no")],
)
async def test_validator_refusal_records_nothing(kit, arg, message):
    t = await kit(cart, shards=4)
    run = await t.start(cart, "c1", "ann")
    await t.settle()
    size = await journal_len(t, "c1")
    with pytest.raises(fusee.RejectedError) as e:
        await run.update(add, arg, id="refused")
    assert message in str(e.value)
    assert await journal_len(t, "c1") == size
    assert CALLS["add"] == 0
    assert await run.update(add, 4, id="refused") == 1  # the ID was not taken
    await t.check()


async def test_same_update_id_gets_the_recorded_result(kit):
    t = await kit(cart, shards=4)
    run = await t.start(cart, "c1", "ann")
    await t.settle()
    assert await run.update(add, 3, id="u1") == 1
    assert await run.update(add, 9, id="u1") == 1
    assert await run.update(priced, 2, id="u2") == 2
    assert await run.update(priced, 2, id="u2") == 2
    assert CALLS == {"add": 1, "priced": 1, "price": 1}
    await t.crash()
    run = t.engine.run("c1")
    assert await run.update(add, 3, id="u1") == 1
    assert await run.update(priced, 2, id="u2") == 2
    assert CALLS["price"] == 1
    assert (await kinds(t, "c1")).count("UpdateAccepted") == 2
    assert await run.query(status_q) == {"owner": "ann", "items": [3, 200]}
    await run.signal(finish)
    await t.result("c1")
    assert await run.update(add, 3, id="u1") == 1  # also once the run finished
    await t.check()


async def test_update_with_start_on_a_new_id(kit):
    t = await kit(cart, shards=4)
    run, result = await t.engine.update_with_start(cart, "c-new", "bea", add, 4, update_id="w1")
    assert result == 1 and run.id == "c-new"
    journal = await t.journal("c-new")
    assert journal[0]["kind"] == "Started" and journal[0]["update_id"] == "w1"
    assert [r["kind"] for r in journal].count("UpdateAccepted") == 0  # rides in the start
    # The validator does not run for an update delivered with the start.
    _, result = await t.engine.update_with_start(cart, "c-zero", "cy", add, 0)
    assert result == 1
    await t.crash()
    run = t.engine.run(run.id)
    assert await run.query(status_q) == {"owner": "bea", "items": [4]}
    _, again = await t.engine.update_with_start(cart, "c-new", "bea", add, 4, update_id="w1")
    assert again == 1
    assert (await kinds(t, "c-new")).count("UpdateDone") == 1
    assert await run.query(status_q) == {"owner": "bea", "items": [4]}
    await t.check()


async def test_update_with_start_on_a_running_id(kit):
    t = await kit(cart, shards=4)
    await t.start(cart, "c1", "ann")
    await t.settle()
    run, result = await t.engine.update_with_start(cart, "c1", "someone else", add, 6)
    assert result == 1
    assert await run.query(status_q) == {"owner": "ann", "items": [6]}
    assert (await kinds(t, "c1")).count("Started") == 1
    assert (await run.status()).run == 1
    await t.check()


async def test_failing_update_handler_fails_the_caller_not_the_run(kit):
    t = await kit(cart, shards=4)
    run = await t.start(cart, "c1", "ann")
    await t.settle()
    with pytest.raises(fusee.WorkflowError) as e:
        await run.update(explode, "bad idea")
    assert e.value.cause.type == "ValueError" and "cannot: bad idea" in e.value.cause.message
    assert (await run.status()).status == "running"
    assert await run.update(add, 2) == 1
    await t.crash()
    run = t.engine.run("c1")
    await run.signal(finish)
    assert await t.result("c1") == {"owner": "ann", "items": [2]}
    await t.check()


async def test_update_on_a_finished_run_is_not_found(kit):
    t = await kit(cart, shards=4)
    run = await t.start(cart, "c1", "ann")
    await t.settle()
    await run.signal(finish)
    await t.result("c1")
    with pytest.raises(fusee.NotFoundError):
        await run.update(add, 1)


# -- cancel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["sleep", "wait", "step"])
async def test_cancel_reaches_the_operation_the_code_waits_on(kit, where):
    t = await kit(cancellable, shards=4)
    run = await t.start(cancellable, "x", where)
    await t.settle()
    if where == "step":
        assert CALLS["hang"] == 1
    await run.cancel("user asked")
    result = await t.result("x")
    assert result.startswith(f"caught at {where}:") and "user asked" in result
    assert await t.steps("x") == ["cleanup"]
    if where == "step":
        await eventually(lambda: CALLS["hang_cancelled"] == 1)
    await t.crash()
    assert await t.result("x") == result
    assert CALLS["cleanup"] == 1 and CALLS["hang"] == (1 if where == "step" else 0)
    await t.check()


async def test_cancel_or_terminate_a_finished_or_unknown_run_is_not_found(kit):
    t = await kit(sleeper, shards=4)
    run = await t.start(sleeper, "x", "1m")
    assert await t.result("x") == "woke"
    for wid in ("x", "never-started"):
        with pytest.raises(fusee.NotFoundError):
            await t.engine.run(wid).cancel("too late")
        with pytest.raises(fusee.NotFoundError):
            await t.engine.run(wid).terminate("too late")
    assert (await run.status()).status == "ok"


# -- compensation ----------------------------------------------------------------------------


async def test_compensations_run_newest_first_on_failure(kit):
    t = await kit(saga, shards=4)
    await t.start(saga, "s1", "fail")
    with pytest.raises(fusee.StepError) as e:
        await t.result("s1")
    assert e.value.step == "ship" and e.value.cause.code == "no_courier"
    assert await t.steps("s1") == ["reserve", "charge", "refund", "release"]
    assert (await t.engine.run("s1").status()).status == "failed"
    await t.crash()
    with pytest.raises(fusee.StepError):
        await t.result("s1")
    assert CALLS == {"reserve": 1, "charge": 1, "ship": 1, "refund": 1, "release": 1}
    await t.check()


async def test_compensations_run_newest_first_on_cancel(kit):
    t = await kit(saga, shards=4)
    run = await t.start(saga, "s1", "cancel")
    await t.settle()
    await run.cancel("changed my mind")
    with pytest.raises(fusee.CancelledError) as e:
        await t.result("s1")
    assert "changed my mind" in str(e.value)
    assert await t.steps("s1") == ["reserve", "charge", "refund", "release"]
    assert (await run.status()).status == "cancelled"
    await t.crash()
    with pytest.raises(fusee.CancelledError):
        await t.result("s1")
    assert CALLS == {"reserve": 1, "charge": 1, "refund": 1, "release": 1}
    await t.check()


async def test_a_failing_compensation_is_logged_and_the_others_still_run(kit, caplog):
    t = await kit(saga, shards=4)
    with caplog.at_level(logging.WARNING, logger="fusee"):
        await t.start(saga, "s1", "refund-fails")
        with pytest.raises(fusee.StepError) as e:
            await t.result("s1")
    assert e.value.step == "ship"  # the run ends with its own failure
    assert "refund" in caplog.text
    assert await t.steps("s1") == ["reserve", "charge", "release"]
    journal = await t.journal("s1")
    assert [r["name"] for r in journal if r["kind"] == "StepFailed"] == ["ship", "refund"]
    assert CALLS == {"reserve": 1, "charge": 1, "ship": 1, "refund": 1, "release": 1}
    await t.check()


async def test_done_compensations_do_not_run_again_after_a_crash(kit):
    t = await kit(saga, shards=4)
    await t.start(saga, "s1", "hang-release")
    await t.settle()
    assert await t.steps("s1") == ["reserve", "charge", "refund"]
    assert CALLS["release"] == 1  # running, not recorded
    await t.crash()
    with pytest.raises(fusee.StepError):
        await t.result("s1")
    assert await t.steps("s1") == ["reserve", "charge", "refund", "release"]
    assert CALLS == {"reserve": 1, "charge": 1, "ship": 1, "refund": 1, "release": 2}
    await t.check()


# -- terminate --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["sleep", "step", "thread"])
async def test_terminate_ends_at_once_without_compensation(kit, where):
    t = await kit(terminable, shards=4)
    run = await t.start(terminable, "x", where)
    await t.settle()
    await eventually(lambda: CALLS["reserve"] == 1 and CALLS["slow"] == (0 if where == "sleep" else 1))
    await run.terminate("operator said so")
    with pytest.raises(fusee.TerminatedError) as e:
        await t.result("x")
    assert "operator said so" in str(e.value)
    assert (await run.status()).status == "terminated"
    if where == "step":
        await eventually(lambda: CALLS["slow_cancelled"] == 1)
    if where == "thread":
        GATE.set()
        await eventually(lambda: CALLS["thread_returned"] == 1)
    await t.advance("2h")
    assert await t.steps("x") == ["reserve"]  # no slow result, no "after", no "release"
    assert CALLS["release"] == 0 and CALLS["after"] == 0
    await t.crash()
    with pytest.raises(fusee.TerminatedError):
        await t.result("x")
    assert await t.steps("x") == ["reserve"] and CALLS["release"] == 0
    await t.check()
    gc.collect()  # the ended run's coroutine is closed here: nothing of it may run


# -- workflow timeout -----------------------------------------------------------------------


async def test_workflow_timeout_from_the_definition(kit):
    t = await kit(deadline_wf, shards=4)
    await t.start(deadline_wf, "late", "2h")
    await t.start(deadline_wf, "early", "10m")
    await t.settle()
    await t.crash()  # the deadline is recorded with the start
    with pytest.raises(fusee.TimeoutError) as e:
        await t.result("late")
    assert e.value.code == "TimedOut"
    assert (await t.engine.run("late").status()).status == "timed_out"
    assert await t.result("early") == "woke"
    assert await t.steps("late") == ["before"]
    assert CALLS == {"before": 2, "after": 1}
    await t.check()


async def test_workflow_timeout_from_the_start(kit):
    t = await kit(sleeper, shards=4)
    start = t.now_ms()
    await t.start(sleeper, "late", "1h", timeout="1m")
    await t.start(sleeper, "no-deadline", "1h")
    with pytest.raises(fusee.TimeoutError):
        await t.result("late")
    assert t.now_ms() - start < 3_600_000  # it ended at its deadline, not after the nap
    assert await t.result("no-deadline") == "woke"
    await t.check()
