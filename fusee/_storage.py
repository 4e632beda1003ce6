"""The storage interface the engine talks to, and its memory backend.

One interface serves every backend (memory now; the local disk path and a remote server
next): a shard's store is opened and recovered on its own, appends are pipelined (they
never wait), durability is learnt as a position, the run store is written at offsets the
writer computes, and closing a shard flushes, then checkpoints.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Protocol


class Durability(enum.Enum):
    """Where records go, and what a record's durability promises."""

    MEMORY = "memory"
    """Nowhere: an appended record is "durable" at once and gone with the process. Tests."""

    LOCAL = "local"
    """The shared log of a data directory on this machine: survives a process crash, and
    power loss where the drive honours flushes."""

    SERVER = "server"
    """A `fusee server` holds the log: durable once the server flushed it."""


@dataclass(slots=True)
class Recovered:
    """What a shard recovers from: its newest checkpoint and the log records after it."""

    checkpoint: bytes | None
    records: list[bytes]


class ShardStore(Protocol):
    """One shard's view of storage."""

    instant: bool
    """True when an append is durable as soon as it is made (memory)."""

    def append(self, entry: bytes) -> int:
        """Stage one log record; returns its position. Never waits."""

    async def flush(self) -> int:
        """Make every staged record durable; returns the durable position. The engine keeps
        one flush in flight per shard."""

    def put_run(self, frame: bytes) -> int:
        """Append a run's frame to the run store; returns its offset. Pipelined: the frame
        becomes durable with the next checkpoint, which is the first thing to reference it
        (until then the log after the previous checkpoint still holds the run's records)."""

    async def get_run(self, offset: int) -> bytes:
        """Read a frame back (also one not yet durable)."""

    async def recover(self) -> Recovered:
        """The newest valid checkpoint and every durable record after it."""

    async def checkpoint(self, position: int, data: bytes) -> None:
        """Make the run store durable, then record `data` as covering the log up to
        `position`; records up to it are no longer needed for recovery."""

    async def close(self) -> None:
        """Release the shard (its owner flushed and checkpointed first)."""


class Storage(Protocol):
    durability: Durability
    shards: int

    async def open_shard(self, index: int) -> ShardStore: ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class MemoryShardStore:
    """A shard kept in memory. It outlives an engine, so `TestEngine.crash()` can drop the
    engine and recover a new one from what the store holds.

    With `instant=False` it behaves like a disk for the engine's sake: a flush takes a turn
    of the event loop and covers what was staged when it began, and a recovery (a crash)
    loses every record no flush covered. Tests use it to check that nothing leaves the
    engine before the records behind it are durable."""

    instant: bool = True
    durable: int = 0
    flushes: int = 0
    log: list[bytes] = field(default_factory=list)
    log_start: int = 0  # position of log[0]: a checkpoint drops what it covers
    runs: list[bytes] = field(default_factory=list)
    checkpoint_data: bytes | None = None
    checkpoint_position: int = 0
    opened: bool = False

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
