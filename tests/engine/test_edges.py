"""Edges the mutation run (scripts/mutation, docs/mutation.md) found untested: each test
here fails under a mutant that survived the rest of the suite, and asserts what a user or
the guarantees care about, through the public API or, for what invoked workers and the
shard read (the run index, the outbox, idle and next due), through the engine's own
objects."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import msgspec
import pytest

import fusee
from fusee.engine.index import RunIndex
from fusee.journal import Ack, IndexEntry, Msg
from fusee.storage import MemoryShardStore, MemoryStorage
from fusee.testing import TestEngine
from tests.support.engine_kit import slow_reads
from tests.support.waiting import eventually

woken: list[str] = []


@fusee.workflow("edges-nap")
async def nap(ctx: fusee.Ctx, seconds: int) -> int:
    """Sleeps, then has an effect of its own: what a reminder or an expiry does."""
    await ctx.sleep("nap", seconds * 1000)
    await ctx.step("after", lambda: woken.append(ctx.workflow_id))
    return seconds


def _parked(t: Any, count: int) -> bool:
    shard = t.engine.shards[0]
    return not shard.runs and len(shard.index_entries) == count


# -- the run index: parked runs wake on their own timers -------------------------------------


async def test_runs_parked_until_the_same_moment_all_wake_on_their_own(kit):
    """Runs due in one 100 ms bucket are all listed in it and all loaded when it comes due,
    each under its own key: nobody calls them, their timers alone bring the step after the
    sleep (a bucket's list replaced by its last run, or wakes that share one load, leave
    the others asleep for good)."""
    woken.clear()
    t = await kit(nap, shards=1, park_after="100ms")
    for n in range(3):
        await t.start(nap, f"same-{n}", 10)
    await t.advance("1s")
    assert _parked(t, 3)
    await t.advance("10s")
    await eventually(lambda: sorted(woken) == ["same-0", "same-1", "same-2"])


async def test_runs_that_wake_together_from_a_slow_run_store_each_load_their_own_frame():
    """Wakes by timer are loads keyed by each run's index key: with a run store whose reads
    take a while (a remote one), the second wake must not wait on the first's load and
    take that run for its own."""
    woken.clear()
    t = await TestEngine.open([nap], shards=1, park_after="100ms", storage=slow_reads(1))
    try:
        for n in range(3):
            await t.start(nap, f"slow-{n}", 10)
        await t.advance("1s")
        assert _parked(t, 3)
        await t.advance("10s")
        await eventually(lambda: sorted(woken) == ["slow-0", "slow-1", "slow-2"])
    finally:
        await t.close()


async def test_runs_whose_timers_passed_while_the_engine_was_closed_all_wake(kit):
    """An engine that opens after several buckets came due (an invoked worker started late,
    a machine that slept) wakes the runs of every one of them, not only the last."""
    woken.clear()
    t = await kit(nap, shards=1, park_after="100ms")
    for n, seconds in enumerate((10, 20, 30)):
        await t.start(nap, f"late-{n}", seconds)
    await t.advance("1s")
    assert _parked(t, 3)
    await t.close()
    t.clock.set(t.now_ms() + 60_000)
    await t.restart()
    await eventually(lambda: sorted(woken) == ["late-0", "late-1", "late-2"])


def test_the_run_index_keeps_each_runs_type_and_offset_past_65536_entries():
    """A type is numbered once, however many runs of it are parked: a number per entry
    would pass the 16 bits the packed value gives it and spill into the frame offset."""
    index = RunIndex()
    for n in range(70_000):
        index.put(f"run-{n}", IndexEntry(f"run-{n}", 1 + n % 3, "a" if n % 2 else "b", "ok", n * 64))
    for n in (0, 1, 65_535, 65_536, 65_537, 69_999):
        entry = index.get(f"run-{n}")
        assert entry is not None
        assert (entry.type, entry.ref, entry.run_no, entry.status) == (
            "a" if n % 2 else "b",
            n * 64,
            1 + n % 3,
            "ok",
        )


# -- runs waiting for their code, parked in the index ------------------------------------


@fusee.workflow("edges-other")
async def other(ctx: fusee.Ctx) -> None:
    await ctx.wait_for("never")


async def test_a_parked_run_waiting_for_its_code_goes_on_by_itself_once_the_code_is_registered(kit):
    """Reopened twice without the code, the run waits in the index, not loaded; `register`
    loads and replays it, and its timer then runs the rest with nobody calling it. The
    shard no longer reports its type as lacking code, and still reports the other type,
    whose run waits loaded."""
    woken.clear()
    t = await kit(nap, other, shards=1)
    await t.start(nap, "wfc-1", 10)
    await t.start(other, "wfc-2")
    await t.settle()
    await t.restart([])  # a deploy without either type: the runs wait, loaded
    await t.restart([])  # closed while waiting: now they wait in the index
    shard = t.engine.shards[0]
    assert not shard.runs and shard.types_without_code == {"edges-nap", "edges-other"}
    # Asked for its status, the other run loads, and goes on waiting in memory.
    assert (await t.engine.run("wfc-2").status()).status == "waiting_for_code"
    t.engine.register(nap)
    await t.settle()
    assert shard.types_without_code == {"edges-other"}
    await t.advance("11s")
    await eventually(lambda: woken == ["wfc-1"])


# -- what invoked workers read: idle ----------------------------------------------------------


async def test_a_shard_whose_next_timer_is_exactly_250_ms_away_is_idle(kit):
    """Idle means the next due time is at least 250 ms away: at exactly 250 ms a worker may
    stop; a millisecond later it may not."""
    t = await kit(nap, shards=1)
    await t.start(nap, "idle-1", 10)
    await t.settle()
    shard = t.engine.shards[0]
    due = shard.next_due_ms()
    await t.advance(due - t.now_ms() - 250)
    await eventually(lambda: not shard.checkpointing)  # local mode writes one on a thread
    assert shard.idle()
    await t.advance(1)
    assert not shard.idle()


# -- a shard that fails: callers waiting on it get the error ----------------------------------


@fusee.workflow("edges-waiter")
async def waiter(ctx: fusee.Ctx) -> str:
    got: str = await ctx.wait_for("go")
    return got


class FullDiskStorage(MemoryStorage):
    """Memory storage whose run-store writes fail, once told to, as a full disk's do."""

    def __init__(self, shards: int) -> None:
        super().__init__(shards)
        self.stores = [FullDiskStore() for _ in range(shards)]


