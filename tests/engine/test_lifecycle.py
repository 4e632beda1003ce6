"""A shard's life in an engine that runs: attached and detached mid-step, closed with a
deadline while a thread step runs, opened side by side, its lease lost to another holder,
and what it prunes as it checkpoints. Each test names the promise it pins: a handed-back
run finishes once under its next holder, a late result of the old holder never lands,
every acknowledged start survives, an unchanged shard writes no checkpoint."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import fusee
from fusee import journal as R
from fusee.journal import Ack, Msg
from fusee.storage import MemoryShardStore, MemoryStorage
from tests.support.clock import run_on_virtual_time
from tests.support.engine_kit import advance, go, turns, waiter
from tests.support.waiting import eventually


class Gate:
    """The thread steps of the runs in `held` wait on `release` at their first attempt;
    every attempt is counted and returns which attempt it was, so the journal shows
    whose result it recorded."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.held: set[str] = set()
        self.attempts: Counter[str] = Counter()
        self.returned = 0  # held attempts that returned

    def run(self, wid: str) -> str:
        with self.lock:
            self.attempts[wid] += 1
            attempt = self.attempts[wid]
        if attempt == 1 and wid in self.held:
            self.release.wait(10)
            with self.lock:
                self.returned += 1
        return f"{wid}/attempt-{attempt}"


GATE = Gate()


@pytest.fixture(autouse=True)
def _fresh_gate() -> Iterator[None]:
    global GATE
    GATE = Gate()
    yield
    GATE.release.set()  # no thread outlives its test


ping = fusee.signal("ping", int)


@fusee.workflow("lc.job")
async def job(ctx: fusee.Ctx, n: int) -> str:
    wid = ctx.workflow_id
    await ctx.step("first", lambda: n)
    middle: str = await ctx.step("middle", lambda: GATE.run(wid), thread=True)
    await ctx.sleep("pause", "1s")
    await ctx.step("last", lambda: n)
    return middle


@fusee.workflow("lc.sleeper")
async def sleeper(ctx: fusee.Ctx) -> str:
    await ctx.sleep("long", "1h")
    return "awake"


@fusee.workflow("lc.quick")
async def quick(ctx: fusee.Ctx, n: int) -> int:
    doubled: int = await ctx.step("double", lambda: n * 2)
    return doubled


@dataclass
class Pings:
    target: str
    first: int
    count: int


@fusee.workflow("lc.pinger")
async def pinger(ctx: fusee.Ctx, pings: Pings) -> int:
    for n in range(pings.first, pings.first + pings.count):
        await ctx.signal_workflow(pings.target, ping, n)
    return pings.count


@fusee.workflow("lc.sink")
async def sink(ctx: fusee.Ctx) -> int:
    got: int = await ctx.wait_for(go)
    return got


# -- helpers --------------------------------------------------------------------------------


async def results(engine: fusee.Engine, clock: fusee.VirtualClock, wids: list[str]) -> dict[str, Any]:
    """Every run's result, moving the clock while they sleep and real time while their
    thread steps run (up to 5 s)."""
    tasks = {wid: asyncio.ensure_future(engine.run(wid).result()) for wid in wids}

    async def all_done() -> bool:
        if all(task.done() for task in tasks.values()):
            return True
        await advance(clock, 500)
        return False

    try:
        await eventually(
            all_done, timeout=5, every=0.005, why=lambda: str([w for w, t in tasks.items() if not t.done()])
        )
        return {wid: task.result() for wid, task in tasks.items()}
    finally:
        for task in tasks.values():
            task.cancel()


def ids_on(engine: fusee.Engine, index: int, prefix: str, count: int) -> list[str]:
    return [w for w in (f"{prefix}-{n}" for n in range(1000)) if engine.shard_index(w) == index][:count]


def done(journal: list[R.Rec], name: str) -> list[bytes]:
    """The results a journal recorded for step `name`."""
    return [r.value for r in journal if isinstance(r, R.StepDone) and r.name == name]


# -- attach and detach ------------------------------------------------------------------------


