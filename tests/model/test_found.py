"""Defects the model test found, each reproduced directly (no hypothesis), smallest first.

Each test states what the guarantee requires, so it fails while the defect is there. A
defect still open is marked xfail (strict) until the engine is fixed; then it passes, the
strict marker fails the suite, and the marker (and the entry in tests/model/known.py that
the model test steps around) goes. Every one here has been fixed since; they stay as
regressions.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
import zlib
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee import journal as R
from fusee.storage import MemoryStorage
from fusee.testing import TestEngine
from fusee.testing.faults import Faults, FaultyStorage

from .workflows import BUMP, CODE, GO, LEDGER, PLAN, TIMED, TIMED_MS, Plan

ANSWER_S = 2.0  # real seconds: every call here answers at once when the engine is right


OPENED: list[TestEngine] = []


@pytest.fixture(autouse=True)
async def _fresh() -> Any:
    LEDGER.reset()
    LEDGER.valve = asyncio.Event()
    yield
    while OPENED:
        t = OPENED.pop()
        if not t.engine.closed:
            t.engine.abandon()  # what the test left may not close cleanly (that may be the defect)
        abandon = getattr(t.storage, "abandon", None)
        if abandon is not None:
            await abandon()


async def opened(mode: str, tmp_path: Path, code: str = "right", **options: Any) -> TestEngine:
    """A TestEngine on one storage (the modes the defect shows on are parametrized)."""
    if mode == "flush_on_turn":
        options["flush_on_turn"] = True
    elif mode == "local":
        options["dir"] = tmp_path / "data"
    t = await TestEngine.open(workflows=CODE[code], **options)
    OPENED.append(t)
    return t


ALL = ["instant", "flush_on_turn", "local"]
DEFERRED = ["flush_on_turn", "local"]  # storages whose flush takes a turn at least


def kinds(journal: list[R.Rec]) -> list[str]:
    return [type(rec).__name__ for rec in journal]


async def journal(t: TestEngine, wid: str) -> list[R.Rec]:
    return (await t.engine.run(wid).describe()).journal


# -- calls before a run's first turn --------------------------------------------------------


@pytest.mark.parametrize("mode", ["instant"])
async def test_update_with_start_twice_for_a_new_id_finds_no_handler(mode, tmp_path):
    """Found by the model test (fixed since): calls before a run's first turn find no handlers: the
    2nd of two concurrent update_with_start for a new ID is refused 'no handler for update'."""
    t = await opened(mode, tmp_path)
    first, second = await asyncio.gather(
        t.engine.update_with_start(PLAN, "a", Plan(["wait"]), BUMP, 4, update_id="u1"),
        t.engine.update_with_start(PLAN, "a", Plan(["wait"]), BUMP, 4, update_id="u2"),
    )
    assert first[1] == 4
    assert second[1] == 8


# -- signals of the wrong type ----------------------------------------------------------


@pytest.mark.parametrize("mode", ALL)
async def test_a_signal_of_the_wrong_type_is_acknowledged(mode, tmp_path):
    """Found by the model test (fixed since): typed calls: run.signal(GO: int, 'x') to a run not
    waiting for GO is acknowledged and recorded (the run fails with a CodecError when it waits)."""
    t = await opened(mode, tmp_path)
    await t.engine.start(PLAN, "a", Plan(["sleep:1000", "wait"]))
    await t.settle()
    with pytest.raises(fusee.CodecError):
        await t.engine.run("a").signal(GO, "x")
    assert "SignalReceived" not in kinds(await journal(t, "a"))


@pytest.mark.parametrize("mode", ALL)
async def test_a_signal_refused_for_its_type_is_recorded_and_recovery_fails(mode, tmp_path):
    """Found by the model test (fixed since): a signal refused for its type is recorded anyway; a
    crash after it leaves an engine that cannot open (recovery raises the CodecError)."""
    t = await opened(mode, tmp_path)
    await t.engine.start(PLAN, "a", Plan(["wait"]))
    await t.settle()
    with pytest.raises(fusee.CodecError):
        await t.engine.run("a").signal(GO, "x")
    await t.crash()  # raises CodecError from recovery today
    assert "SignalReceived" not in kinds(await journal(t, "a"))
    await t.engine.run("a").signal(GO, 5)
    assert await t.result("a") == 5


# -- update-with-start and continue-as-new ------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "plan"), [("flush_on_turn", ["cas"]), ("local", ["cas"]), ("flush_on_turn", ["comp"])]
)
async def test_update_with_start_of_a_run_that_ends_at_once_answers(mode, plan, tmp_path):
    """Found by the model test (fixed since): no-hang: update_with_start never answers when the new
    run ends (finishes, or continues as new) before its start is durable: the caller then waits
    on a run that is gone."""
    t = await opened(mode, tmp_path)
    got = await asyncio.wait_for(
        t.engine.update_with_start(PLAN, "a", Plan(plan), BUMP, 4, update_id="u1"), ANSWER_S
    )
    assert got[1] == 4


# -- stuck runs (a determinism error) -------------------------------------------------------


@pytest.mark.parametrize("mode", ALL)
async def test_a_signal_to_a_stuck_run_is_recorded(mode, tmp_path):
    """Found by the model test (fixed since): a signal to a stuck run (determinism error after a
    deploy) is acknowledged but never recorded."""
    t = await opened(mode, tmp_path)
    await t.engine.start(PLAN, "a", Plan(["step", "wait"]))
    await t.settle()
    await t.restart(workflows=CODE["changed"], clean=False)
    assert (await t.engine.run("a").status()).status == "stuck"
    await t.engine.run("a").signal(GO, 5)
    assert "SignalReceived" in kinds(await journal(t, "a"))
    await t.restart(workflows=CODE["right"], clean=False)
    assert await t.result("a") == 6  # the step's value (1) and the signal's (5)


@pytest.mark.parametrize("mode", ALL)
async def test_a_signal_sent_again_under_its_id_to_a_stuck_run_is_recorded_once(mode, tmp_path):
    """Found by the model test (seed 11, 300 sequences; fixed since): a stuck run records the
    signals it is sent without applying them, so their IDs never reached the run's set,
    and a signal sent again under its ID was recorded twice (applied twice once fixed)."""
    t = await opened(mode, tmp_path)
    await t.engine.start(PLAN, "c", Plan(["await"]))
    await t.settle()
    await t.restart(workflows=CODE["changed"], clean=False)
    for _ in range(2):
        await t.engine.run("c").signal(GO, 7, id="sig-1")
    assert kinds(await journal(t, "c")).count("SignalReceived") == 1
    await t.restart(workflows=CODE["changed"], clean=False)  # the replay, stuck again, keeps the ID
    await t.engine.run("c").signal(GO, 7, id="sig-1")
    assert kinds(await journal(t, "c")).count("SignalReceived") == 1


@pytest.mark.parametrize("mode", ALL)
async def test_repeating_an_answered_update_on_a_stuck_run_answers(mode, tmp_path):
    """Found by the model test (fixed since): an update to a stuck run hangs, even the repeat of an
    update whose result was recorded (update_with_start, then a deploy of changed code)."""
    t = await opened(mode, tmp_path)
    _, first = await t.engine.update_with_start(PLAN, "a", Plan(["await"]), BUMP, 4, update_id="u1")
    assert first == 4
    await t.restart(workflows=CODE["changed"], clean=False)
    assert (await t.engine.run("a").status()).status == "stuck"
    again = await asyncio.wait_for(t.engine.run("a").update(BUMP, 5, id="u1"), ANSWER_S)
    assert again == 4


# -- workflow deadlines ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ALL)
async def test_a_deadline_survives_a_child_result(mode, tmp_path):
    """Found by the model test (fixed since): progress/next-due: a workflow deadline is dropped
    once a child's result (or a coroutine in all/race) resolves: both resolve an operation at
    position -1, the key the deadline's timer has in run.timers; the run never times out."""
    t = await opened(mode, tmp_path)
    await t.engine.start(TIMED, "a", Plan(["child:abandon", "wait"]))
    await t.advance(TIMED_MS + 1_000)
    assert (await t.engine.run("a").status()).status == "timed_out"