class FullDiskStore(MemoryShardStore):
    full = False

    def put_run(self, frame: bytes) -> int:
        if self.full:
            raise OSError(28, "No space left on device")
        return super().put_run(frame)


async def test_a_caller_waiting_for_a_result_gets_io_error_when_the_shard_stops():
    """A run-store write refused (parking the run) stops the shard; a caller already
    waiting on the run's result gets IoError at once, not a hang."""
    storage = FullDiskStorage(1)
    t = await TestEngine.open([waiter], shards=1, park_after="100ms", storage=storage)
    try:
        await t.start(waiter, "fail-1")
        await t.settle()
        result = asyncio.ensure_future(t.engine.run("fail-1").result())
        await t.settle()
        assert not result.done()
        storage.stores[0].full = True
        await t.advance("1s")  # the sweep parks the run: its frame cannot be written
        with pytest.raises(fusee.IoError):
            await asyncio.wait_for(result, 5)
    finally:
        await t.close()


# -- updates and queries: refusals and failures the caller sees ------------------------------


class Note(msgspec.Struct):
    text: str
    extra: Any = None


bump = fusee.update("edges-bump", int, int)
odd = fusee.update("edges-odd", int, Any)
careful = fusee.update("edges-careful", int, int)
missing = fusee.update("edges-missing", int, int)
peek = fusee.query("edges-peek", None, int)


@fusee.workflow("edges-handlers")
async def handlers(ctx: fusee.Ctx) -> int:
    count = 0

    def on_bump(n: int) -> int:
        nonlocal count
        if n < 0:
            raise ValueError("no negative bumps")
        count += n
        return count

    async def peek_async(_: None) -> int:
        return count

    async def validate_async(n: int) -> None:
        return None

    ctx.on_update(bump, on_bump)
    ctx.on_update(odd, lambda n: object())  # JSON cannot hold it
    ctx.on_update(careful, on_bump, validate=validate_async)  # type: ignore[arg-type]
    ctx.on_query(peek, peek_async)  # type: ignore[arg-type]
    await ctx.wait_for("done")
    return count


