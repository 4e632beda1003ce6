"""The spec's Idle rule (server-mode.md, Invoked workers), case by case: a shard is idle
when nothing can make progress there (no step running, no records or checkpoint waiting
for storage, no load or call under way, every message to another shard answered or sent
3 s ago) and its next due time is at least 250 ms away. Each case asserts `shard.idle()`
and what `shard.report()` (the IDLE report) says; then `wait_idle` (woken by changes and by
the clock, never polling) and `drain`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import fusee
from fusee import journal as R
from fusee.engine.shard import Shard
from fusee.storage import MemoryShardStore, MemoryStorage
from tests.support.clock import LoopClock, run_on_virtual_time
from tests.support.engine_kit import turns
from tests.support.waiting import done_at

go = fusee.signal("go", int)
more = fusee.signal("more", int)
bump = fusee.update("bump", arg=int, result=int)
effects: list[str] = []
GATES: list[asyncio.Event] = []


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    effects.clear()
    GATES.clear()
    yield
    for gate in GATES:
        gate.set()


def new_gate() -> asyncio.Event:
    gate = asyncio.Event()
    GATES.append(gate)
    return gate


async def wait_gate() -> str:
    await GATES[0].wait()
    return "through"


@fusee.workflow("idle.nap")
async def nap(ctx: fusee.Ctx, ms: int) -> str:
    await ctx.step("before", lambda: effects.append("before"))
    await ctx.sleep("nap", ms)
    await ctx.step("after", lambda: effects.append("after"))
    got: int = await ctx.wait_for(go)
    return f"woke {got}"


@fusee.workflow("idle.gated")
async def gated(ctx: fusee.Ctx) -> str:
    result: str = await ctx.step("wait", wait_gate)
    return result


@fusee.workflow("idle.waiter")
async def waiter(ctx: fusee.Ctx) -> int:
    got: int = await ctx.wait_for(go)
    return got


@fusee.workflow("idle.updatable")
async def updatable(ctx: fusee.Ctx, how: str) -> int:
    async def on_bump(n: int) -> int:
        if how == "sleep":
            await ctx.sleep("think", "10s")
            return n + 1
        extra: int = await ctx.wait_for(more)
        return n + extra

    ctx.on_update(bump, on_bump)
    got: int = await ctx.wait_for(go)
    return got


@fusee.workflow("idle.kid")
async def kid(ctx: fusee.Ctx) -> int:
    return 1


@fusee.workflow("idle.parent")
async def parent(ctx: fusee.Ctx, kid_id: str) -> int:
    got: int = await ctx.child(kid, kid_id)
    return got


@dataclass
class Poke:
    target: str
    value: int


@fusee.workflow("idle.poker")
async def poker(ctx: fusee.Ctx, poke: Poke) -> int:
    await ctx.signal_workflow(poke.target, go, poke.value)
    return poke.value


# -- helpers --------------------------------------------------------------------------------


async def opened_during_wait(
    engine: fusee.Engine, gate: asyncio.Event, busy_s: float
) -> tuple[asyncio.Future[bool], list[float], float, float]:
    """`engine.wait_idle(grace=0.05)` begun while `gate` keeps a shard busy; `busy_s` later
    (the wait still going) the gate opens. The wait, when it returned (`done_at`), and when
    the gate opened (monotonic, and on the loop's clock)."""
    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(engine.wait_idle(grace=0.05, timeout=10))
    returned = done_at(waiting)
    await asyncio.sleep(busy_s)
    assert not waiting.done()
    gate.set()
    return waiting, returned, time.monotonic(), loop.time()


async def open_engine(storage: Any, clock: Any = None, **options: Any) -> fusee.Engine:
    options.setdefault("workflows", [nap, gated, waiter, updatable, kid, parent, poker])  # every test's code
    return await fusee.Engine.open(storage=storage, clock=clock or fusee.VirtualClock(), **options)


def on_shard(engine: fusee.Engine, index: int, prefix: str) -> str:
    return next(w for w in (f"{prefix}-{n}" for n in range(1000)) if engine.shard_index(w) == index)


def staged(store: MemoryShardStore) -> bool:
    """Records appended that no flush has made durable yet."""
    return store.log_start + len(store.log) > store.durable


def busy(shard: Shard) -> tuple[bool, bool, int | None]:
    """(idle, work left, next due) as the shard and its report say."""
    report = shard.report()
    return shard.idle(), report.work_left, report.next_due_ms


# -- the Idle rule ------------------------------------------------------------------------


async def test_a_sleeping_run_leaves_the_shard_idle_until_its_timer_is_due_within_250_ms():
    """At 250 ms before the timer the shard is still idle; at 249 ms it is not (the worker
    stays for the timer). The report gives the due time relative to now, the steps run,
    the open time, and passes `budget_ended` through."""
    clock = fusee.VirtualClock()
    engine = await open_engine(MemoryStorage(1), clock, park_after="1h")
    await engine.start(nap, "n-1", 10_000)
    await turns()
    shard = engine.shards[0]
    report = shard.report(budget_ended=True)
    assert shard.idle() and engine.idle()
    assert (report.work_left, report.budget_ended, report.next_due_ms) == (False, True, 10_000)
    assert (report.shard, report.epoch, report.steps_run) == (0, 1, 1)
    assert report.open_ms > 0 and report.types_without_code == [] and report.handed_back == []
    began = clock.now_ms()
    clock.set(began + 9_750)
    assert busy(shard) == (True, False, 250)
    clock.set(began + 9_751)
    assert busy(shard) == (False, True, 249) and not engine.idle()
    assert shard.report().budget_ended is False
    clock.set(began + 10_000)
    await turns()
    assert effects == ["before", "after"]
    assert busy(shard) == (True, False, None)
    assert shard.report().steps_run == 2
    await engine.close()


async def test_a_running_step_keeps_the_shard_busy_and_due_now():
    """A step's function is running: not idle, and the report says due now (0) with work
    left; once it returns the shard is idle with nothing due."""
    gate = new_gate()
    engine = await open_engine(MemoryStorage(1))
    await engine.start(gated, "g-1")
    await turns()
    shard = engine.shards[0]
    assert busy(shard) == (False, True, 0)
    assert shard.report().steps_run == 0
    gate.set()
    assert await engine.run("g-1").result() == "through"
    assert busy(shard) == (True, False, None)
    assert shard.report().steps_run == 1
    await engine.close()


async def test_records_not_yet_durable_keep_the_shard_busy_until_the_flush_report():
    """On storage whose flush takes a turn, every turn in which a signal's records are
    staged and not durable finds the shard busy; once the flush reports, it is idle."""
    storage = MemoryStorage(1, instant=False)
    engine = await open_engine(storage)
    await engine.start(waiter, "w-1")
    await turns()
    shard = engine.shards[0]
    assert shard.idle()
    signal = asyncio.ensure_future(engine.run("w-1").signal(go, 1))
    seen = 0
    while not signal.done():
        if staged(storage.stores[0]):
            seen += 1
            idle, work_left, _ = busy(shard)
            assert not idle and work_left
        await asyncio.sleep(0)
    await signal
    assert seen
    assert await engine.run("w-1").result() == 1
    await turns()
    assert not staged(storage.stores[0]) and shard.idle()
    await engine.close()


class GatedReads(MemoryShardStore):
    """Run-store reads wait for `gate`, as a remote store's round trip does."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None

    async def get_run(self, offset: int) -> bytes:
        if self.gate is not None:
            await self.gate.wait()
        return await super().get_run(offset)


async def test_a_parked_run_loading_for_a_call_keeps_the_shard_busy():
    clock = fusee.VirtualClock()
    storage = MemoryStorage(1)
    storage.stores = [GatedReads()]
    engine = await open_engine(storage, clock, park_after="100ms")
    await engine.start(waiter, "w-1")
    await turns()
    clock.set(clock.now_ms() + 1_000)  # the sweep parks it
    await turns()
    shard = engine.shards[0]
    assert shard.idle() and not shard.runs
    storage.stores[0].gate = gate = new_gate()
    signal = asyncio.ensure_future(engine.run("w-1").signal(go, 3))
    await turns()
    assert not signal.done()
    assert busy(shard)[:2] == (False, True)
    gate.set()
    await asyncio.wait_for(signal, 5)
    assert await engine.run("w-1").result() == 3
    await turns()
    assert shard.idle()
    await engine.close()


@pytest.mark.parametrize("how", ["sleep", "wait_for"])
async def test_an_update_waiting_for_its_handler_keeps_the_shard_busy(how):
    """An update call is being answered while its handler waits (on a sleep, or for a
    signal): the spec's "no relayed call is being answered" does not hold, so the shard
    is not idle and its worker does not leave with the caller unanswered."""
    clock = fusee.VirtualClock()
    engine = await open_engine(MemoryStorage(1), clock, park_after="1h")
    try:
        await engine.start(updatable, "u-1", how)
        await turns()
        shard = engine.shards[0]
        assert shard.idle()
        call = asyncio.ensure_future(engine.run("u-1").update(bump, 1))
        await turns()
        assert not call.done()
        assert busy(shard)[:2] == (False, True)
        if how == "sleep":
            clock.set(clock.now_ms() + 10_000)
        else:
            await engine.run("u-1").signal(more, 1)
        assert await asyncio.wait_for(call, 5) == 2
        await turns()
        assert shard.idle()
    finally:
        await engine.close()


class GatedCheckpoints(MemoryShardStore):
    def __init__(self) -> None:
        super().__init__()
        self.written: asyncio.Event | None = None

    async def checkpoint(self, position: int, data: bytes) -> None:
        if self.written is not None:
            await self.written.wait()
        await super().checkpoint(position, data)


async def idle_with_gated_checkpoints() -> tuple[MemoryStorage, fusee.Engine, Any]:
    """An engine on one shard whose checkpoint writes wait for a gate, a run waiting for a
    signal on it, the shard idle."""
    storage = MemoryStorage(1)
    storage.stores = [GatedCheckpoints()]
    engine = await open_engine(storage)
    await engine.start(waiter, "w-1")
    await turns()
    shard = engine.shards[0]
    assert shard.idle()
    return storage, engine, shard


def test_a_checkpoint_being_written_keeps_the_shard_busy_and_its_end_wakes_wait_idle():

    async def main() -> None:
        loop = asyncio.get_running_loop()
        storage, engine, shard = await idle_with_gated_checkpoints()
        storage.stores[0].written = gate = new_gate()
        checkpoint = asyncio.ensure_future(shard.checkpoint(wait=True))
        await turns()
        assert not checkpoint.done()
        assert busy(shard)[:2] == (False, True)
        waiting, returned, released, released_at = await opened_during_wait(engine, gate, 0.1)
        await asyncio.wait_for(checkpoint, 5)
        assert storage.stores[0].checkpoint_data is not None
        assert shard.idle()
        assert await asyncio.wait_for(waiting, 5)  # the checkpoint's end wakes it: no poll
        assert returned[0] >= released  # not before: the checkpoint held it, however slow the loop
        # its grace, from the checkpoint's end (begun before the wait): woken, not polled
        assert loop.time() - released_at == pytest.approx(0.05)
        await engine.close()

    run_on_virtual_time(main)


def test_a_checkpoint_during_the_grace_delays_wait_idle_but_does_not_restart_the_grace():
    """An invoked worker's runs park 50 ms after suspending and the shard then takes a
    checkpoint: upkeep, not progress. The grace counts on through it (else every
    invocation would last a whole grace longer), and wait_idle returns when it ends."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        storage, engine, shard = await idle_with_gated_checkpoints()
        waiting = asyncio.ensure_future(engine.wait_idle(grace=0.6, timeout=10))
        await asyncio.sleep(0.1)
        storage.stores[0].written = gate = new_gate()
        checkpoint = asyncio.ensure_future(shard.checkpoint(wait=True))
        await turns()
        assert not shard.idle() and shard.idle(housekeeping=True)
        await asyncio.sleep(0.1)
        gate.set()  # about 0.2 s into the grace
        released, released_at = time.monotonic(), loop.time()
        await asyncio.wait_for(checkpoint, 5)
        assert await asyncio.wait_for(waiting, 5)
        # The grace ran on: it ends about 0.4 s after the checkpoint (restarted, 0.6 s).
        # the grace ran on through the checkpoint, not restarted
        assert loop.time() - released_at == pytest.approx(0.6 - 0.2)
        # Held past the grace, a checkpoint delays the end until it is written.
        storage.stores[0].written = gate = new_gate()
        await engine.start(waiter, "w-2")
        await turns()
        checkpoint = asyncio.ensure_future(shard.checkpoint(wait=True))
        await turns()
        waiting, returned, released, released_at = await opened_during_wait(engine, gate, 0.2)
        await asyncio.wait_for(checkpoint, 5)
        assert await asyncio.wait_for(waiting, 5)
        assert returned[0] >= released
        await engine.close()

    run_on_virtual_time(main)


async def test_a_message_to_a_shard_nobody_holds_keeps_the_sender_busy_for_3_s_only():
    """A child start for shard 1, which no engine holds, waits at the relay. The sender is
    busy for 3 s after its first send (an answer may still come), then idle although the
    message is resent every second: a resend is not a due time that holds the shard
    (it goes out from the next holder), but the report still names it as due."""
    clock = fusee.VirtualClock()
    storage = MemoryStorage(2)
    engine = await open_engine(storage, clock, shard_ids=[0])
    mother = on_shard(engine, 0, "mother")
    child = on_shard(engine, 1, "child")
    await engine.start(parent, mother, child)
    await turns()
    sent = clock.now_ms()
    shard = engine.shards[0]
    waiting = storage.relayed.waiting[1]
    assert [(m.kind, m.target) for m in waiting] == [("start", child)]
    assert busy(shard) == (False, True, 1_000)
    clock.set(sent + 2_999)
    await turns()
    assert busy(shard)[:2] == (False, True)
    assert len(waiting) >= 2  # resent meanwhile
    clock.set(sent + 3_000)
    await turns()
    idle, work_left, due = busy(shard)
    assert idle and not work_left and due is not None and 0 < due <= 1_000
    clock.set(sent + 3_800)  # the next resend is due within 250 ms: still idle
    await turns()
    assert shard.idle() and engine.idle()
    assert shard.outbox.pending  # never answered
    await engine.close()


async def test_runs_whose_code_the_engine_lacks_are_named_in_the_report():
    """A run opened by an engine without its type's code waits for it, and the report names
    the type (the server sends the shard to an endpoint that has it); once the code is
    registered, the run goes on and the report names none."""
    clock = fusee.VirtualClock()
    storage = MemoryStorage(1)
    engine = await open_engine(storage, clock, park_after="1h")
    await engine.start(waiter, "w-1")
    await engine.start(gated, "g-1")  # one without code, one with
    await turns()
    await engine.close()
    engine = await open_engine(storage, clock, workflows=[gated], park_after="1h")
    shard = engine.shards[0]
    assert shard.report().types_without_code == ["idle.waiter"]
    engine.register(waiter)
    await turns()
    assert shard.report().types_without_code == []
    await engine.run("w-1").signal(go, 4)
    assert await engine.run("w-1").result() == 4
    new_gate().set()
    await engine.close()


# -- wait_idle ------------------------------------------------------------------------------


def test_wait_idle_returns_after_grace_of_idleness_and_false_on_timeout_while_a_step_runs():
    """On a loop whose clock moves only to its next timer (tests/support/clock.py), so the
    durations are exact however loaded the machine: idle, the wait lasts the grace and no
    more (it is woken for it, not polled); with a step running, it gives up at its timeout."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate = new_gate()
        engine = await open_engine(MemoryStorage(1), park_after="1h")
        await engine.start(nap, "n-1", 60_000)
        await turns()
        began = loop.time()
        assert await engine.wait_idle(grace=0.1, timeout=2)
        assert loop.time() - began == pytest.approx(0.1)
        await engine.start(gated, "g-1")
        began = loop.time()
        assert not await engine.wait_idle(grace=0.01, timeout=0.2)
        assert loop.time() - began == pytest.approx(0.2)
        gate.set()
        await engine.close()

    run_on_virtual_time(main)


def test_wait_idle_wakes_when_a_step_finishes():
    """Finishing the step wakes the waiter at once: it returns about `grace` later, not at
    its timeout (no long poll)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate = new_gate()
        engine = await open_engine(MemoryStorage(1))
        await engine.start(gated, "g-1")
        await turns()
        waiting, returned, released, released_at = await opened_during_wait(engine, gate, 0.1)
        assert await asyncio.wait_for(waiting, 5)
        assert returned[0] >= released  # the step held it, not a slow loop
        # its grace, from the step's end: woken, not polled
        assert loop.time() - released_at == pytest.approx(0.05)
        await engine.close()

    run_on_virtual_time(main)


def test_wait_idle_does_not_leave_a_timer_that_comes_due_within_250_ms():
    """A run sleeps 0.3 s (on a loop whose clock moves only to its next timer, the engine's
    clock on it: the durations are exact). Right after the start the engine is idle at
    once. A wait for 0.4 s of idleness begun then must not count the time from 0.05 s (the
    timer due within 250 ms) to the timer as idle: the clock wakes the waiter then, and it
    returns 0.4 s after the step that follows the timer, not 0.4 s after it began. A wait
    begun 0.15 s before the timer likewise returns only after the timer fired and the run
    went on."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        engine = await open_engine(MemoryStorage(1), clock=LoopClock(), park_after="1h")
        began = loop.time()
        await engine.start(nap, "n-1", 300)
        assert await engine.wait_idle(grace=0.01, timeout=1)
        assert effects == ["before"] and loop.time() - began == pytest.approx(0.01)
        assert await engine.wait_idle(grace=0.4, timeout=3)
        assert effects == ["before", "after"]
        assert loop.time() - began == pytest.approx(0.3 + 0.4)

        effects.clear()
        await engine.start(nap, "n-2", 300)
        began = loop.time()
        await asyncio.sleep(0.15)
        assert not engine.idle()
        assert await engine.wait_idle(grace=0.01, timeout=3)
        assert effects == ["before", "after"] and loop.time() - began == pytest.approx(0.3 + 0.01)
        await engine.close()

    run_on_virtual_time(main)


# -- drain ----------------------------------------------------------------------------------


async def test_a_drained_shard_answers_calls_in_flight_and_refuses_new_ones_and_messages():
    """After `drain([1])`: a signal already recorded and a result already awaited are
    answered; new calls for shard 1 get LeaseLostError (the caller retries at its next
    holder) while shard 0 goes on; a message from shard 0 is neither applied nor
    acknowledged, so it stays pending at its sender, and reaches the shard's next holder."""
    clock = fusee.VirtualClock()
    storage = MemoryStorage(2, instant=False)
    engine = await open_engine(storage, clock, park_after="1h")
    w1, w2, fresh = on_shard(engine, 1, "w"), on_shard(engine, 1, "x"), on_shard(engine, 1, "y")
    sender = on_shard(engine, 0, "poker")
    await engine.start(waiter, w1)
    await engine.start(waiter, w2)
    result = asyncio.ensure_future(engine.run(w1).result())
    await turns()
    signal = asyncio.ensure_future(engine.run(w1).signal(go, 7))
    await asyncio.sleep(0)
    assert not signal.done() and not result.done()
    engine.drain([1])
    await asyncio.wait_for(signal, 5)
    assert await asyncio.wait_for(result, 5) == 7
    with pytest.raises(fusee.LeaseLostError, match="draining"):
        await engine.start(waiter, fresh)
    with pytest.raises(fusee.LeaseLostError, match="draining"):
        await engine.run(w2).signal(go, 1)
    with pytest.raises(fusee.LeaseLostError, match="draining"):
        await engine.run(w1).result()

    log = list(storage.stores[1].log)
    await engine.start(poker, sender, Poke(w2, 9))
    await turns()
    clock.set(clock.now_ms() + 2_000)  # resent meanwhile
    await turns()
    pending = engine.by_index[0].outbox.pending
    assert [(p.msg.kind, p.msg.target) for p in pending.values()] == [("signal", w2)]
    assert storage.stores[1].log == log  # not applied, no Received record

    await engine.detach(1)
    await engine.attach(1)  # its next holder
    clock.set(clock.now_ms() + 1_000)  # the next resend
    assert await asyncio.wait_for(engine.run(w2).result(), 5) == 9
    assert await asyncio.wait_for(engine.run(sender).result(), 5) == 9
    await turns()
    assert engine.by_index[0].outbox.pending == {}
    journal = (await engine.run(w2).describe()).journal
    assert len([r for r in journal if isinstance(r, R.SignalReceived)]) == 1
    await engine.close()