@pytest.mark.parametrize("mode", ALL)
async def test_a_deadline_survives_continue_as_new(mode, tmp_path):
    """Found by the model test (fixed since): the workflow timeout is lost after continue_as_new:
    run 2 of a type with timeout= starts with no deadline."""
    t = await opened(mode, tmp_path)
    await t.engine.start(TIMED, "a", Plan(["cas", "wait"]))
    await t.settle()
    described = await t.engine.run("a").describe()
    assert described.summary.run == 2
    started = described.journal[0]
    assert isinstance(started, R.Started) and started.deadline > 0
    await t.advance(TIMED_MS + 1_000)
    assert (await t.engine.run("a").status()).status == "timed_out"


# -- runs without code ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ALL)
async def test_a_signal_to_a_run_waiting_for_code_after_a_clean_reopen(mode, tmp_path):
    """Found by the model test (fixed since): refusals: after a clean reopen a waiting_for_code run
    is an index entry no call loads: a signal to it is refused NotFound 'no running workflow'
    though it has not ended."""
    t = await opened(mode, tmp_path)
    await t.engine.start(TIMED, "a", Plan(["wait"]))
    await t.settle()
    await t.restart(workflows=CODE["absent"], clean=False)
    await t.restart(workflows=CODE["absent"], clean=True)
    assert (await t.engine.run("a").status()).status == "waiting_for_code"
    await t.engine.run("a").signal(GO, 5)  # NotFoundError today