async def test_an_update_unknown_to_the_run_is_refused_naming_the_handlers_it_has(kit):
    t = await kit(handlers)
    run = await t.start(handlers, "h-1")
    with pytest.raises(
        fusee.RejectedError, match=r"edges-missing.*handlers: edges-bump, edges-careful, edges-odd"
    ):
        await run.update(missing, 1)
    assert await run.update(bump, 2) == 2


async def test_an_async_validator_or_query_handler_is_refused_with_rejected_error(kit):
    t = await kit(handlers)
    run = await t.start(handlers, "h-2")
    with pytest.raises(fusee.RejectedError, match="validator must be a plain function"):
        await run.update(careful, 1)
    with pytest.raises(fusee.RejectedError, match="query handler must be a plain function"):
        await run.query(peek)
    assert await run.update(bump, 1) == 1  # the run goes on


async def test_an_update_whose_result_cannot_be_recorded_fails_with_codec_error(kit):
    """The caller never sees a success (None) for an answer that was not recorded."""
    t = await kit(handlers)
    run = await t.start(handlers, "h-3")
    with pytest.raises(fusee.CodecError, match="update 'edges-odd' result cannot be encoded"):
        await run.update(odd, 7)
    with pytest.raises(fusee.CodecError):
        await run.update(odd, 7, id="again")


async def test_an_update_handlers_failure_carries_its_stack_unless_stacks_are_off():
    for record_stacks in (True, False):
        engine = await fusee.Engine.open(workflows=[handlers], record_stacks=record_stacks)
        try:
            run = await engine.start(handlers, "h-4")
            with pytest.raises(fusee.FuseeError) as caught:
                await run.update(bump, -1)
            cause = caught.value.cause
            assert cause is not None and "no negative bumps" in cause.message
            assert bool(cause.stack) is record_stacks
            assert (not cause.stack) or "on_bump" in cause.stack
        finally:
            await engine.close()


async def test_an_update_to_a_finished_run_names_the_workflow(kit):
    t = await kit(handlers)
    run = await t.start(handlers, "h-5")
    await run.signal("done")
    await t.result("h-5")
    with pytest.raises(fusee.NotFoundError) as caught:
        await run.update(bump, 1)
    assert caught.value.workflow_id == "h-5"
    assert "h-5" in str(caught.value)


# -- the codec names where a value cannot be encoded ------------------------------------------


@fusee.workflow("edges-anything")
async def anything(ctx: fusee.Ctx, value: Any) -> None:
    return None


async def test_a_start_input_that_cannot_be_encoded_names_the_struct_field(kit):
    t = await kit(anything)
    with pytest.raises(fusee.CodecError, match=r"object at \$\.extra"):
        await t.start(anything, "any-1", Note("fine", object()))
    with pytest.raises(fusee.CodecError, match=r"at \$\[1\]\.extra\.k"):
        await t.start(anything, "any-2", [Note("a"), Note("b", {"k": object()})])


# -- steps: retries measured from the first failure, a timed-out thread told to give up -----


async def test_max_elapsed_counts_from_the_first_failure_not_the_latest(kit):
    """Retries 100, 200, 400 ms after each failure (no jitter): the third retry would start
    700 ms after the first failure, past max_elapsed=650, so there are three attempts. From
    the latest failure it would be 600 ms and a fourth attempt would run."""
    calls: list[int] = []

    @fusee.workflow("edges-max-elapsed")
    async def wf(ctx: fusee.Ctx) -> None:
        def fn() -> None:
            calls.append(t.now_ms())
            raise OSError("down")

        policy = fusee.Retry(attempts=10, initial=100, jitter=False, max_elapsed=650)
        await ctx.step("fn", fn, retry=policy)

    t = await kit(wf)
    await t.start(wf, "me-1")
    with pytest.raises(fusee.StepError):
        await t.result("me-1")
    assert [c - calls[0] for c in calls] == [0, 100, 300]


async def test_a_thread_step_past_its_timeout_sees_cancelled_and_can_give_up(kit):
    seen: list[bool] = []

    def slow(s: fusee.StepContext) -> str:
        deadline = time.monotonic() + 3
        while not s.cancelled and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.append(s.cancelled)
        return "late"

    @fusee.workflow("edges-timeout-thread")
    async def wf(ctx: fusee.Ctx) -> str:
        try:
            await ctx.step("slow", slow, timeout="50ms", retry=fusee.Retry(attempts=1))
        except fusee.StepError as error:
            return str(error.cause.type if error.cause else "")
        return "finished"

    t = await kit(wf)
    await t.start(wf, "to-1")
    assert await t.result("to-1") != "finished"
    await eventually(lambda: seen == [True])