async def test_a_shard_detached_mid_step_hands_its_runs_back_and_its_next_holder_finishes_each_once():
    """Engine A lets go of a shard while two runs are inside thread steps and six others
    sleep: the report hands the two back (due now, work left), A refuses calls for the
    shard from then on, and the held steps' results, arriving after the detach, land
    nowhere. Engine B attaches the shard and finishes all eight; every step is recorded
    once, the handed-back ones with B's attempt."""
    clock = fusee.VirtualClock()
    storage = MemoryStorage(1)
    a = await fusee.Engine.open(workflows=[job], storage=storage, clock=clock, park_after="1h")
    held = ["job-0", "job-1"]
    others = [f"job-{n}" for n in range(2, 8)]
    GATE.held.update(held)
    for n, wid in enumerate(held + others):
        await a.start(job, wid, n)

    async def others_asleep() -> bool:
        return all([done((await a.run(w).describe()).journal, "middle") for w in others])

    await eventually(others_asleep)
    # (The held steps' threads may start after the others' on a loaded machine: their
    # first attempts are waited for, and stay at one while held.)
    await eventually(lambda: all(GATE.attempts[w] == 1 for w in held))
    old = a.by_index[0]
    report = await asyncio.wait_for(a.detach(0, deadline=1.0), 5)
    assert sorted(report.handed_back) == held
    assert report.next_due_ms == 0 and report.work_left
    assert report.shard == 0 and report.epoch == storage.stores[0].epoch
    assert a.shards == [] and 0 not in a.by_index
    with pytest.raises(fusee.RejectedError, match="does not hold"):
        await a.run(held[0]).status()
    with pytest.raises(fusee.RejectedError, match="does not hold"):
        await a.start(job, "job-new", 99)

    # A's held attempts return after the detach: their results are dropped.
    log, checkpoint = list(storage.stores[0].log), storage.stores[0].checkpoint_data
    GATE.release.set()
    await eventually(lambda: GATE.returned == len(held))
    await asyncio.sleep(0.05)  # the loop takes the threads' results
    assert storage.stores[0].log == log and storage.stores[0].checkpoint_data is checkpoint
    assert old.report().steps_run == report.steps_run  # not even counted as run

    b = await fusee.Engine.open(workflows=[job], storage=storage, clock=clock, shard_ids=[], park_after="1h")
    await b.attach(0)
    got = await results(b, clock, held + others)
    assert got == {w: f"{w}/attempt-{2 if w in held else 1}" for w in held + others}
    assert GATE.attempts == {**{w: 2 for w in held}, **{w: 1 for w in others}}
    for wid in held + others:
        journal = (await b.run(wid).describe()).journal
        assert [len(done(journal, name)) for name in ("first", "middle", "last")] == [1, 1, 1], wid
        assert done(journal, "middle") == [f'"{got[wid]}"'.encode()]
    await b.close()
    await a.close()


class StallingStore(MemoryShardStore):
    """A shard store whose checkpoint write never finishes while `stall` is set."""

    stall = False

    async def checkpoint(self, position: int, data: bytes) -> None:
        if self.stall:
            await asyncio.Event().wait()
        await super().checkpoint(position, data)


class Stalling(MemoryStorage):
    def __init__(self, shards: int) -> None:
        super().__init__(shards)
        self.stores = [StallingStore() for _ in range(shards)]


@pytest.mark.parametrize("stall", [False, True], ids=["checkpoint-written", "checkpoint-stalls"])
async def test_close_returns_within_its_deadline_while_a_thread_step_runs_and_hands_its_run_back(stall):
    """A thread step cannot be interrupted: close does not wait for it (nor, past the
    deadline, for a checkpoint that does not finish), reports the run handed back, and
    the next engine on the storage runs the step again and records its result once."""
    clock = fusee.VirtualClock()
    storage = Stalling(1)
    engine = await fusee.Engine.open(workflows=[job], storage=storage, clock=clock, park_after="1h")
    GATE.held.add("job-0")
    await engine.start(job, "job-0", 0)
    await eventually(lambda: GATE.attempts["job-0"] == 1)
    storage.stores[0].stall = stall
    began = time.monotonic()
    reports = await asyncio.wait_for(engine.close(deadline=0.3), 5)
    took = time.monotonic() - began
    assert took < 0.3 + 0.4, took
    if stall:
        assert took >= 0.25, took  # it did wait for the checkpoint, up to its deadline
    assert [(r.shard, r.handed_back, r.next_due_ms, r.work_left) for r in reports] == [
        (0, ["job-0"], 0, True)
    ]
    assert not GATE.release.is_set() and GATE.returned == 0  # the step still runs

    storage.stores[0].stall = False
    again = await fusee.Engine.open(workflows=[job], storage=storage, clock=clock, park_after="1h")
    assert await results(again, clock, ["job-0"]) == {"job-0": "job-0/attempt-2"}
    GATE.release.set()
    await eventually(lambda: GATE.returned == 1)
    await asyncio.sleep(0.05)
    journal = (await again.run("job-0").describe()).journal
    assert done(journal, "middle") == [b'"job-0/attempt-2"']
    await again.close()