# -- parked runs and checkpoints ----------------------------------------------------------


@pytest.mark.parametrize("mode", ALL)
async def test_a_run_parked_as_its_bucket_begins_wakes_after_a_crash(mode, tmp_path):
    """Found by the model test (fixed since): wake-ups lost around a checkpoint: a run parks at the
    tick its timer's bucket begins; the checkpoint taken then records it parked with no due
    time, and after a crash it never wakes (next_due_ms() 0 while its sleep is live)."""
    t = await opened(mode, tmp_path)
    await t.engine.start(PLAN, "a", Plan(["sleep:1050", "step"]))
    await t.advance(1_000)  # the run parks at the 1 s tick; its sleep ends at 1.05 s
    await t.crash()
    assert t.engine.shard_of("a").next_due_ms() > 0
    await t.advance(60_000)
    assert (await t.engine.run("a").status()).status == "ok"


@pytest.mark.parametrize("mode", ALL)
async def test_a_run_that_ended_leaves_no_next_due(mode, tmp_path):
    """Found by the model test (fixed since): a finished run's old timer stays as next due: a
    parked run loaded by a signal (or cancel, terminate) that then ends leaves its bucket in
    next_due_ms()."""
    t = await opened(mode, tmp_path)
    await t.engine.start(PLAN, "a", Plan(["waitt:5000"]))
    await t.advance(1_000)  # parked, its wait's timeout 4 s ahead
    await t.engine.run("a").signal(GO, 1)
    await t.settle()
    assert (await t.engine.run("a").status()).status == "ok"
    assert [s.next_due_ms() for s in t.engine.shards] == [0, 0, 0, 0]


@pytest.mark.parametrize("mode", ALL)
async def test_a_run_waiting_for_code_resumes_when_its_code_is_back(mode, tmp_path):
    """Found by the model test (fixed since): a run waiting_for_code never resumes after reopening
    with its code, when the reopening before it was clean (its index entry keeps status
    waiting_for_code, never loaded)."""
    t = await opened(mode, tmp_path)
    await t.engine.start(TIMED, "a", Plan(["wait"]))
    await t.settle()
    await t.restart(workflows=CODE["absent"], clean=False)
    assert (await t.engine.run("a").status()).status == "waiting_for_code"
    await t.restart(workflows=CODE["right"], clean=True)
    assert (await t.engine.run("a").status()).status == "running"
    await t.engine.run("a").signal(GO, 1)
    assert await t.result("a") == 1


