"""The fault-injecting storage (fusee/testing/faults.py): each fault is injected when asked
for, and the wrapper keeps the storage contract while it does (positions only grow and
never pass what the memory store made durable; nothing after an error, a close or an
abandon; errors from put_run come from inside the call)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import fusee
from fusee.storage import MemoryStorage
from fusee.testing import TestEngine
from fusee.testing.faults import Faults, FaultyLease, FaultyStorage

ANSWER_S = 5.0


@fusee.workflow("faults.quick")
async def quick(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("one", lambda: n + 1)
    b = await ctx.step("two", lambda: a * 2)
    return b


class Recorder:
    """A shard's side of the contract, recording what the store reports and checking the
    promises as reports arrive."""

    def __init__(self) -> None:
        self.reports: list[int | BaseException] = []
        self.lease: FaultyLease | None = None
        self.inner_durable: Any = None  # () -> the memory store's durable position
        self.closed = False

    def report(self, value: int | BaseException) -> None:
        assert not self.closed, f"reported {value!r} after a close or an abandon"
        assert not any(isinstance(r, BaseException) for r in self.reports), f"{value!r} after an error"
        if isinstance(value, int):
            told = [r for r in self.reports if isinstance(r, int)]
            assert not told or value > told[-1], f"position {value} after {told[-1]}"
            assert value <= self.inner_durable(), f"{value} is beyond the store's durable position"
        self.reports.append(value)

    def receive(self, item: Any) -> None:
        pass

    @property
    def positions(self) -> list[int]:
        return [r for r in self.reports if isinstance(r, int)]

    @property
    def errors(self) -> list[BaseException]:
        return [r for r in self.reports if isinstance(r, BaseException)]


async def opened(faults: Faults, *, instant: bool = False, seed: int = 1) -> tuple[FaultyStorage, Recorder]:
    memory = MemoryStorage(1, instant=instant)
    storage = FaultyStorage(memory, faults, seed=seed)
    shard = Recorder()
    shard.inner_durable = lambda: memory.stores[0].durable
    shard.lease = await storage.open_shard(0, shard.report, shard.receive)
    return storage, shard


async def turns(n: int = 50) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def drain(shard: Recorder, until: int, timeout_s: float = 2.0) -> None:
    """Flush as a shard does (one request outstanding) until `until` is reported."""
    assert shard.lease is not None
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not shard.positions or shard.positions[-1] < until:
        if shard.errors:
            return
        shard.lease.flush()
        await turns(10)
        await asyncio.sleep(0.0005)
        assert asyncio.get_running_loop().time() < deadline, f"never reported {until}: {shard.reports}"


# -- the store alone ---------------------------------------------------------------------------


@pytest.mark.parametrize("instant", [False, True])
async def test_delayed_positions_arrive_late_and_in_order(instant):
    storage, shard = await opened(Faults(delay=1.0, max_turns=6, burst=0.7), instant=instant)
    assert shard.lease is not None
    last = 0
    for batch in range(20):
        for _ in range(batch % 4 + 1):
            last = shard.lease.append(b"x" * batch)
        shard.lease.flush()
        await asyncio.sleep(0)
    await drain(shard, last)
    assert shard.positions[-1] == last  # every record was told durable in the end
    assert storage.injected["delayed"] > 0
    assert storage.injected["coalesced"] + storage.injected["held_for_burst"] > 0
    assert not shard.errors


async def test_a_held_position_arrives_after_a_real_sleep():
    storage, shard = await opened(Faults(delay=1.0, sleep_share=1.0, max_delay_s=0.003))
    assert shard.lease is not None
    position = shard.lease.append(b"a")
    shard.lease.flush()
    await turns(5)
    assert shard.positions == []  # held: a turn or two is not enough
    await asyncio.sleep(0.01)
    await turns(5)
    assert shard.positions == [position]
    assert storage.injected["delayed"] == 1


async def test_bursts_deliver_only_growing_positions():
    storage, shard = await opened(Faults(delay=0.5, burst=1.0, max_holds=3, max_turns=2), seed=3)
    assert shard.lease is not None
    last = 0
    for _ in range(60):
        last = shard.lease.append(b"r")
        shard.lease.flush()
        await asyncio.sleep(0)
    await drain(shard, last)
    assert storage.injected["bursts"] + storage.injected["coalesced"] > 0
    assert len(shard.positions) < 60  # several positions arrived as one


async def test_a_lost_flush_reports_an_io_error_later_and_nothing_after():
    storage, shard = await opened(Faults(fail_flush=1.0))
    assert shard.lease is not None
    shard.lease.append(b"a")
    shard.lease.flush()
    assert shard.reports == []  # never from inside the flush
    await turns()
    for _ in range(3):
        shard.lease.append(b"b")
        shard.lease.flush()
        await turns()
    assert len(shard.errors) == 1 and shard.positions == []
    assert isinstance(shard.errors[0], OSError)
    assert storage.injected["failed_flush"] == 1
    assert storage.clear_failed().keys() == {0}


async def test_a_put_run_refused_is_reported_from_inside_the_call():
    storage, shard = await opened(Faults(refuse_put_run=1.0))
    assert shard.lease is not None
    shard.lease.put_run(b"frame")
    assert len(shard.errors) == 1  # at once: the shard must not reference the offset
    assert storage.inner.stores[0].runs == []  # nothing was written
    assert storage.injected["refused_put_run"] == 1


async def test_a_revoked_lease_is_reported_once_and_its_writes_are_refused():
    storage, shard = await opened(Faults(revoke=1.0))
    assert shard.lease is not None
    shard.lease.append(b"a")
    shard.lease.flush()
    await turns()
    assert len(shard.errors) == 1 and isinstance(shard.errors[0], fusee.LeaseLostError)
    assert storage.injected["revoked"] == 1
    assert storage.inner.stores[0].epoch > shard.lease.epoch


async def test_nothing_is_reported_after_abandon_or_close():
    for end in ("abandon", "close"):
        _, shard = await opened(Faults(delay=1.0, max_turns=4, fail_flush=0.5), seed=5)
        assert shard.lease is not None
        shard.lease.append(b"a")
        shard.lease.flush()
        await asyncio.sleep(0)
        if end == "abandon":
            shard.lease.abandon()
        else:
            await shard.lease.close()
        shard.closed = True  # the recorder fails on any report from here on
        await turns()
        await asyncio.sleep(0.005)


async def test_suspended_calls_off_the_faults_that_stop_a_shard():
    storage, shard = await opened(Faults(fail_flush=1.0, revoke=1.0, refuse_put_run=1.0))
    assert shard.lease is not None
    with storage.suspended():
        last = shard.lease.append(b"a")
        shard.lease.put_run(b"frame")
        await drain(shard, last)
    assert shard.positions == [last] and not shard.errors
    assert storage.stopping_faults() == 0


async def test_the_same_seed_injects_the_same_faults():
    async def counts(seed: int) -> dict[str, int]:
        storage, shard = await opened(Faults(delay=0.5, burst=0.5, max_turns=3), seed=seed)
        assert shard.lease is not None
        last = 0
        for _ in range(40):
            last = shard.lease.append(b"r")
            shard.lease.flush()
            await asyncio.sleep(0)
        await drain(shard, last)
        return {**storage.injected, "reports": len(shard.reports)}

    assert await counts(11) == await counts(11)


# -- under an engine -------------------------------------------------------------------------


async def engine(faults: Faults, seed: int = 1) -> tuple[TestEngine, FaultyStorage]:
    storage = FaultyStorage(MemoryStorage(2, instant=False), faults, seed=seed)
    with storage.suspended():
        t = await TestEngine.open([quick], shards=2, storage=storage)
    return t, storage


async def test_the_engine_runs_through_delays_and_bursts():
    t, storage = await engine(Faults(delay=0.8, burst=0.5, max_turns=5, sleep_share=0.2, slow_read=0.5))
    for i in range(6):
        await asyncio.wait_for(t.start(quick, f"q-{i}", i), ANSWER_S)
    for i in range(6):
        assert await t.result(f"q-{i}") == (i + 1) * 2
    await t.crash()
    for i in range(6):
        assert await t.result(f"q-{i}") == (i + 1) * 2
    assert storage.injected["delayed"] > 0
    assert storage.injected["slow_read"] > 0
    await t.close()


async def test_a_failed_flush_stops_the_shard_and_start_gets_an_io_error():
    t, storage = await engine(Faults())
    storage.faults = Faults(fail_flush=1.0)
    with pytest.raises(fusee.IoError, match="injected fault"):
        await asyncio.wait_for(t.start(quick, "q-1", 1), ANSWER_S)
    shard = t.engine.shard_index("q-1")
    assert storage.clear_failed().keys() == {shard}
    assert shard not in {s.index for s in t.engine.shards}
    with pytest.raises(fusee.IoError):  # the stopped shard refuses its workflows' calls
        await asyncio.wait_for(t.engine.run("q-1").status(), ANSWER_S)
    # A restart (the process after a disk error) recovers the shard; nothing was promised.
    storage.faults = Faults()
    await t.crash()
    run = await asyncio.wait_for(t.start(quick, "q-2", 2), ANSWER_S)
    assert await asyncio.wait_for(run.result(), ANSWER_S) == 6
    await t.close()


async def test_a_revoked_lease_makes_the_calls_fail_with_lease_lost():
    t, storage = await engine(Faults())
    storage.faults = Faults(revoke=1.0)
    with pytest.raises(fusee.LeaseLostError):
        await asyncio.wait_for(t.start(quick, "q-1", 1), ANSWER_S)
    with pytest.raises(fusee.LeaseLostError):
        await asyncio.wait_for(t.engine.run("q-1").status(), ANSWER_S)
    assert storage.injected["revoked"] >= 1
    storage.faults = Faults()
    await t.crash()
    run = await asyncio.wait_for(t.start(quick, "q-3", 3), ANSWER_S)
    assert await asyncio.wait_for(run.result(), ANSWER_S) == 8
    await t.close()


async def test_a_refused_frame_stops_the_shard_and_what_was_acknowledged_survives():
    t, storage = await engine(Faults())
    storage.faults = Faults(refuse_put_run=1.0)
    # Once the run's end is durable its frame is written to the run store, which refuses
    # it: the shard stops (the result is answered first, if it was asked for in time).
    run = await asyncio.wait_for(t.start(quick, "q-1", 1), ANSWER_S)
    try:
        assert await asyncio.wait_for(run.result(), ANSWER_S) == 4
    except fusee.IoError:
        pass
    await t.settle()
    assert storage.injected["refused_put_run"] == 1
    assert t.engine.shard_index("q-1") in storage.clear_failed()
    with pytest.raises(fusee.IoError, match="injected fault"):
        await asyncio.wait_for(t.engine.run("q-1").status(), ANSWER_S)
    storage.faults = Faults()
    await t.crash()
    assert await t.result("q-1") == 4  # acknowledged before the fault: still there
    await t.close()