class SlowOpens(MemoryStorage):
    """Memory storage whose shards take 0.2 s each to open, as a remote lease does."""

    async def open_shard(self, index: int, report: Any, receive: Any) -> Any:
        await asyncio.sleep(0.2)
        return await super().open_shard(index, report, receive)


def test_an_engine_opens_its_shards_side_by_side():
    """Four shards whose opening takes 0.2 s each open in 0.2 s, not 0.8 s: an invoked
    worker's cold start pays for one shard's open, not for each in turn. (On a loop whose
    clock moves only to its next timer: the duration is exact.)"""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        engine = await fusee.Engine.open(workflows=[quick], storage=SlowOpens(4), clock=fusee.VirtualClock())
        took = loop.time() - began
        assert [s.index for s in engine.shards] == [0, 1, 2, 3]
        assert took == pytest.approx(0.2), took
        await engine.close()

    run_on_virtual_time(main)


async def test_a_revoked_lease_stops_the_shard_and_its_next_holder_recovers_every_acknowledged_start():
    """The storage takes the shard from A (a silent worker's lease ended): A's caller
    waiting on a result gets LeaseLostError, the shard leaves A, A's calls for its
    workflows get LeaseLostError, and nothing A does afterwards (a thread step that
    returns, timers coming due) reaches the log. B attaches the shard and finds every
    start A acknowledged."""
    clock = fusee.VirtualClock()
    storage = MemoryStorage(1)
    a = await fusee.Engine.open(workflows=[job, waiter], storage=storage, clock=clock, park_after="1h")
    GATE.held.add("job-0")
    await a.start(job, "job-0", 0)
    await a.start(job, "job-1", 1)  # gets to its sleep
    waiters = [f"w-{n}" for n in range(5)]
    for wid in waiters:
        await a.start(waiter, wid)
    await eventually(lambda: GATE.attempts == {"job-0": 1, "job-1": 1})
    waiting = asyncio.ensure_future(a.run("w-0").result())
    await turns()
    assert not waiting.done()

    storage.revoke(0)
    with pytest.raises(fusee.LeaseLostError):
        await asyncio.wait_for(waiting, 5)
    assert a.shards == [] and 0 not in a.by_index
    with pytest.raises(fusee.LeaseLostError):
        await a.run("w-1").signal(go, 1)
    with pytest.raises(fusee.LeaseLostError):
        await a.start(waiter, "w-late")

    log = list(storage.stores[0].log)
    GATE.release.set()
    await eventually(lambda: GATE.returned == 1)
    await asyncio.sleep(0.05)
    await advance(clock, 5_000)  # job-1's sleep would end here
    assert storage.stores[0].log == log

    b = await fusee.Engine.open(
        workflows=[job, waiter], storage=storage, clock=clock, shard_ids=[0], park_after="1h"
    )
    for n, wid in enumerate(waiters):
        assert (await b.run(wid).status()).status == "running"
        await b.run(wid).signal(go, n)
    got = await results(b, clock, [*waiters, "job-0", "job-1"])
    assert got == {
        **{w: n for n, w in enumerate(waiters)},
        "job-0": "job-0/attempt-2",
        "job-1": "job-1/attempt-1",
    }
    with pytest.raises(fusee.NotFoundError):
        await b.run("w-late").status()
    await b.close()
    await a.close()


async def test_attach_and_detach_refuse_a_shard_they_cannot_take_or_give_back():
    """Attaching a shard held already, or one the storage does not have, and detaching one
    not held are refused, naming the shard, and change nothing."""
    storage = MemoryStorage(2)
    engine = await fusee.Engine.open(storage=storage, shard_ids=[0], clock=fusee.VirtualClock())
    with pytest.raises(fusee.RejectedError, match="shard 0 is attached already"):
        await engine.attach(0)
    with pytest.raises(fusee.RejectedError, match=r"\b7 is not a shard \(the storage has 2\)"):
        await engine.attach(7)
    with pytest.raises(fusee.RejectedError, match=r"-1 is not a shard"):
        await engine.attach(-1)
    with pytest.raises(fusee.RejectedError, match="'1' is not a shard"):
        await engine.attach("1")  # type: ignore[arg-type]
    with pytest.raises(fusee.RejectedError, match="shard 1 is not attached"):
        await engine.detach(1)
    assert [s.index for s in engine.shards] == [0]
    assert [s.epoch for s in storage.stores] == [1, 0]  # shard 1 was never opened
    await engine.attach(1)
    assert [s.index for s in engine.shards] == [0, 1]
    assert (await engine.detach(1)).shard == 1
    with pytest.raises(fusee.RejectedError, match="shard 1 is not attached"):
        await engine.detach(1)
    await engine.close()