# -- what a crash leaves behind -------------------------------------------------------------

GATE: list[asyncio.Event] = []


async def gated_step() -> int:
    await GATE[0].wait()
    return 1


@fusee.workflow("found.gated")
async def gated_wf(ctx: fusee.Ctx) -> int:
    got: int = await ctx.step("gated", gated_step)
    await ctx.wait_for(GO)
    return got


@pytest.mark.parametrize("mode", ["instant", "flush_on_turn"])
async def test_an_abandoned_engine_records_nothing(mode, tmp_path):
    """Found by the model test (fixed since): recorded: an abandoned engine (TestEngine.crash)
    still records a step result whose task finished in the turn of the crash (_task_done does
    not check shard.closed), into the storage the new engine recovered from: the run's journal
    gets a second StepDone."""
    GATE[:] = [asyncio.Event()]
    options = {"flush_on_turn": True} if mode == "flush_on_turn" else {}
    t = await TestEngine.open(workflows=[gated_wf], **options)
    OPENED.append(t)
    await t.engine.start(gated_wf, "a")
    await t.settle()
    GATE[0].set()
    await asyncio.sleep(0)  # the step's task finishes; its done callback is still queued
    await t.crash(settle=False)  # the old engine is dropped before that callback runs
    await t.settle()
    await t.crash()
    assert kinds(await journal(t, "a")) == ["Started", "StepDone", "WaitStarted"]


@pytest.mark.parametrize("mode", ALL)
async def test_a_cancel_of_a_stuck_run_is_recorded(mode, tmp_path):
    """Found by the model test (fixed since): a cancel of a stuck run (determinism error after a
    deploy) is acknowledged and changes nothing: no CancelRequested is recorded."""
    t = await opened(mode, tmp_path)
    await t.engine.start(PLAN, "a", Plan(["step", "wait"]))
    await t.settle()
    await t.restart(workflows=CODE["changed"], clean=False)
    assert (await t.engine.run("a").status()).status == "stuck"
    await t.engine.run("a").cancel()
    assert "CancelRequested" in kinds(await journal(t, "a"))


@pytest.mark.parametrize("mode", ["instant"])  # elsewhere the first turn's records share a flush
async def test_a_wait_satisfied_by_a_kept_signal_is_recorded_after_a_recovery(mode, tmp_path):
    """Found by the model test (fixed since): recorded: after a recovery, a wait that a kept signal
    satisfied during the replay never records its WaitStarted (go_live starts only unresolved
    operations), so the journal has a hole at its position, unlike the same run live."""
    t = await opened(mode, tmp_path)
    await t.engine.signal_with_start(PLAN, "live", Plan(["waitt:500", "waitt:500"]), GO, 1)
    await t.settle()
    live = [rec.seq for rec in await journal(t, "live") if isinstance(rec, R.WaitStarted)]
    assert live == [0, 1]
    # The same run, crashed before its first turn: the replay takes the kept signal.
    start = asyncio.ensure_future(
        t.engine.signal_with_start(PLAN, "crashed", Plan(["waitt:500", "waitt:500"]), GO, 1)
    )
    while not start.done():
        await asyncio.sleep(0)
    await t.crash(settle=False)
    await t.settle()
    recovered = [rec.seq for rec in await journal(t, "crashed") if isinstance(rec, R.WaitStarted)]
    assert recovered == [0, 1]


@pytest.mark.parametrize("mode", ALL)
async def test_a_run_ended_without_its_code_closes_its_children(mode, tmp_path):
    """Found by the model test (fixed since): progress: a run ended while waiting for its code
    (terminated; or timed out) closes none of its children: prepare_end reads run.children,
    which only a replay with the code fills."""
    t = await opened(mode, tmp_path)
    await t.engine.start(TIMED, "a", Plan(["spawn:terminate", "wait"]))
    await t.settle()
    assert (await t.engine.run("a.1.0").status()).status == "running"
    await t.restart(workflows=CODE["absent"], clean=False)
    assert (await t.engine.run("a").status()).status == "waiting_for_code"
    await t.engine.run("a").terminate()
    await t.advance(2_000)
    assert (await t.engine.run("a.1.0").status()).status == "terminated"


