"""The storage contract: what the engine asks of a backend.

One interface serves every backend (memory now; the local disk path and a remote server
next): a shard's store is opened and recovered on its own, appends are pipelined (they
never wait), durability is learnt as a position, the run store is written at offsets the
writer computes, and closing a shard flushes, then checkpoints.
"""

from __future__ import annotations

import enum
from typing import Protocol

import msgspec


class Durability(enum.Enum):
    """Where records go, and what a record's durability promises."""

    MEMORY = "memory"
    """Nowhere: an appended record is "durable" at once and gone with the process. Tests."""

    LOCAL = "local"
    """The shared log of a data directory on this machine: survives a process crash, and
    power loss where the drive honours flushes."""

    SERVER = "server"
    """A `fusee server` holds the log: durable once the server flushed it."""


class Recovered(msgspec.Struct):
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