async def test_a_shard_of_parked_runs_opened_and_closed_with_nothing_changed_writes_no_checkpoint():
    """Recovered from a checkpoint alone and closed untouched, the shard leaves the
    checkpoint as it was (an invoked worker that found nothing to do writes nothing);
    with one run started meanwhile, it writes a new one."""
    clock = fusee.VirtualClock()
    storage = MemoryStorage(1)
    engine = await fusee.Engine.open(workflows=[sleeper], storage=storage, clock=clock, park_after="100ms")
    for n in range(5):
        await engine.start(sleeper, f"s-{n}")
    await advance(clock, 1_000)
    assert engine.shards[0].runs == {}  # every run parked
    await engine.close()
    written = storage.stores[0].checkpoint_data
    assert written is not None

    engine = await fusee.Engine.open(workflows=[sleeper], storage=storage, clock=clock, park_after="100ms")
    await advance(clock, 1_000)  # its sweep runs too
    reports = await engine.close()
    assert storage.stores[0].checkpoint_data is written
    assert [(r.work_left, r.handed_back) for r in reports] == [(False, [])]

    engine = await fusee.Engine.open(workflows=[sleeper], storage=storage, clock=clock, park_after="100ms")
    await engine.start(sleeper, "s-new")
    await engine.close()
    assert storage.stores[0].checkpoint_data is not written


# -- pruning ----------------------------------------------------------------------------------


async def test_the_receivers_dedupe_set_stops_growing_and_still_absorbs_a_duplicate():
    """Each round a workflow on shard 0 sends ten signals to one on shard 1, then both
    shards checkpoint twice. The receiver's set of applied messages forgets those below
    the sender's low mark of the previous checkpoint, so it holds about a round's worth,
    not every message ever; a copy of a message it still remembers is absorbed (no second
    signal, no record) and answered."""
    clock = fusee.VirtualClock()
    storage = MemoryStorage(2)
    engine = await fusee.Engine.open(workflows=[pinger, sink], storage=storage, clock=clock)
    target = ids_on(engine, 1, "sink", 1)[0]
    senders = ids_on(engine, 0, "pinger", 3)
    await engine.start(sink, target)
    receiver = engine.by_index[1]
    sizes = []
    for round_, sender in enumerate(senders):
        await engine.start(pinger, sender, Pings(target, round_ * 10, 10))
        assert await asyncio.wait_for(engine.run(sender).result(), 5) == 10
        for _ in range(2):
            for shard in engine.shards:
                await shard.checkpoint(wait=True)
        sizes.append(len(receiver.outbox.received))
    journal = (await engine.run(target).describe()).journal
    assert [r.value for r in journal if isinstance(r, R.SignalReceived)] == [
        str(n).encode() for n in range(30)
    ]
    assert sizes[0] == 10 and sizes[2] <= sizes[1] <= 11, sizes
    kept = sorted(number for src, number in receiver.outbox.received if src == 0)
    assert kept[-1] == 30 and kept[0] >= 20, kept

    end = storage.stores[1].log_start + len(storage.stores[1].log)
    storage.relay(1, Msg("signal", 0, 30, target, name="ping", value=b"29", op=0, low=30))
    await turns()
    journal = (await engine.run(target).describe()).journal
    assert len([r for r in journal if isinstance(r, R.SignalReceived)]) == 30
    assert storage.stores[1].log_start + len(storage.stores[1].log) == end
    assert engine.by_index[0].outbox.pending == {}
    await engine.close()