# -- messages: an answered cancel is not sent again after a crash ----------------------------


@fusee.workflow("edges-canceller")
async def canceller(ctx: fusee.Ctx, target: str) -> str:
    await ctx.cancel_workflow(target, "no longer needed")
    got: str = await ctx.wait_for("go")
    return got


async def test_a_cancel_the_target_answered_is_not_pending_after_a_crash(kit):
    """The cancel's Delivered record settles its outbox entry, in recovery as live: the
    recovered shard does not send it again, and the run's journal gets no second answer."""
    t = await kit(canceller, waiter, shards=1, park_after="1h")  # no checkpoint covers it
    await t.start(waiter, "target-1")
    await t.start(canceller, "canceller-1", "target-1")
    await t.settle()
    assert (await t.engine.run("target-1").status()).status == "cancelled"
    kinds = [row["kind"] for row in await t.journal("canceller-1")]
    assert kinds == ["Started", "CancelSent", "Delivered", "WaitStarted"]
    await t.crash()
    assert [row["kind"] for row in await t.journal("canceller-1")] == kinds
    assert not t.engine.shards[0].outbox.pending


# -- the dev profile: a caller waiting for a result hears at once that the run is stuck ------


flipped: list[bool] = []


@fusee.workflow("edges-flips")
async def flips(ctx: fusee.Ctx) -> str:
    if flipped:
        await ctx.step("other", lambda: "x")  # a deploy that changed the code
    got: str = await ctx.wait_for("go")
    return got


async def test_a_result_waiter_gets_the_determinism_error_when_the_run_gets_stuck(kit):
    flipped.clear()
    t = await kit(flips, shards=1, park_after="100ms")
    await t.start(flips, "stuck-1")
    await t.settle()
    result = asyncio.ensure_future(t.engine.run("stuck-1").result())
    await t.advance("1s")
    assert not t.engine.shards[0].runs  # parked, the caller still waiting
    assert not result.done()
    flipped.append(True)
    await t.engine.run("stuck-1").signal("go", "now")  # loads it: its replay differs
    with pytest.raises(fusee.DeterminismError):
        await asyncio.wait_for(result, 5)
    assert (await t.engine.run("stuck-1").status()).status == "stuck"


# -- messages from shards held elsewhere: each copy is acknowledged by its number ------------


async def test_a_resent_message_is_acknowledged_by_its_number_to_a_shard_held_elsewhere():
    """An invoked worker holds some shards only: acknowledgments to the others go out
    through the relay. A resend (the sender's ack was lost) gets the recorded answer under
    the same number, or the sender would resend it forever; the signal is applied once."""
    storage = MemoryStorage(2)
    engine = await fusee.Engine.open(workflows=[waiter], storage=storage, shard_ids=[0])
    try:
        wid = next(f"relay-{i}" for i in range(100) if engine.shard_index(f"relay-{i}") == 0)
        await engine.start(waiter, wid)
        shard = engine.shards[0]
        msg = Msg("signal", 1, 7, wid, name="go", value=b'"relayed"')
        await shard.messages.receive(msg)
        await shard.messages.receive(msg)  # the resend
        assert storage.relayed.waiting == {1: [Ack(1, 7), Ack(1, 7)]}  # nobody holds shard 1
        assert await asyncio.wait_for(engine.run(wid).result(), 5) == "relayed"
    finally:
        await engine.close()


# -- parking: a run idle for exactly park_after parks ---------------------------------------


async def test_a_run_idle_for_exactly_park_after_is_parked_on_that_tick(kit):
    """Ticks come every park_after / 2: a run that waited exactly park_after parks at the
    tick that finds it so, not a tick later."""
    t = await kit(waiter, shards=1, park_after="100ms")
    await t.start(waiter, "park-1")
    await t.settle()
    shard = t.engine.shards[0]
    await t.advance(99)
    assert "park-1" in shard.runs
    await t.advance(1)
    assert not shard.runs and "park-1" in shard.index_entries


# -- a workflow's failure and record_stacks ---------------------------------------------------


