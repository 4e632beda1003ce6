"""Calls at every point of a run's life: before its code's first turn, while it is stuck on
a determinism error, while its end is in memory but not yet durable, parked, waiting for
its code, continuing as new, cancelled twice. Each test here failed before its fix."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import fusee
from fusee import journal as R
from fusee.testing import TestEngine

count = fusee.query("count", None, int)
bump = fusee.update("bump", int, int)
again = fusee.signal("again", int)


@fusee.workflow("counter")
async def counter(ctx: fusee.Ctx, n: int) -> int:
    state = {"n": n}

    def add(k: int) -> int:
        state["n"] += k
        return state["n"]

    ctx.on_query(count, lambda _: state["n"])
    ctx.on_update(bump, add)
    more = await ctx.wait_for(again, timeout="1h")
    if more is not None:
        ctx.continue_as_new(state["n"] + more)
    return state["n"]


async def test_a_query_right_after_start_sees_the_handlers_the_code_registers(kit):
    t = await kit(counter)
    run = await t.start(counter, "c-1", 5)
    assert await run.query(count) == 5


async def test_an_update_right_after_start_finds_its_handler(kit):
    t = await kit(counter)
    run = await t.start(counter, "c-1", 5)
    assert await run.update(bump, 2) == 7


async def test_a_query_right_after_signal_with_start(kit):
    t = await kit(counter)
    run = await t.engine.signal_with_start(counter, "c-1", 5, "other", 1)
    assert await run.query(count) == 5


async def test_a_query_after_a_signal_that_continues_the_run_as_new(kit):
    t = await kit(counter)
    run = await t.start(counter, "c-1", 5)
    await run.signal(again, 10)
    assert await run.query(count) == 15
    assert (await run.describe()).summary.run == 2


async def test_two_concurrent_update_with_start_for_a_new_id_both_apply(kit):
    t = await kit(counter)
    (_, first), (_, second) = await asyncio.gather(
        t.engine.update_with_start(counter, "c-1", 5, bump, 1),
        t.engine.update_with_start(counter, "c-1", 5, bump, 10),
    )
    assert sorted([first, second]) in ([6, 16], [15, 16])
    assert await t.engine.run("c-1").query(count) == 16


# -- a run stuck on a determinism error -------------------------------------------------


@fusee.workflow("shifty")
async def shifty_v1(ctx: fusee.Ctx) -> str:
    await ctx.step("one", lambda: 1)
    got = await ctx.wait_for("go")
    return f"v1 {got}"


@fusee.workflow("shifty")
async def shifty_v2(ctx: fusee.Ctx) -> str:
    await ctx.step("renamed", lambda: 1)  # does not match the journal
    got = await ctx.wait_for("go")
    return f"v2 {got}"


async def stuck_run(kit) -> tuple[TestEngine, fusee.Run]:
    t = await kit(shifty_v1)
    await t.start(shifty_v1, "s-1")
    await t.settle()
    await t.restart([shifty_v2])
    run = t.engine.run("s-1")
    assert (await run.status()).status == "stuck"
    return t, run


async def test_a_signal_to_a_stuck_run_is_recorded_and_taken_once_its_code_is_fixed(kit):
    t, run = await stuck_run(kit)
    await run.signal("go", "late")  # acknowledged: it must not be dropped
    journal = (await run.describe()).journal
    assert isinstance(journal[-1], R.SignalReceived) and journal[-1].name == "go"
    await t.restart([shifty_v1], clean=False)
    assert await t.result("s-1") == "v1 late"


async def test_an_update_to_a_stuck_run_is_refused_at_once_recording_nothing(kit):
    _t, run = await stuck_run(kit)
    before = len((await run.describe()).journal)
    with pytest.raises(fusee.RejectedError, match="does not match its journal"):
        await asyncio.wait_for(run.update("anything", 1), 5)
    assert len((await run.describe()).journal) == before


async def test_a_cancel_of_a_stuck_run_is_recorded_and_applied_once_its_code_is_fixed(kit):
    t, run = await stuck_run(kit)
    await run.cancel("stop")
    assert isinstance((await run.describe()).journal[-1], R.CancelRequested)
    await t.restart([shifty_v1], clean=False)
    with pytest.raises(fusee.CancelledError):
        await t.result("s-1")


# -- a refusal leaves only once the state behind it is durable ----------------------------


@fusee.workflow("one_signal")
async def one_signal(ctx: fusee.Ctx) -> str:
    got: str = await ctx.wait_for("go")
    return got


async def test_a_run_that_ended_in_memory_refuses_only_once_its_end_is_durable():
    """The first signal ends the run; its end is in memory, not yet durable, when the
    second is refused as 'ended'. A crash must not bring the run back as running."""
    t = await TestEngine.open([one_signal], flush_on_turn=True)
    run = await t.start(one_signal, "o-1")
    first = asyncio.ensure_future(run.signal("go", "a"))
    await asyncio.sleep(0)  # the first signal is recorded, the run ends, nothing flushed yet
    with pytest.raises(fusee.NotFoundError):
        await run.signal("go", "b")
    await t.crash(settle=False)
    assert (await t.engine.run("o-1").status()).status == "ok"
    first.cancel()
    await t.close()


async def test_a_taken_id_is_refused_only_once_the_run_holding_it_is_durable():
    t = await TestEngine.open([one_signal], flush_on_turn=True)
    first = asyncio.ensure_future(t.start(one_signal, "o-1"))
    await asyncio.sleep(0)  # the first start is recorded, not yet durable
    with pytest.raises(fusee.AlreadyExistsError):
        await t.start(one_signal, "o-1")
    await t.crash(settle=False)
    assert (await t.engine.run("o-1").status()).status == "running"
    first.cancel()
    await t.close()


# -- parked runs ----------------------------------------------------------------------


@fusee.workflow("kid_sleeper")
async def kid_sleeper(ctx: fusee.Ctx) -> str:
    await ctx.sleep("long", "1d")
    return "woke"


@fusee.workflow("parent_sleeper")
async def parent_sleeper(ctx: fusee.Ctx, kid_id: str) -> str:
    await ctx.start_child(kid_sleeper, kid_id)
    await ctx.sleep("long", "1d")
    return "done"


async def test_terminate_existing_on_a_parked_run_records_its_end_and_closes_its_children(kit):
    t = await kit(parent_sleeper, kid_sleeper)
    await t.start(parent_sleeper, "p-1", "k-1")
    await t.advance("5s")  # both park
    assert not t.engine.shard_of("p-1").runs
    replaced = await t.start(parent_sleeper, "p-1", "k-2", id_policy={"running": "terminate-existing"})
    await t.settle()
    assert (await replaced.describe()).summary.run == 2
    assert (await t.engine.run("k-1").status()).status == "terminated"


@fusee.workflow("eager")
async def eager(ctx: fusee.Ctx) -> str:
    await ctx.step("work", lambda: "w")
    return "done"


async def test_a_run_is_not_parked_before_its_code_first_ran(kit):
    t = await kit(eager, park_after=0)
    await t.start(eager, "e-1")
    t.clock.set(t.now_ms() + 1000)  # the sweep comes before the run's first turn
    assert await t.result("e-1") == "done"
    assert not any(isinstance(r, R.Finished) and r.status == "failed" for r in await _journal(t, "e-1"))


async def _journal(t: TestEngine, wid: str) -> list[R.Rec]:
    return (await t.engine.run(wid).describe()).journal


# -- deadlines, cancels, steps ---------------------------------------------------------


@fusee.workflow("looper", timeout="1h")
async def looper(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("tick", "10m")
    ctx.continue_as_new(n + 1)


async def test_a_workflow_timeout_bounds_the_runs_that_continue_as_new(kit):
    t = await kit(looper)
    run = await t.start(looper, "l-1", 0)
    await t.advance("2h")
    summary = (await run.describe()).summary
    assert summary.status == "timed_out" and summary.run == 6


undo_gate: list[asyncio.Event] = []
undone: list[str] = []


async def undo() -> None:
    await undo_gate[0].wait()
    undone.append("undone")


@fusee.workflow("saga")
async def saga(ctx: fusee.Ctx) -> None:
    ctx.compensate("undo", undo)
    await ctx.wait_for("never")


async def test_a_second_cancel_leaves_running_compensations_alone(kit):
    undo_gate[:] = [asyncio.Event()]
    undone.clear()
    t = await kit(saga)
    run = await t.start(saga, "s-1")
    await t.settle()
    await run.cancel("first")
    await t.settle()  # the compensation runs, waiting on its gate
    await run.cancel("second")
    undo_gate[0].set()
    with pytest.raises(fusee.CancelledError):
        await t.result("s-1")
    assert undone == ["undone"]


seen_cancelled = threading.Event()


def patient(s: fusee.StepContext) -> str:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if s.cancelled:
            seen_cancelled.set()
            return "gave up"
        time.sleep(0.005)
    return "never told"


@fusee.workflow("threaded")
async def threaded(ctx: fusee.Ctx) -> str:
    result: str = await ctx.step("patient", patient, thread=True)
    return result


async def test_a_thread_step_sees_s_cancelled_when_its_run_is_cancelled(kit):
    seen_cancelled.clear()
    t = await kit(threaded)
    run = await t.start(threaded, "t-1")
    await t.settle()
    await run.cancel("stop")
    assert await asyncio.to_thread(seen_cancelled.wait, 3)


sent: list[int] = []


def send_fails(cb: fusee.Completion) -> None:
    sent.append(1)
    raise RuntimeError("the mailer is down")


@fusee.workflow("mailing")
async def mailing(ctx: fusee.Ctx) -> None:
    await ctx.await_completion("mail", send_fails)


async def test_await_completion_follows_the_engine_default_retry_policy(kit):
    sent.clear()
    t = await kit(mailing)
    t.engine.default_retry = fusee.Retry(attempts=1)
    await t.start(mailing, "m-1")
    with pytest.raises(fusee.StepError):
        await t.result("m-1")
    assert sent == [1]


# -- runs waiting for their code ----------------------------------------------------------


async def test_a_run_waiting_for_its_code_resumes_when_reopened_with_it(kit):
    t = await kit(one_signal)
    await t.start(one_signal, "o-1")
    await t.settle()
    await t.restart([counter])  # a deploy without the type
    assert (await t.engine.run("o-1").status()).status == "waiting_for_code"
    await t.restart([counter])  # closed cleanly while waiting: still waiting
    await t.restart([counter, one_signal])
    await t.engine.run("o-1").signal("go", "back")
    assert await t.result("o-1") == "back"


async def test_registering_the_code_later_resumes_a_waiting_run(kit):
    t = await kit(one_signal)
    await t.start(one_signal, "o-1")
    await t.settle()
    await t.restart([counter], clean=False)
    assert (await t.engine.run("o-1").status()).status == "waiting_for_code"
    t.engine.register(one_signal)
    await t.settle()
    await t.engine.run("o-1").signal("go", "registered")
    assert await t.result("o-1") == "registered"


@fusee.workflow("renewing")
async def renewing(ctx: fusee.Ctx, n: int) -> str:
    if n == 0:
        await ctx.start_child(kid_sleeper, "renewing-kid")
        ctx.continue_as_new(1)
    await ctx.sleep("long", "1d")
    return "renewed"


async def test_continue_as_new_applies_the_parent_close_policy_to_its_children(kit):
    """The run that started the child closed: its children get the parent close policy,
    as at any end (Temporal does the same)."""
    t = await kit(renewing, kid_sleeper)
    await t.start(renewing, "r-1", 0)
    await t.settle()
    await t.advance("1s")
    assert (await t.engine.run("r-1").describe()).summary.run == 2
    assert (await t.engine.run("renewing-kid").status()).status == "terminated"


@fusee.workflow("shifty_parent")
async def shifty_parent_v1(ctx: fusee.Ctx) -> None:
    await ctx.step("one", lambda: 1)
    await ctx.start_child(kid_sleeper, "shifty-kid")
    await ctx.wait_for("never")


@fusee.workflow("shifty_parent")
async def shifty_parent_v2(ctx: fusee.Ctx) -> None:
    await ctx.step("renamed", lambda: 1)
    await ctx.wait_for("never")


async def test_terminating_a_stuck_run_closes_the_children_its_journal_shows_running(kit):
    """Its replay stopped before the child: the journal, not the replay, says which
    children are running (found by the model-based test, seed 3529483422)."""
    t = await kit(shifty_parent_v1, kid_sleeper)
    await t.start(shifty_parent_v1, "sp-1")
    await t.settle()
    await t.restart([shifty_parent_v2, kid_sleeper], clean=False)
    assert (await t.engine.run("sp-1").status()).status == "stuck"
    await t.engine.run("sp-1").terminate()
    await t.settle()
    assert (await t.engine.run("shifty-kid").status()).status == "terminated"