async def test_a_finished_run_leaves_the_index_at_the_first_checkpoint_after_its_retention():
    """With retention="1h" a finished run is found for an hour; at the first checkpoint
    after that (written because the shard changed) it is gone and its ID starts afresh."""
    clock = fusee.VirtualClock()
    engine = await fusee.Engine.open(workflows=[quick], storage=MemoryStorage(1), clock=clock, retention="1h")
    await engine.start(quick, "q-1", 1)
    assert await engine.run("q-1").result() == 2
    await advance(clock, 59 * 60_000)
    shard = engine.shards[0]
    await shard.checkpoint(wait=True)
    assert (await engine.run("q-1").status()).status == "ok"
    await advance(clock, 2 * 60_000)
    await engine.start(quick, "q-2", 2)  # the shard changes: the checkpoint is written
    await shard.checkpoint(wait=True)
    with pytest.raises(fusee.NotFoundError):
        await engine.run("q-1").status()
    run = await engine.start(quick, "q-1", 5)
    assert await run.result() == 10
    assert (await run.status()).run == 1
    await engine.close()


async def test_a_finished_run_leaves_the_index_after_its_retention_even_on_a_shard_with_nothing_new():
    """The run finished, the shard checkpointed (its sweep does once every run ended),
    and nothing happened since: a checkpoint after the retention ended still forgets it
    (`prune_finished`: "runs at each checkpoint"; `retention`: how long a finished run
    stays in the index)."""
    clock = fusee.VirtualClock()
    engine = await fusee.Engine.open(workflows=[quick], storage=MemoryStorage(1), clock=clock, retention="1h")
    try:
        await engine.start(quick, "q-1", 1)
        assert await engine.run("q-1").result() == 2
        await advance(clock, 61 * 60_000)
        await engine.shards[0].checkpoint(wait=True)
        with pytest.raises(fusee.NotFoundError):
            await engine.run("q-1").status()
    finally:
        await engine.close()


async def test_closing_one_engine_leaves_the_shards_another_engine_holds_on_the_same_storage_working():
    """Memory storage hands shards to several engines (one per worker); one of them closing
    lets go of its own shards only: the other still starts runs and answers. (Closing
    one closed every lease, and the other's appends were dropped without a report.)"""
    clock = fusee.VirtualClock()
    storage = MemoryStorage(2)
    a = await fusee.Engine.open(workflows=[quick], storage=storage, shard_ids=[0], clock=clock)
    b = await fusee.Engine.open(workflows=[quick], storage=storage, shard_ids=[1], clock=clock)
    try:
        await a.close()
        run = await asyncio.wait_for(b.start(quick, ids_on(b, 1, "q", 1)[0], 1), 0.5)
        assert await asyncio.wait_for(run.result(), 0.5) == 2
    finally:
        b.abandon()


async def test_runs_that_come_due_together_are_read_back_in_one_batch():
    """A mass wake-up makes one round trip to the run store, not one per run (a remote
    store's reads cost a round trip each)."""
    clock = fusee.VirtualClock()
    storage = MemoryStorage(1)
    engine = await fusee.Engine.open(workflows=[sleeper], storage=storage, clock=clock, park_after="1s")
    try:
        for n in range(20):
            await engine.start(sleeper, f"due-{n}")
        for _ in range(50):  # the sweep parks them once they took their first turn
            if not engine.shards[0].runs:
                break
            clock.set(clock.now_ms() + 2_000)
            await asyncio.sleep(0.001)
        assert not engine.shards[0].runs  # all parked, due within a few 100 ms buckets
        reads = storage.stores[0].run_reads
        clock.set(clock.now_ms() + 3_600_000)
        await eventually(lambda: storage.stores[0].run_reads > reads and not engine.shards[0].loading)
        for _ in range(10):
            await asyncio.sleep(0)  # any second read would have been asked for by now
        assert storage.stores[0].run_reads == reads + 1
        for n in range(20):
            assert await asyncio.wait_for(engine.run(f"due-{n}").result(), 5) == "awake"
    finally:
        await engine.close()


async def test_an_answer_to_a_message_sent_under_another_lease_is_dropped():
    """An acknowledgment names the lease its message was sent under: one for a previous
    holder's send is dropped (the message stays pending, to be sent again from here and
    answered under this lease); one for this lease's send settles it."""
    storage = MemoryStorage(2)
    engine = await fusee.Engine.open(workflows=[sink], storage=storage, shard_ids=[0])
    try:
        sender = ids_on(engine, 0, "sender", 1)[0]
        target = ids_on(engine, 1, "target", 1)[0]
        shard = engine.shards[0]
        # A message from this shard to shard 1, which nobody holds: it waits at the relay.
        msg = Msg("signal", 0, shard.outbox.take_number(), target, name="go", value=b"1")
        shard.outbox._add(msg, sender, 1)
        shard.messages.deliver(msg)
        assert msg.epoch == shard.store.epoch and storage.relayed.waiting[1] == [msg]
        await shard.messages.acked(Ack(1, msg.seq, None, msg.epoch + 1))  # another lease's send
        assert msg.seq in shard.outbox.pending
        await shard.messages.acked(Ack(1, msg.seq, None, msg.epoch))
        assert msg.seq not in shard.outbox.pending
    finally:
        engine.abandon()


