"""Run operations at every point of a run's life (docs/run-operations.md): `reset` before a
named step, `retry()` of a failed run, `resume()` of a run paused by a step out of
retries, and the requester (`by`) each records. Every test runs on the three kits
(memory, memory flushed a turn later, a data directory)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

import fusee
from fusee import journal as R
from fusee.journal import Status
from fusee.testing import TestEngine

go = fusee.signal("go", str)
PAUSE = fusee.Retry(attempts=2, initial="1s", jitter=False, on_exhausted="pause")
FAIL = fusee.Retry(attempts=2, initial="1s", jitter=False)


def _order(name: str, retry: fusee.Retry | None) -> fusee.Workflow[Any]:
    @fusee.workflow(name)
    async def order(ctx: fusee.Ctx, n: int) -> list[Any]:
        a = await ctx.step("reserve", lambda: n)
        got = await ctx.wait_for(go, timeout="1h")
        b = await ctx.step("charge", lambda s: s.key, retry=retry)
        await ctx.sleep("cool", "10s")
        c = await ctx.step("ship", lambda: "shipped")
        return [a, got, b, c]

    return order


order = _order("order", FAIL)
paused_order = _order("paused-order", PAUSE)
plain_order = _order("plain-order", None)  # the engine's on_exhausted decides


class Charges:
    """A mock for step 'charge': fails while `broken`, else answers with its attempt."""

    def __init__(self) -> None:
        self.broken = True
        self.attempts: list[int] = []

    def __call__(self, attempt: int) -> str:
        self.attempts.append(attempt)
        if self.broken:
            raise ConnectionError("payments are down")
        return f"charged on attempt {attempt}"


async def _journal(t: TestEngine, wid: str) -> list[R.Rec]:
    return (await t.engine.run(wid).describe()).journal


async def _at_charge(t: TestEngine, wf: fusee.Workflow[Any], wid: str) -> fusee.Run[Any]:
    run = await t.start(wf, wid, 7)
    await t.settle()
    await run.signal(go, "yes")
    await t.advance("5s")  # both attempts fail (1 s apart)
    return run


# -- pausing and resume ---------------------------------------------------------------


async def test_a_step_out_of_retries_pauses_the_run_until_resumed(kit):
    t = await kit(paused_order)
    charges = Charges()
    t.mock_step(paused_order, "charge", charges)
    run = await _at_charge(t, paused_order, "o-1")
    assert charges.attempts == [1, 2]
    assert (await run.status()).status == Status.PAUSED
    assert [r.id async for r in t.engine.list(status="paused")] == ["o-1"]
    last = (await _journal(t, "o-1"))[-1]
    assert isinstance(last, R.Attempt) and last.paused and last.retry_at == 0 and last.attempt == 2
    result = asyncio.ensure_future(run.result())
    await t.advance("1h")  # nothing retries it: it waits for resume(), however long
    assert not result.done() and charges.attempts == [1, 2]

    charges.broken = False
    with fusee.as_requester("ops:ana"):
        await run.resume()
    await t.advance("10s")
    assert (await result)[2] == "charged on attempt 1"  # a fresh set of attempts
    resumed = [r for r in await _journal(t, "o-1") if isinstance(r, R.Resume)]
    assert resumed == [R.Resume(resumed[0].seq, "charge", 2, "ops:ana")]


async def test_a_resumed_step_that_fails_again_numbers_its_attempts_on_and_pauses_again(kit):
    t = await kit(paused_order)
    charges = Charges()
    t.mock_step(paused_order, "charge", charges)
    run = await _at_charge(t, paused_order, "o-1")
    await run.resume()
    await t.advance("5s")
    assert charges.attempts == [1, 2, 1, 2]
    assert (await run.status()).status == Status.PAUSED
    numbers = [r.attempt for r in await _journal(t, "o-1") if isinstance(r, R.Attempt)]
    assert numbers == [1, 2, 3, 4]


async def test_engine_wide_on_exhausted_pauses_steps_without_their_own_choice(kit):
    t = await kit(plain_order, on_exhausted="pause")
    t.mock_step(plain_order, "charge", Charges())
    run = await _at_charge(t, plain_order, "o-1")
    assert (await run.status()).status == Status.PAUSED


async def test_by_default_a_step_out_of_retries_fails_its_run(kit):
    t = await kit(order)
    t.mock_step(order, "charge", Charges())
    run = await _at_charge(t, order, "o-1")
    assert (await run.status()).status == Status.FAILED


async def test_a_final_failure_fails_even_under_pause(kit):
    t = await kit(paused_order)

    def fatal(attempt: int) -> str:
        raise fusee.Fatal("card refused")

    t.mock_step(paused_order, "charge", fatal)
    run = await _at_charge(t, paused_order, "o-1")
    assert (await run.status()).status == Status.FAILED


@pytest.mark.parametrize("reopen", ["crash", "restart"])
async def test_a_parked_paused_run_is_listed_paused_and_stays_paused_across_a_reopen(kit, reopen):
    t = await kit(paused_order)
    charges = Charges()
    t.mock_step(paused_order, "charge", charges)
    await _at_charge(t, paused_order, "o-1")
    await t.advance("5s")
    assert not any("o-1" in shard.runs for shard in t.engine.shards)  # parked
    assert [(r.id, r.status) async for r in t.engine.list()] == [("o-1", Status.PAUSED)]
    await (t.crash() if reopen == "crash" else t.restart())
    assert [(r.id, r.status) async for r in t.engine.list()] == [("o-1", Status.PAUSED)]
    charges.broken = False
    await t.engine.run("o-1").resume()
    assert (await t.result("o-1"))[2] == "charged on attempt 1"


async def test_a_paused_run_still_times_out(kit):
    t = await kit(paused_order)
    t.mock_step(paused_order, "charge", Charges())
    run = await t.start(paused_order, "o-1", 7, timeout="1m")
    await t.settle()
    await run.signal(go, "yes")
    await t.advance("5s")
    assert (await run.status()).status == Status.PAUSED
    await t.advance("2m")
    assert (await run.status()).status == Status.TIMED_OUT


def test_records_written_before_the_new_fields_read_as_before():
    failure = fusee.Failure("boom")
    old_attempt = msgspec.msgpack.encode(["o-1", 1, [11, 3, "charge", 2, failure, 5000, 4000]])
    rec = R.decode_entry(old_attempt).rec
    assert isinstance(rec, R.Attempt) and rec.paused is False and rec.retry_at == 5000
    old_end = msgspec.msgpack.encode(["o-1", 1, [2, "terminated", None, failure, 0, []]])
    assert R.decode_entry(old_end).rec == R.Finished("terminated", failure=failure, by=None)


async def test_a_paused_run_stays_paused_across_a_crash_and_resumes_after(kit):
    t = await kit(paused_order)
    charges = Charges()
    t.mock_step(paused_order, "charge", charges)
    run = await _at_charge(t, paused_order, "o-1")
    await t.advance("5s")  # parked meanwhile
    await t.crash()
    run = t.engine.run("o-1")
    assert (await run.status()).status == Status.PAUSED
    charges.broken = False
    await run.resume()
    assert (await t.result("o-1"))[2] == "charged on attempt 1"
    await t.check()


async def test_a_paused_run_can_be_cancelled_or_terminated(kit):
    t = await kit(paused_order)
    t.mock_step(paused_order, "charge", Charges())
    await _at_charge(t, paused_order, "o-1")
    await _at_charge(t, paused_order, "o-2")
    await t.engine.run("o-1").cancel("given up")
    await t.engine.run("o-2").terminate("given up")
    await t.settle()
    assert (await t.engine.run("o-1").status()).status == Status.CANCELLED
    assert (await t.engine.run("o-2").status()).status == Status.TERMINATED


async def test_resume_refuses_a_run_with_nothing_paused(kit):
    t = await kit(paused_order)
    run = await t.start(paused_order, "o-1", 7)
    await t.settle()
    with pytest.raises(fusee.RejectedError, match=r"no step paused out of retries \(it is running"):
        await run.resume()
    await run.terminate()
    with pytest.raises(fusee.RejectedError, match="it is terminated"):
        await run.resume()
    with pytest.raises(fusee.NotFoundError):
        await t.engine.run("nobody").resume()


async def _at_point(t: TestEngine, point: str) -> fusee.Run[Any]:
    """A run of `order` at a point of its life; 'charge' hangs mid-step at 'mid-step'."""
    if point == "mid-step":
        t.mock_step(order, "charge", lambda attempt: asyncio.Event().wait())
    elif point == "failed":
        t.mock_step(order, "charge", Charges())
    run = await t.start(order, "o-1", 7)
    if point == "before its first turn":
        return run
    await t.settle()
    if point == "cancelled":
        await run.cancel("no")
    elif point == "terminated":
        await run.terminate("no")
    elif point != "parked on a wait":
        await run.signal(go, "yes")
        await t.advance("5s")  # mid-step, failed, or parked on its sleep
        if point == "completed":
            await t.result("o-1")
    await t.settle()
    return run


POINTS = [
    "before its first turn",
    "parked on a wait",
    "mid-step",
    "parked on a sleep",
    "failed",
    "completed",
    "cancelled",
    "terminated",
]


@pytest.mark.parametrize("point", POINTS)
async def test_resume_and_retry_are_refused_where_they_do_not_apply(kit, point):
    t = await kit(order)
    run = await _at_point(t, point)
    status = (await run.status()).status
    with pytest.raises(fusee.RejectedError, match=rf"no step paused out of retries \(it is {status}\)"):
        await run.resume()
    if point != "failed":
        with pytest.raises(fusee.RejectedError, match=rf"has not failed \(it is {status}\)"):
            await run.retry()
    assert (await run.status()).run == 1  # nothing was recorded


@pytest.mark.parametrize("point", POINTS)
async def test_reset_before_the_first_step_works_at_every_point(kit, point):
    t = await kit(order)
    run = await _at_point(t, point)
    t.mocks.clear()  # the code is fixed
    assert await run.reset("reserve") == 2
    await t.settle()
    await run.signal(go, "again")  # a signal after the cut was reapplied, or this one is taken
    result = await t.result("o-1")
    assert result[0] == 7 and result[1] in ("yes", "again") and result[3] == "shipped"
    assert result[2] == "o-1/2/2"  # charge ran again under the new run's key
    await t.check()


ELAPSING = fusee.Retry(
    attempts=100, initial="1s", factor=1, jitter=False, max_elapsed="3s", on_exhausted="pause"
)
elapsing_order = _order("elapsing-order", ELAPSING)


async def test_a_step_paused_by_max_elapsed_counts_it_again_from_the_resume(kit):
    t = await kit(elapsing_order)
    charges = Charges()
    t.mock_step(elapsing_order, "charge", charges)
    run = await t.start(elapsing_order, "o-1", 7)
    await t.settle()
    await run.signal(go, "yes")
    await t.advance("10s")
    assert (await run.status()).status == Status.PAUSED
    first = len(charges.attempts)
    assert 3 <= first <= 5  # 1 s apart, for 3 s
    await run.resume()
    await t.advance("10s")
    assert (await run.status()).status == Status.PAUSED
    assert charges.attempts == list(range(1, first + 1)) * 2  # as many again: max_elapsed restarted


# -- retry ----------------------------------------------------------------------------


async def test_retry_starts_a_failed_run_again_from_its_failed_step(kit):
    t = await kit(order)
    charges = Charges()
    t.mock_step(order, "charge", charges)
    run = await _at_charge(t, order, "o-1")
    with pytest.raises(fusee.StepError):
        await run.result()
    charges.broken = False
    assert await run.retry() == 2
    assert (await t.result("o-1"))[:3] == [7, "yes", "charged on attempt 1"]
    journal = await _journal(t, "o-1")
    assert [type(r).__name__ for r in journal[:5]] == [
        "Started",
        "StepDone",
        "WaitStarted",
        "SignalReceived",
        "Reset",
    ]
    assert journal[4] == R.Reset(1, "charge", None, True)
    assert (await run.status()).run == 2
    await t.check()


async def test_retry_refuses_a_run_that_has_not_failed(kit):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    with pytest.raises(fusee.RejectedError, match=r"has not failed \(it is running"):
        await run.retry()
    await run.signal(go, "yes")
    await t.result("o-1")
    with pytest.raises(fusee.RejectedError, match=r"has not failed \(it is ok"):
        await run.retry()


# -- reset ----------------------------------------------------------------------------


async def test_reset_before_the_first_turn(kit):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    assert await run.reset("reserve") == 2
    await run.signal(go, "yes")
    assert await t.result("o-1") == [7, "yes", "o-1/2/2", "shipped"]


async def test_reset_of_a_run_parked_on_a_wait_reapplies_the_signals_after_the_cut(kit):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    await run.signal(go, "yes")
    await t.advance("2s")  # charge done; parked on its sleep
    await run.reset("reserve")
    assert await t.result("o-1") == [7, "yes", "o-1/2/2", "shipped"]  # a new key: run 2


async def test_reset_without_reapplying_signals_waits_for_them_again(kit):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    await run.signal(go, "yes")
    await t.settle()
    await run.reset("reserve", reapply_signals=False)
    await t.advance("20s")
    assert (await run.status()).status == Status.RUNNING
    assert not any(isinstance(r, R.SignalReceived) for r in await _journal(t, "o-1"))
    await run.signal(go, "again")
    assert (await t.result("o-1"))[1] == "again"


async def test_reset_mid_step_discards_the_running_attempt(kit):
    t = await kit(order)
    release = asyncio.Event()
    calls: list[int] = []

    def charge(attempt: int) -> Any:
        calls.append(attempt)

        async def slow() -> str:
            await release.wait()
            return f"call {len(calls)}"

        return slow()

    t.mock_step(order, "charge", charge)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    await run.signal(go, "yes")
    await t.settle()
    assert calls == [1]  # running
    await run.reset("charge")
    await t.settle()
    assert calls == [1, 1]  # the new run's attempt
    release.set()
    assert (await t.result("o-1"))[2] == "call 2"
    charges = [r for r in await _journal(t, "o-1") if isinstance(r, R.StepDone) and r.name == "charge"]
    assert len(charges) == 1


@pytest.mark.parametrize("end", ["ok", "cancelled", "terminated"])
async def test_reset_of_an_ended_run(kit, end):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    if end == "ok":
        await run.signal(go, "yes")
        await t.result("o-1")
    elif end == "cancelled":
        await run.cancel("no")
    else:
        await run.terminate("no")
    await t.settle()
    assert (await run.status()).status == end
    await run.reset("reserve")
    if end != "ok":
        await run.signal(go, "late")  # the cancel or terminate was after the cut
    assert (await t.result("o-1"))[3] == "shipped"
    assert (await run.status()).run == 2


async def test_reset_survives_a_crash_and_the_old_run_does_not_come_back(kit):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    await run.signal(go, "yes")
    await t.advance("2s")
    await run.reset("charge")
    await t.crash(settle=False)
    assert (await t.engine.run("o-1").status()).run == 2
    assert await t.result("o-1") == [7, "yes", "o-1/2/2", "shipped"]
    await t.check()


@pytest.mark.parametrize("turns", [0, 1, 2, 5])
async def test_a_crash_during_a_reset_finds_the_old_run_or_the_new_one_whole(kit, turns):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    await run.signal(go, "yes")
    await t.advance("2s")
    resetting = asyncio.ensure_future(run.reset("charge"))
    for _ in range(turns):
        await asyncio.sleep(0)
    await t.crash(settle=False)
    resetting.cancel()
    summary = await t.engine.run("o-1").status()
    journal = await _journal(t, "o-1")
    if summary.run == 2:
        assert [type(r).__name__ for r in journal[:5]][-1] == "Reset"
    else:
        assert not any(isinstance(r, R.Reset) for r in journal)
    assert (await t.result("o-1"))[2] == f"o-1/{summary.run}/2"
    await t.check()


async def test_reset_refuses_a_step_the_run_does_not_have(kit):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    with pytest.raises(fusee.RejectedError, match=r"has no step 'nope' \(its steps: reserve"):
        await run.reset("nope")
    assert (await run.status()).run == 1  # nothing changed
    with pytest.raises(fusee.NotFoundError):
        await t.engine.run("nobody").reset("reserve")


kid_go = fusee.signal("kid-go", int)


@fusee.workflow("kid")
async def kid(ctx: fusee.Ctx, signals: int) -> int:
    """The sum of `signals` signals."""
    return sum([await ctx.wait_for(kid_go) or 0 for _ in range(signals)])


@fusee.workflow("family")
async def family(ctx: fusee.Ctx, n: int) -> list[int]:
    early = await ctx.child(kid, f"{ctx.workflow_id}-early", 1)  # ends before the cut
    late = await ctx.start_child(kid, f"{ctx.workflow_id}-late", 2)  # the test ends it
    await ctx.signal_workflow(f"{ctx.workflow_id}-late", kid_go, 1)
    marked = await ctx.step("mark", lambda: 100)
    return [early, await late.result(), marked]


@pytest.mark.parametrize("late_ends", ["before the reset", "after the reset"])
async def test_reset_attaches_to_the_children_the_copy_started(kit, late_ends):
    t = await kit(family, kid)
    run = await t.start(family, "f-1", 1)
    await t.settle()
    await t.engine.run("f-1-early").signal(kid_go, 10)
    await t.advance("1s")
    late = t.engine.run("f-1-late")
    if late_ends == "before the reset":
        await late.signal(kid_go, 5)
        await t.advance("1s")
        assert (await late.status()).status == Status.OK
    await run.reset("mark")  # after the start and the signal, before the step
    if late_ends == "after the reset":
        assert (await late.status()).status == Status.RUNNING
        await late.signal(kid_go, 5)  # its result names run 1; run 2 takes it
    assert await t.result("f-1") == [10, 6, 100]
    assert (await run.status()).run == 2
    kids = [r for r in await _journal(t, "f-1") if isinstance(r, R.ChildRequested)]
    assert len(kids) == 2 and (await late.status()).run == 1  # no child started again
    got = [r.value for r in await _journal(t, "f-1-late") if isinstance(r, R.SignalReceived)]
    assert got == [b"1", b"5"]  # the copy's signal was not sent again
    await t.crash()
    assert await t.result("f-1") == [10, 6, 100]


TOKENS: list[str] = []


@fusee.workflow("approval")
async def approval(ctx: fusee.Ctx, n: int) -> list[Any]:
    asked = ctx.await_completion("ask", lambda cb: TOKENS.append(cb.token))
    return await ctx.all([asked, ctx.step("later", lambda: "after")])


async def test_a_completion_token_handed_out_before_the_cut_completes_the_new_run(kit):
    TOKENS.clear()
    t = await kit(approval)
    run = await t.start(approval, "a-1", 0)
    await t.settle()
    kinds = [type(r).__name__ for r in await _journal(t, "a-1")]
    assert kinds.index("CompletionSent") < kinds.index("StepDone")  # the token is in the copy
    await run.reset("later")
    await t.settle()
    assert len(TOKENS) == 1  # not asked again
    await t.engine.complete(TOKENS[0], "approved")
    assert await t.result("a-1") == ["approved", "after"]
    assert (await run.status()).run == 2


# -- audit ----------------------------------------------------------------------------


async def test_signals_cancels_terminations_and_resets_record_who_asked(kit):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    with fusee.as_requester("job:nightly"):
        await run.signal(go, "yes")
        await run.cancel("expired")
    await t.settle()
    with fusee.as_requester("cli:ana"):
        await run.reset("reserve", reapply_signals=False)
        await run.terminate("done")
    journal = await _journal(t, "o-1")
    reset = next(r for r in journal if isinstance(r, R.Reset))
    assert reset.by == "cli:ana"
    end = journal[-1]
    assert isinstance(end, R.Finished) and end.by == "cli:ana"
    await t.crash()  # the first run's records are superseded; the audit of the cut stays
    assert (await _journal(t, "o-1"))[-1] == end


async def test_a_request_naming_nobody_records_no_requester(kit):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    await run.signal(go, "yes")
    await t.settle()
    signal = next(r for r in await _journal(t, "o-1") if isinstance(r, R.SignalReceived))
    assert signal.by is None
    assert R.encode_entry(R.Entry("o-1", 1, signal)) == R.encode_entry(
        R.Entry("o-1", 1, R.SignalReceived("go", signal.value))
    )


async def test_the_requester_of_a_signal_and_a_cancel_is_recorded(kit):
    t = await kit(order)
    run = await t.start(order, "o-1", 7)
    await t.settle()
    with fusee.as_requester("job:nightly"):
        await run.signal(go, "yes")
        await run.cancel("expired")
    await t.settle()
    journal = await _journal(t, "o-1")
    assert [r.by for r in journal if isinstance(r, (R.SignalReceived, R.CancelRequested))] == [
        "job:nightly",
        "job:nightly",
    ]


def test_which_paused_attempts_a_journal_ends_on():
    """How a run without its code is seen as paused and resumed from its records alone
    (`fusee runs` on a data directory): a paused attempt counts until a record of its step
    follows, a cancel, or the run's end."""
    down = fusee.Failure("down")
    start = R.Started("t", 1, b"1", 0, 0)
    paused = R.Attempt(1, "charge", 2, down, 0, paused=True)
    later = R.Attempt(3, "ship", 1, down, 0, paused=True)
    retried = R.Attempt(1, "charge", 1, down, 5)
    assert R.paused_attempts([start, retried]) == {}
    assert R.paused_attempts([start, retried, paused]) == {1: paused}
    assert R.paused_attempts([start, paused, later]) == {1: paused, 3: later}
    for after in (
        R.Resume(1, "charge", 2),
        R.StepDone(1, "charge", b'"ok"'),
        R.StepFailed(1, "charge", down),
    ):
        assert R.paused_attempts([start, paused, after]) == {}
        assert R.paused_attempts([start, paused, later, after]) == {3: later}
    assert R.paused_attempts([start, paused, R.CancelRequested("stop")]) == {}
    assert R.paused_attempts([start, paused, R.Finished("terminated")]) == {}
    assert R.pauses([start, paused]) and not R.pauses([start])
