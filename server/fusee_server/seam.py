"""What `fusee server` asks of durable storage: one contract, two stores (docs/server.md,
*The store*).

- `disk.py`, `Disk`: the Rust disk path, one data directory (the default);
- `postgres/store.py`, `PgStore`: one PostgreSQL database that several servers share,
  one owning the shards at a time under epochs the database keeps (docs/postgresql.md).

Every write comes after its worker's lease was checked (`Leases.held`) in the same step
of the loop. A store acknowledges a holder's records (DURABLE) only once they are
durable, and a new holder's open reads only after the previous holder's writes settled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

from fusee.protocol import messages as m

if TYPE_CHECKING:
    from fusee_server.leases import Lease
    from fusee_server.listener import ServerConnection


class Definitions(Protocol):
    """Where the limits' definitions live (limits.py)."""

    def load(self) -> bytes | None:
        """The definitions last saved, or None if none ever were."""

    def save(self, data: bytes) -> Awaitable[None] | None:
        """Replace them durably: done on return, or when the awaitable is."""


class Store(Protocol):
    shard_count: int
    counts: list[dict[str, int]]  # per shard, what /metrics says of it (fusee_<counter>)
    failed: Callable[[], None]  # called when the store stopped after a failed write

    @property
    def backup(self) -> Any:
        """The continuous backup, if the store has one (docs/backup.md)."""

    @property
    def definitions(self) -> Definitions: ...

    def appended(self, index: int) -> int:
        """The shard's last position staged (durable or not yet)."""

    def append(self, conn: ServerConnection, lease: Lease, message: m.Append) -> None:
        """Stage a holder's records; DURABLE goes to it once they are durable."""

    def put_run(self, conn: ServerConnection, lease: Lease, message: m.PutRun) -> None:
        """Write a run-store frame at its offset and answer RUN_PUT."""

    def after_durable(self, index: int, position: int, then: Callable[[str | None], None]) -> None:
        """`then(None)` once the shard is durable up to `position`, `then(why)` if never."""

    async def reply(self, index: int, request: m.Request) -> m.Reply:
        """A holder's open, page of records, frames or checkpoint (a failure in words)."""

    def preopen(self, granted: list[tuple[int, int]]) -> list[m.Opened]:
        """Opens answered ahead in an invoked worker's WELCOME, for what needs no waiting."""

    def dues(self) -> list[int | None]:
        """Per shard, when the invoker last heard it is due: None (never heard), -1
        (nothing due), 0 (held, or due now) or a wall-clock time in ms."""

    def set_due(self, index: int, due_ms: int) -> None:
        """Keep a shard's due time (as `dues` gives it) for the next server."""

    def serving(self) -> str | None:
        """Why this server may not take a worker now (it no longer owns the shards), or None."""

    async def close(self) -> None:
        """Everything staged made durable (unless the store stopped), then closed."""


def acknowledge(
    counts: dict[str, int],
    conn: ServerConnection,
    lease: Lease,
    epoch: int,
    position: int,
    flush: tuple[float, int],
) -> None:
    """A holder's records are durable up to `position`: the flush counted (`flush` is when
    it was asked and how many records it took) and DURABLE sent, only to the lease they
    were written under (a new holder's positions are its own)."""
    counts["flushes"] += 1
    counts["flushed_records"] += flush[1]
    counts["flush_us"] += int((perf_counter() - flush[0]) * 1_000_000)
    if lease.holder is conn and lease.epoch == epoch:
        conn.send(m.Durable([(lease.index, epoch, position)]))