@fusee.workflow("lc.waiter")
async def waiter_changed(ctx: fusee.Ctx) -> int:
    """A deploy of lc.waiter that diverges from its journals: a step before the wait."""
    await ctx.step("new", lambda: 0)
    got: int = await ctx.wait_for(go)
    return got


async def test_a_shard_handed_over_takes_its_runs_at_every_point_of_their_lives():
    """Detached by one engine and attached by another, a shard's runs go on wherever they
    were: a parked one wakes on its timer, one waiting for a signal takes it, one started
    just before the hand-over takes its first turn, and a stuck one stays stuck (idle, not
    failed) until matching code takes the shard."""
    clock = fusee.VirtualClock()
    storage = MemoryStorage(1)
    a = await fusee.Engine.open(workflows=[sleeper, waiter], storage=storage, clock=clock, park_after="1s")
    await a.start(sleeper, "parked")
    for _ in range(50):
        if "parked" not in a.shards[0].runs:
            break
        clock.set(clock.now_ms() + 2_000)
        await asyncio.sleep(0.001)
    await a.start(waiter, "waiting")
    await eventually(lambda: len(a.shards[0].runs["waiting"].journal) > 1)  # it waits: recorded
    await a.start(sleeper, "fresh")  # detached before anything else can happen to it
    await a.detach(0)
    with pytest.raises(fusee.RejectedError, match="does not hold"):
        await a.run("parked").status()
    # A deploy whose code diverges: the waiting run gets stuck there...
    b = await fusee.Engine.open(
        workflows=[sleeper, waiter_changed], storage=storage, clock=clock, shard_ids=[]
    )
    await b.attach(0)
    assert (await asyncio.wait_for(b.run("waiting").status(), 5)).status == "stuck"
    assert await asyncio.wait_for(b.wait_idle(0.01, timeout=2), 3)  # stuck is idle, not busy
    assert not b.shards[0].report().work_left
    await b.detach(0)
    # ...and the code that matches, on a third engine, finishes every run.
    c = await fusee.Engine.open(workflows=[sleeper, waiter], storage=storage, clock=clock, shard_ids=[])
    try:
        await c.attach(0)
        await c.run("waiting").signal(go, 5)
        assert await asyncio.wait_for(c.run("waiting").result(), 5) == 5
        clock.set(clock.now_ms() + 3_700_000)
        for wid in ("parked", "fresh"):
            assert await asyncio.wait_for(c.run(wid).result(), 5) == "awake"
    finally:
        await c.close()
        await b.close()
        await a.close()


async def test_bad_deadlines_graces_and_shards_are_refused_before_anything_is_let_go():
    engine = await fusee.Engine.open(workflows=[quick], storage=MemoryStorage(2))
    try:
        for bad in (-1, float("nan"), float("inf"), "1s", True):
            with pytest.raises(fusee.RejectedError, match="deadline="):
                await engine.detach(0, bad)  # type: ignore[arg-type]
            with pytest.raises(fusee.RejectedError, match="deadline="):
                await engine.close(bad)  # type: ignore[arg-type]
            with pytest.raises(fusee.RejectedError, match="grace="):
                await engine.wait_idle(bad)  # type: ignore[arg-type]
            with pytest.raises(fusee.RejectedError, match="timeout="):
                await engine.wait_idle(0.01, bad)  # type: ignore[arg-type]
        for bad_index in (7, -1, "0"):
            with pytest.raises(fusee.RejectedError, match="not a shard"):
                engine.drain([bad_index])  # type: ignore[list-item]
        assert [s.index for s in engine.shards] == [0, 1] and not any(s.draining for s in engine.shards)
        run = await engine.start(quick, "still-works", 2)
        assert await asyncio.wait_for(run.result(), 5) == 4
    finally:
        await engine.close()
    with pytest.raises(fusee.ClosedError):
        await engine.attach(0)
    with pytest.raises(fusee.ClosedError):
        await engine.detach(0)
