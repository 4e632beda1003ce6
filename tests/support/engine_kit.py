"""What the in-process engine's tests share: loop turns and a virtual clock moved with the
work of each due time, a run that waits for a signal, one that naps, a parked run's frame,
and run-store reads that take a while (held ones: `fusee.testing.faults.held_read`)."""

from __future__ import annotations

import asyncio

import fusee
from fusee.storage import MemoryStorage
from fusee.testing.faults import Faults, FaultyStorage

go = fusee.signal("go", int)


@fusee.workflow("lc.waiter")
async def waiter(ctx: fusee.Ctx) -> int:
    got: int = await ctx.wait_for(go)
    return got


@fusee.workflow("waits.napper")
async def napper(ctx: fusee.Ctx, ms: int) -> int:
    await ctx.sleep("nap", ms)
    return ms


async def turns(count: int = 30) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def advance(clock: fusee.VirtualClock, ms: int) -> None:
    """Move the virtual clock, letting the work of each due time run before time moves on."""
    target = clock.now_ms() + ms
    await turns()
    while (due := clock.next_due_ms()) is not None and due <= target:
        clock.set(max(due, clock.now_ms()))
        await turns()
    clock.set(target)
    await turns()


def parked_ref(engine: fusee.Engine, wid: str) -> int:
    shard = engine.shard_of(wid)
    assert wid not in shard.runs, f"'{wid}' is loaded"
    entry = shard.index_entries.get(wid)
    assert entry is not None and entry.status == "parked", entry
    return entry.ref


def slow_reads(shards: int) -> FaultyStorage:
    """Memory storage whose run-store frame reads take 50 ms each, as a remote store's do
    (a fault of `fusee.testing.faults`)."""
    return FaultyStorage(MemoryStorage(shards), Faults(read_delay_s=0.05))