@fusee.workflow("edges-fails")
async def fails(ctx: fusee.Ctx) -> None:
    raise ValueError("the code gave up")


async def test_a_workflows_failure_carries_its_stack_unless_stacks_are_off():
    for record_stacks in (True, False):
        engine = await fusee.Engine.open(workflows=[fails], record_stacks=record_stacks)
        try:
            run = await engine.start(fails, "f-1")
            with pytest.raises(fusee.WorkflowError) as caught:
                await asyncio.wait_for(run.result(), 5)
            cause = caught.value.cause
            assert cause is not None and cause.message == "the code gave up"
            assert bool(cause.stack) is record_stacks
        finally:
            await engine.close()


# -- what a step function is told --------------------------------------------------------------


async def test_a_step_function_is_told_its_workflow_step_and_attempt(kit):
    told: list[tuple[str, str, int]] = []

    def fn(s: fusee.StepContext) -> str:
        told.append((s.workflow_id, s.step, s.attempt))
        if s.attempt == 1:
            raise OSError("flaky")
        return s.key

    @fusee.workflow("edges-told")
    async def wf(ctx: fusee.Ctx) -> str:
        key: str = await ctx.step("charge", fn)
        return key

    t = await kit(wf)
    await t.start(wf, "told-1")
    assert await t.result("told-1")
    assert told == [("told-1", "charge", 1), ("told-1", "charge", 2)]


async def test_hundreds_of_runs_park_and_wake_past_the_timer_heaps_compaction():
    """Parking leaves the parked runs' timers in the shard's heap as stale entries; past 256
    the heap is compacted and the count starts again, and parking goes on."""
    woken.clear()
    t = await TestEngine.open([nap], shards=1, park_after="100ms")
    try:
        for n in range(300):
            await t.start(nap, f"many-{n}", 10)
        await t.advance("1s")
        assert _parked(t, 300)
        for n in range(300, 310):  # parked after the compaction
            await t.start(nap, f"many-{n}", 10)
        await t.advance("1s")
        assert _parked(t, 310)
        await t.advance("10s")
        await eventually(lambda: len(woken) == 310)
    finally:
        await t.close()


# -- an update the run's end cut short -------------------------------------------------------


slow_update = fusee.update("edges-slow-update", None, str)


@fusee.workflow("edges-ends-under-update")
async def ends_under_update(ctx: fusee.Ctx) -> str:
    async def on_slow(_: None) -> str:
        got: str = await ctx.wait_for("never")
        return got

    ctx.on_update(slow_update, on_slow)
    await ctx.wait_for("done")
    return "ended"


async def test_an_update_whose_run_ends_first_is_refused_and_other_runs_updates_wait_on(kit):
    t = await kit(ends_under_update)
    first = await t.start(ends_under_update, "eu-1")
    second = await t.start(ends_under_update, "eu-2")
    cut = asyncio.ensure_future(first.update(slow_update))
    waiting = asyncio.ensure_future(second.update(slow_update))
    await t.settle()
    assert not cut.done() and not waiting.done()
    await first.signal("done")
    with pytest.raises(fusee.RejectedError, match="ended before the update finished"):
        await asyncio.wait_for(cut, 5)
    await t.settle()
    assert not waiting.done()
    waiting.cancel()


# -- what invoked workers read: next due ------------------------------------------------------


@fusee.workflow("edges-wait-then-sleep")
async def wait_then_sleep(ctx: fusee.Ctx) -> str | None:
    got: str | None = await ctx.wait_for("go", timeout="1h")  # the run's first operation
    await ctx.sleep("long", "1d")
    return got


async def test_a_wait_answered_before_its_timeout_leaves_no_due_time_behind(kit):
    """Once the signal answers the wait, its timeout is no longer the shard's next due time
    (a worker would be invoked for nothing in an hour): the one-day sleep is."""
    t = await kit(wait_then_sleep, shards=1)
    await t.start(wait_then_sleep, "wts-1")
    await t.settle()
    shard = t.engine.shards[0]
    assert shard.next_due_ms() - t.now_ms() == 3_600_000
    await t.engine.run("wts-1").signal("go", "now")
    await t.settle()
    assert shard.next_due_ms() - t.now_ms() == 86_400_000


# -- async completion: engine.complete and engine.fail ------------------------------------------