@pytest.mark.parametrize("mode", ALL)
async def test_repeating_an_answered_update_on_a_run_waiting_for_code_answers(mode, tmp_path):
    """Found by the model test (fixed since): acknowledged: repeating an answered update (same ID)
    on a run that waits for its code is refused 'waits for the code' instead of answered from
    its recorded UpdateDone."""
    t = await opened(mode, tmp_path)
    await t.engine.start(TIMED, "a", Plan(["wait"]))
    await t.settle()
    assert await t.engine.run("a").update(BUMP, 4, id="u1") == 4
    await t.restart(workflows=CODE["absent"], clean=False)
    assert (await t.engine.run("a").status()).status == "waiting_for_code"
    assert await asyncio.wait_for(t.engine.run("a").update(BUMP, 5, id="u1"), ANSWER_S) == 4


async def async_step() -> int:
    await asyncio.sleep(0)
    return 1


@fusee.workflow("found.async_step")
async def async_step_wf(ctx: fusee.Ctx) -> int:
    got: int = await ctx.step("a", async_step)
    return got


@pytest.mark.parametrize(("mode", "turns"), [("instant", 1), ("flush_on_turn", 0)])
async def test_a_crash_before_a_step_task_starts_leaves_no_coroutine_unawaited(mode, turns):
    """Found by the model test (fixed since): documented-errors: a crash (engine.abandon) while a
    step's task is created but not yet started leaves the step function's coroutine never
    awaited (a RuntimeWarning when it is collected; an error under filterwarnings=error)."""
    t = await TestEngine.open(workflows=[async_step_wf], flush_on_turn=mode == "flush_on_turn")
    OPENED.append(t)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await t.engine.start(async_step_wf, "a")
        for _ in range(turns):
            await asyncio.sleep(0)  # the step's gate opened: its task exists, not yet run
        await t.crash(settle=False)
        await t.settle()
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


# -- faulty storage (fusee/testing/faults.py) ------------------------------------------------


def _on_shard(shards: int, index: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(1000) if zlib.crc32(f"{prefix}{i}".encode()) % shards == index)


@pytest.mark.parametrize("turns", [1, 10])
async def test_a_message_relayed_to_a_shard_while_it_recovers_is_applied_before_its_runs(turns):
    """Found by the model test (faulty storage; seed 4, fault seed 10112): acknowledged: after a
    restart, a started run is gone (the model's `'b' was started (run 1) and is gone`) though
    its records are durable in the log; or a signal to a running run is refused as NotFound.

    The storage contract lets a store deliver relayed messages from `open_shard` on, and lets
    its reads take loop turns (a remote store's do). Shard 0 recovers; the relay hands it a
    signal from shard 1 meanwhile; the shard applies it at once: the run is not revived yet,
    so the signal is answered NotFound (and lost: the run waits for it for ever), and the
    `Received` record it appends moves the shard's log position: when that happens before
    recovery reads the log (reads of 10 turns), recovery reads only after it and the run
    itself is gone. Memory storage never shows it: its reads never yield."""
    storage = FaultyStorage(
        MemoryStorage(2, instant=False), Faults(slow_read=1.0, min_turns=turns, max_turns=turns)
    )
    target, sender = _on_shard(2, 0, "p"), _on_shard(2, 1, "q")
    first = await fusee.Engine.open(workflows=CODE["right"], storage=storage)
    await asyncio.wait_for(first.start(PLAN, target, Plan(["wait"])), ANSWER_S)  # acknowledged
    first.abandon()  # a crash: the run is in the log only
    await storage.abandon()
    # Another engine holds shard 1 alone; its run signals the target on shard 0, which no
    # engine holds: the relay keeps the message for shard 0's next holder.
    second = await fusee.Engine.open(workflows=CODE["right"], storage=storage, shard_ids=[1])
    await asyncio.wait_for(second.start(PLAN, sender, Plan([f"sigwf:{target}", "wait"])), ANSWER_S)
    for _ in range(50):
        await asyncio.sleep(0)
    third = await fusee.Engine.open(workflows=CODE["right"], storage=storage, shard_ids=[0])
    try:
        status = await asyncio.wait_for(third.run(target).status(), ANSWER_S)
        assert status.status in ("running", "ok")  # the signal may have ended it already
        # The signal reaches the run, which was waiting for it and now ends with its value.
        assert isinstance(await asyncio.wait_for(third.run(target).result(), ANSWER_S), int)
    finally:
        await third.close()
        await second.close()


