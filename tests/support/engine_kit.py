"""What the in-process engine's tests share: loop turns and a virtual clock moved with the
work of each due time, a run that waits for a signal, one that naps, a parked run's frame,
and run-store reads that take a while or are held back."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import fusee
from fusee.engine.shard import Shard
from fusee.storage import MemoryShardStore, MemoryStorage

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


class HeldRead:
    """Holds back the first run-store read of a shard that asks for a given frame, until
    `release()`; every other read goes through."""

    def __init__(self, shard: Shard, ref: int) -> None:
        self.ref = ref
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()
        self.armed = True
        get_runs = shard.store.get_runs

        async def held(offsets: Sequence[int]) -> list[bytes]:
            if self.armed and ref in offsets:
                self.armed = False
                self.asked.set()
                await self.gate.wait()
            return await get_runs(offsets)

        shard.store.get_runs = held  # type: ignore[method-assign]

    def release(self) -> None:
        self.gate.set()


class SlowReads(MemoryStorage):
    """Memory storage whose run-store reads take a while, as a remote store's do."""

    def __init__(self, shards: int) -> None:
        super().__init__(shards)
        self.stores = [SlowStore() for _ in range(shards)]


class SlowStore(MemoryShardStore):
    async def get_run(self, offset: int) -> bytes:
        await asyncio.sleep(0.05)
        return self.runs[offset]
