"""The storage contract: what the engine asks of a backend, and what a backend tells it.

One contract serves every backend (memory, the local disk path, a remote server): a
shard's store is opened under a lease epoch and recovered on its own; appends are staged
and never wait; durability is pushed back, never polled; the run store is written at
offsets the writer computes; recovery reads pages after any position, as often as asked;
and a store can be dropped without a word, as a crash would drop it.

What a store tells its shard goes through the two functions the shard hands to
`open_shard`, so nothing above this contract knows which backend it has:

- `report(position | error)`: everything up to `position` is durable; or the store
  failed (a failed flush, a refused run-store write, a lost lease) and the shard must
  stop: nothing it staged since may be acknowledged.
- `receive(message | ack)`: a message or acknowledgment another engine's shard sent to
  this one (the relay).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Protocol

from fusee.journal import Ack, Msg

PAGE_BYTES = 1 << 20
"""About how many bytes of records one recovery page holds."""

Report = Callable[[int | BaseException], None]
Receive = Callable[[Msg | Ack], None]


class Durability(enum.Enum):
    """Where records go, and what a record's durability promises."""

    MEMORY = "memory"
    """Nowhere: an appended record is "durable" at once and gone with the process. Tests."""

    LOCAL = "local"
    """The shared log of a data directory on this machine: survives a process crash, and
    power loss where the drive honours flushes."""

    SERVER = "server"
    """A `fusee server` holds the log: durable once the server flushed it."""


class ShardStore(Protocol):
    """One shard's view of storage, held under one lease epoch."""

    epoch: int
    """The lease this store writes under: a newer holder's store has a higher one, and
    every write of an older one is refused (reported as a lost lease)."""

    def append(self, entry: bytes) -> int:
        """Stage one log record and return its position. Never waits, never raises. A
        store that is durable on append (memory) reports the position from inside
        this call; the shard is ready for that."""

    def flush(self) -> None:
        """Ask for every staged record to become durable. The store reports the durable
        position once a write covers them (possibly from inside this call), or the
        error that stops the shard. The shard keeps one request outstanding."""

    def put_run(self, frame: bytes) -> int:
        """Append a run's frame to the run store and return its offset. Never raises: a
        write the store cannot make (a full disk, an offset that disagrees with the
        store's length) is reported from inside this call, and the shard stops (it
        must not go on to reference the offset). The frame
        becomes durable with the next checkpoint, the first thing to reference it."""

    async def get_runs(self, offsets: Sequence[int]) -> list[bytes]:
        """Read frames back, in the order asked (also ones not yet durable): one round
        trip for a listing or a mass wake-up, not one per run."""

    async def latest_checkpoint(self) -> tuple[int, bytes] | None:
        """The newest valid checkpoint: the log position it covers, and its bytes."""

    async def records(self, after: int, max_bytes: int = PAGE_BYTES) -> list[bytes]:
        """The durable records after log position `after`, about `max_bytes` of them at
        most (at least one when there is one); empty at the end of the log. Any
        position, any number of times."""

    async def checkpoint(self, position: int, data: bytes) -> None:
        """Make the run store durable, then record `data` as covering the log up to
        `position`; records up to it are no longer needed for recovery."""

    async def close(self) -> None:
        """Release the shard (its owner flushed and checkpointed first)."""

    def abandon(self) -> None:
        """Drop the shard as a crash would: nothing staged is written, nothing more is
        reported, and the lease is let go."""

    def fenced(self) -> bool:
        """Whether the lease may be gone without this store having heard it yet (the
        process was stopped longer than the server waits): a step function must not
        start. Cheap, and safe to call from a step thread."""


class Storage(Protocol):
    durability: Durability
    shards: int

    async def open_shard(self, index: int, report: Report, receive: Receive) -> ShardStore:
        """Take shard `index` under a new lease epoch; messages relayed to it from now on
        (and those that waited for a holder) go to `receive`."""

    def relay(self, index: int, item: Msg | Ack) -> None:
        """Carry a message or acknowledgment to shard `index`, held by another engine or
        by none yet (it waits for a holder)."""

    async def close(self) -> None: ...

    async def abandon(self) -> None:
        """Drop every shard as a crash would and release what the storage holds (a
        directory's lock), so the process can open it again."""