async def test_a_shard_that_stops_while_it_applies_a_message_leaves_no_error_in_the_loop():
    """Found by the model test (faulty storage; seed 4, fault seed 124038): documented-errors:
    `Task exception was never retrieved: IoError('shard 3 stopped after a failed write ...')`.
    A shard receiving a message from another shard records `Received` and waits for it to be
    durable before it acknowledges; when the flush fails, the shard stops and that wait raises
    IoError inside `Delivery.receive`, a task the engine spawned and never awaits: the error
    escapes into the event loop instead of ending with the shard."""
    loop = asyncio.get_running_loop()
    escaped: list[str] = []
    loop.set_exception_handler(lambda _loop, context: escaped.append(str(context.get("message"))))
    storage = FaultyStorage(MemoryStorage(2, instant=False))
    target, sender = _on_shard(2, 1, "p"), _on_shard(2, 0, "q")
    engine = await fusee.Engine.open(workflows=CODE["right"], storage=storage)
    try:
        await asyncio.wait_for(engine.start(PLAN, target, Plan(["wait", "wait"])), ANSWER_S)
        storage.shard_faults[1] = Faults(fail_flush=1.0)  # the target's shard: its next flush fails
        await asyncio.wait_for(engine.start(PLAN, sender, Plan([f"sigwf:{target}", "wait"])), ANSWER_S)
        for _ in range(100):
            await asyncio.sleep(0)
        assert storage.injected["failed_flush"] == 1
        gc.collect()  # (a task's unretrieved exception is reported when the task is collected)
        assert escaped == []
    finally:
        loop.set_exception_handler(None)
        await engine.close()


@pytest.mark.parametrize("call", ["update", "update_with_start"])
async def test_an_update_answers_when_its_shard_stops(call):
    """Found by the model test (faulty storage; seed 4, fault seed 124038): no-hang: `await
    t.engine.update_with_start('model.plan', 'a', ...)` did not answer within 2 s. An update to
    a running run whose shard stops while the update is under way (the flush of its records
    fails) never answers; a signal, a cancel or a signal_with_start in the same place gets
    the shard's IoError at once, as every call on a stopped shard should."""
    storage = FaultyStorage(MemoryStorage(1, instant=False))
    engine = await fusee.Engine.open(workflows=CODE["right"], storage=storage)
    try:
        await asyncio.wait_for(engine.start(PLAN, "a", Plan(["wait", "wait"])), ANSWER_S)
        storage.faults = Faults(fail_flush=1.0)  # the shard's next flush fails: it stops
        with pytest.raises(fusee.IoError):
            if call == "update":
                await asyncio.wait_for(engine.run("a").update(BUMP, 4, id="u1"), ANSWER_S)
            else:
                await asyncio.wait_for(
                    engine.update_with_start(PLAN, "a", Plan(["step"]), BUMP, 4, update_id="u1"), ANSWER_S
                )
    finally:
        engine.abandon()
        await storage.abandon()


@pytest.mark.parametrize("mode", ["instant"])
@pytest.mark.parametrize("turns", [0, 1])
async def test_a_result_asked_as_the_timer_wakes_its_parked_run_answers(mode, turns, tmp_path):
    """Found by the model test (instant storage, seed 1, 400 sequences; issue 17, item 28):
    no-hang: `t.engine.run('a').result()` still waits, though run 1 of 'a' ended ok. The
    result is asked of a parked run as its timer comes due: the call reads the run's frame
    while the timer's wake-up loads the run, the run ends and leaves memory, and the call
    went by the frame it had read ("parked") and waited on a run that had ended."""
    t = await opened(mode, tmp_path)
    await t.engine.signal_with_start(PLAN, "a", Plan(["sleep:2000"]), GO, 1)
    await t.advance(1500)  # parked, due in 500 ms
    waiting = asyncio.ensure_future(t.engine.run("a").result())
    for _ in range(turns):
        await asyncio.sleep(0)
    t.clock.set(t.now_ms() + 500)
    await t.settle()
    assert await asyncio.wait_for(waiting, ANSWER_S) == 0