tokens: list[str] = []


@fusee.workflow("edges-mail")
async def mail(ctx: fusee.Ctx) -> str:
    got: str = await ctx.await_completion("reply", lambda cb: tokens.append(cb.token))
    return got


async def test_a_completion_delivers_its_value_once_and_its_token_is_then_stale(kit):
    tokens.clear()
    t = await kit(mail)
    await t.start(mail, "mail-1")
    await t.settle()
    assert len(tokens) == 1
    await t.engine.complete(tokens[0], "yes")
    assert await t.result("mail-1") == "yes"
    with pytest.raises(fusee.RejectedError, match="stale"):
        await t.engine.complete(tokens[0], "again")
    assert [row["kind"] for row in await t.journal("mail-1")].count("Completed") == 1


async def test_a_failed_completion_fails_the_step_with_its_message(kit):
    tokens.clear()
    t = await kit(mail)
    await t.start(mail, "mail-2")
    await t.settle()
    await t.engine.fail(tokens[0], "the recipient refused")
    with pytest.raises(fusee.StepError) as caught:
        await t.result("mail-2")
    assert caught.value.cause is not None and caught.value.cause.message == "the recipient refused"


async def test_a_forged_or_garbled_completion_token_is_refused(kit):
    tokens.clear()
    t = await kit(mail)
    await t.start(mail, "mail-3")
    await t.settle()
    body, mac = tokens[0].split(".")
    forged = body + "." + ("A" if mac[0] != "A" else "B") + mac[1:]
    with pytest.raises(fusee.RejectedError, match="stale"):
        await t.engine.complete(forged, "forged")
    wrong_types = base64.urlsafe_b64encode(json.dumps(["mail-3", "1", 0, 1]).encode()).decode()
    for garbled in ("not a token", body, "!!." + mac, 42, wrong_types.rstrip("=") + "." + mac):
        with pytest.raises(fusee.RejectedError, match="not a completion token"):
            await t.engine.complete(garbled, "garbled")  # type: ignore[arg-type]
    await t.engine.complete(tokens[0], "genuine")
    assert await t.result("mail-3") == "genuine"


# -- the codec: how deep a value may nest --------------------------------------------------------


def nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


async def test_a_value_may_nest_256_levels_and_brackets_inside_strings_do_not_count(kit):
    t = await kit(anything)
    await t.start(anything, "deep-256", nested(256))
    await t.start(anything, "brackets", ["[{" * 400, {"k": "]}" * 400}])
    with pytest.raises(fusee.CodecError, match="nests deeper than 256 levels"):
        await t.start(anything, "deep-257", nested(257))
    # Depth is the deepest branch, whatever closed before it: siblings and commas first.
    with pytest.raises(fusee.CodecError, match="nests deeper than 256 levels"):
        await t.start(anything, "deep-late", [[] for _ in range(10)] + [nested(256)])


# -- local mode: a log that stopped under the engine --------------------------------------------


async def test_a_call_after_the_log_stopped_gets_io_error_not_a_hang(tmp_path):
    """Once the data directory's log has stopped (as after a failed flush, or the kit's
    crash), the next flush request is answered with the error: the start waiting on it
    gets IoError at once."""
    t = await TestEngine.open([waiter], shards=1, dir=tmp_path / "data")
    try:
        await t.start(waiter, "stopped-1")
        await t.settle()
        await t.storage.abandon()
        with pytest.raises(fusee.IoError):
            await asyncio.wait_for(t.start(waiter, "stopped-2"), 5)
    finally:
        t.engine.abandon()


async def test_a_completion_that_arrives_while_send_still_runs_is_taken():
    sent: list[str] = []
    release = asyncio.Event()

    async def send(cb: fusee.Completion) -> None:
        sent.append(cb.token)
        await release.wait()  # the mail server has not answered yet; the webhook already fired

    @fusee.workflow("edges-fast-webhook")
    async def wf(ctx: fusee.Ctx) -> str:
        got: str = await ctx.await_completion("reply", send)
        return got

    t = await TestEngine.open([wf])
    try:
        await t.start(wf, "fast-1")
        await t.settle()
        assert len(sent) == 1
        await t.engine.complete(sent[0], "fast")  # refused today: RejectedError
        release.set()
        assert await t.result("fast-1") == "fast"
    finally:
        release.set()
        await t.close()
