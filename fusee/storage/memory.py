"""Memory storage: every shard's log, run store and checkpoint in lists. Tests and the
test kit use it; nothing survives the process."""

from __future__ import annotations

import asyncio

from fusee.storage.contract import Durability, Recovered


class MemoryShardStore:
    """A shard kept in memory. It outlives an engine, so `TestEngine.crash()` can drop the
    engine and recover a new one from what the store holds.

    With `instant=False` it behaves like a disk for the engine's sake: a flush takes a turn
    of the event loop and covers what was staged when it began, and a recovery (a crash)
    loses every record no flush covered. Tests use it to check that nothing leaves the
    engine before the records behind it are durable."""

    def __init__(self, instant: bool = True) -> None:
        self.instant = instant
        self.durable = 0
        self.flushes = 0
        self.log: list[bytes] = []
        self.log_start = 0  # position of log[0]: a checkpoint drops what it covers
        self.runs: list[bytes] = []
        self.checkpoint_data: bytes | None = None
        self.checkpoint_position = 0
        self.opened = False

    def append(self, entry: bytes) -> int:
        self.log.append(entry)
        position = self.log_start + len(self.log)
        if self.instant:
            self.durable = position
        return position

    async def flush(self) -> int:
        position = self.log_start + len(self.log)
        if not self.instant:
            await asyncio.sleep(0)  # the write takes a turn; later appends wait for the next
        self.flushes += 1
        self.durable = max(self.durable, position)
        return self.durable

    def put_run(self, frame: bytes) -> int:
        self.runs.append(frame)
        return len(self.runs) - 1

    async def get_run(self, offset: int) -> bytes:
        return self.runs[offset]

    async def recover(self) -> Recovered:
        # What no flush covered is gone, as after a crash.
        del self.log[self.durable - self.log_start :]
        return Recovered(self.checkpoint_data, self.log[self.checkpoint_position - self.log_start :])

    async def checkpoint(self, position: int, data: bytes) -> None:
        self.checkpoint_data = data
        self.checkpoint_position = position
        del self.log[: position - self.log_start]
        self.log_start = position

    async def close(self) -> None:
        self.opened = False


class MemoryStorage:
    """Every shard in memory; nothing survives the process."""

    durability = Durability.MEMORY

    def __init__(self, shards: int, instant: bool = True) -> None:
        self.shards = shards
        self.stores = [MemoryShardStore(instant=instant) for _ in range(shards)]

    async def open_shard(self, index: int) -> MemoryShardStore:
        store = self.stores[index]
        store.opened = True
        return store

    async def close(self) -> None:
        for store in self.stores:
            store.opened = False