async def test_a_schedule_outlives_a_start_on_a_shard_that_stopped():
    """Found by the model test's flow-control moves (faulty storage; `schedule-fires`: an
    `every="1s"` schedule started nothing after a storage fault). A schedule's `fire` step
    starts the time's run on that run's shard; when that shard has stopped (its flush
    failed: the process must restart) the start raises IoError, and a FuseeError out of a
    step is final, so the schedule's run failed and the schedule was gone for good. The
    step retries it now (a schedule outlives any one failing start), and the restarted
    process starts the time's run."""
    storage = FaultyStorage(MemoryStorage(2, instant=False))
    t = await TestEngine.open(workflows=CODE["right"], storage=storage, shards=2)
    try:
        name = next(
            n for n in (f"s{i}" for i in range(100)) if t.engine.shard_index(f"fusee.schedule/{n}") == 0
        )
        await t.engine.schedule(name, {"every": "1s"}, "model.take", {"ms": 10})
        now = t.now_ms()
        at = next(
            ms
            for ms in range(now // 1000 * 1000 + 1000, now + 100_000, 1000)
            if t.engine.shard_index(f"{name}@{_iso(ms)}") == 1
        )
        await t.advance(at - now - 1)
        storage.shard_faults[1] = Faults(fail_flush=1.0)  # the time's shard stops at its next flush
        await t.advance(1)
        status = await t.engine.run(f"fusee.schedule/{name}").status()
        assert status.status == "running"
        storage.shard_faults[1] = Faults()
        await t.crash(settle=True)  # the process restarts, as after any storage fault
        await t.advance(60_000)  # (the step's retry comes within a minute)
        assert (await t.engine.run(f"{name}@{_iso(at)}").status()).status == "ok"
        assert (await t.engine.run(f"fusee.schedule/{name}").status()).status == "running"
    finally:
        storage.shard_faults.clear()
        await t.close()


def _iso(ms: int) -> str:
    from fusee.engine.schedules.times import iso

    return iso(ms)


NUDGE = fusee.update("nudge", arg=int, result=int)
SELF: list[Any] = []


@fusee.workflow("found.self_update")
async def self_update(ctx: fusee.Ctx, n: int) -> int:
    async def handler(k: int) -> int:
        await ctx.sleep("h", 5)
        return k + 1

    ctx.on_update(NUDGE, handler)

    async def go() -> int:
        answer: int = await SELF[0].run(ctx.workflow_id).update(NUDGE, n)
        return answer

    got: int = await ctx.step("go", go)
    return got


async def test_a_run_driven_from_its_own_step_task_runs_as_workflow_code():
    """Found by the model test's flow-control moves (faulty storage, seed 12 with schedules
    every 1 s and 2 s: `run 2 of 'fusee.schedule/sb' failed: ctx.sleep called inside a
    step's function`). Whatever a step's task schedules (a shard's pump, a flush, the done
    callback of a step its flush let through) inherits the task's context, where the
    engine marks that run's step function as running; a run driven from there had its own
    code refused as a step function calling ctx, and failed. The schedule's step starts
    runs on its engine, so its run met it. Here the step updates its own run: the
    update's handler is the run's code and may sleep."""
    t = await TestEngine.open(workflows=[self_update], shards=1)
    SELF[:] = [t.engine]
    try:
        await t.engine.start(self_update, "r", 1)
        for _ in range(5):
            await t.advance(100)
        assert await asyncio.wait_for(t.engine.run("r").result(), ANSWER_S) == 2
    finally:
        SELF.clear()
        await t.close()
