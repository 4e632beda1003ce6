"""A burst of calls for parked runs reads their frames in one run-store request per loop
turn (fusee/engine/run_reads.py): a client waiting on many results, or an invocation opening
while calls wait at the server, would otherwise make one round trip per run. Each caller
still gets its own run, and a caller that gives up leaves the others their answers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import fusee
from fusee.storage import MemoryStorage
from tests.support.engine_kit import advance, waiter


async def parked_engine(count: int) -> tuple[fusee.Engine, fusee.VirtualClock, list[list[int]]]:
    """`count` waiters, all parked; the run-store reads of the shard are recorded from here
    on (the offsets of each `get_runs`)."""
    clock = fusee.VirtualClock()
    engine = await fusee.Engine.open(
        workflows=[waiter], storage=MemoryStorage(1), clock=clock, park_after="100ms"
    )
    for n in range(count):
        await engine.start(waiter, f"w-{n}")
    await advance(clock, 1_000)
    shard = engine.shards[0]
    assert shard.runs == {}  # every run parked
    reads: list[list[int]] = []
    get_runs = shard.store.get_runs

    async def recorded(offsets: Sequence[int]) -> list[bytes]:
        reads.append(list(offsets))
        return await get_runs(offsets)

    shard.store.get_runs = recorded  # type: ignore[method-assign]
    return engine, clock, reads


async def test_signals_to_many_parked_runs_read_their_frames_in_one_request():
    engine, clock, reads = await parked_engine(25)
    await asyncio.gather(*(engine.run(f"w-{n}").signal("go", n) for n in range(25)))
    assert len(reads) == 1 and len(reads[0]) == 25, reads
    await advance(clock, 10)
    assert [await engine.run(f"w-{n}").result() for n in range(25)] == list(range(25))
    await engine.close()


async def test_a_caller_cancelled_while_its_read_waits_leaves_the_others_their_runs():
    engine, clock, reads = await parked_engine(3)
    gone = asyncio.ensure_future(engine.run("w-0").signal("go", 0))
    others = [asyncio.ensure_future(engine.run(f"w-{n}").signal("go", n)) for n in (1, 2)]
    await asyncio.sleep(0)  # each call has asked for its run's frame
    gone.cancel()
    await asyncio.gather(*others)
    assert [len(offsets) for offsets in reads] == [2]  # the cancelled caller's read never left
    await advance(clock, 10)
    assert [await engine.run(f"w-{n}").result() for n in (1, 2)] == [1, 2]
    assert (await engine.run("w-0").status()).status == "running"  # and it was never signalled
    await engine.close()


async def test_a_failed_batch_stops_the_shard_and_every_caller_in_it_hears_so():
    """A read that fails fails every load in its batch, as one failed read did alone: the
    shard stops (its state can no longer be trusted) and each caller gets the error."""
    engine, _, reads = await parked_engine(3)
    shard = engine.shards[0]

    async def broken(offsets: Sequence[int]) -> list[bytes]:
        reads.append(list(offsets))
        raise OSError(5, "injected: the run store cannot be read")

    shard.store.get_runs = broken  # type: ignore[method-assign]
    outcomes = await asyncio.gather(
        *(engine.run(f"w-{n}").signal("go", n) for n in range(3)), return_exceptions=True
    )
    assert [len(offsets) for offsets in reads] == [3]
    assert all(isinstance(o, fusee.FuseeError) for o in outcomes), outcomes
    assert shard.failed is not None
    await engine.close()
