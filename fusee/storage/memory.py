"""Memory storage: every shard's log, run store and checkpoint in lists. Tests and the
test kit use it; nothing survives the process.

A shard's data (`MemoryShardStore`) outlives the engines that hold it, so a test can drop
an engine (a crash) and recover another from it, or hand the shard to a second engine.
Each `open_shard` takes it under a new lease epoch and returns a `MemoryLease`, the
contract's store: once a newer lease exists, the old one's writes are refused and
reported as a lost lease, as the server refuses a deposed worker's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from fusee._errors import LeaseLostError
from fusee.journal import Ack, Msg
from fusee.storage.contract import PAGE_BYTES, Durability, Receive, Report
from fusee.storage.relay import Relay


class MemoryShardStore:
    """One shard's data. Tests subclass it to inject faults (a full disk, slow reads).

    With `instant=False` it behaves like a disk for the engine's sake: a flush takes a turn
    of the event loop and covers what was staged when it began, and the next lease (after
    a crash) finds every record no flush covered gone. Tests use it to check that nothing
    leaves the engine before the records behind it are durable."""

    def __init__(self, instant: bool = True) -> None:
        self.instant = instant
        self.durable = 0
        self.flushes = 0
        self.log: list[bytes] = []
        self.log_start = 0  # position of log[0]: a checkpoint drops what it covers
        self.runs: list[bytes] = []
        self.checkpoint_data: bytes | None = None
        self.checkpoint_position = 0
        self.epoch = 0  # the newest lease's
        self.lease: MemoryLease | None = None
        self.run_reads = 0  # round trips to the run store (a batch counts once)

    @property
    def opened(self) -> bool:
        return self.lease is not None and not self.lease.dropped

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

    async def checkpoint(self, position: int, data: bytes) -> None:
        self.checkpoint_data = data
        self.checkpoint_position = position
        del self.log[: position - self.log_start]
        self.log_start = position

    def lose_unflushed(self) -> None:
        """A new lease after a crash: what no flush covered is gone."""
        del self.log[self.durable - self.log_start :]


class MemoryLease:
    """A shard's data held under one lease epoch: the contract's `ShardStore`."""

    def __init__(
        self, data: MemoryShardStore, epoch: int, report: Report, release: Callable[[], None]
    ) -> None:
        self.data = data
        self.epoch = epoch
        self.report = report
        self.release = release  # stops the relay delivering to this holder
        self.dropped = False  # closed, abandoned, failed or deposed: nothing more is reported
        self.position = data.log_start + len(data.log)
        self.flushing: asyncio.Task[None] | None = None
        self.again = False

    def _held(self) -> bool:
        if self.dropped:
            return False
        if self.data.epoch != self.epoch:
            self.lose(LeaseLostError(f"shard lease {self.epoch} was taken over by lease {self.data.epoch}"))
            return False
        return True

    def lose(self, error: BaseException, *, now: bool = False) -> None:
        """Report a failure once (`now`: from inside this call; else on a later turn, as
        the shard may be in the middle of an append) and nothing after it."""
        if not self.dropped:
            self.dropped = True
            self.release()
            if now:
                self.report(error)
            else:
                asyncio.get_running_loop().call_soon(self.report, error)

    def append(self, entry: bytes) -> int:
        self.position += 1
        data = self.data
        if (not self.dropped and data.epoch == self.epoch) or self._held():
            position = data.append(entry)
            if data.instant:
                self.report(position)
        return self.position

    def flush(self) -> None:
        if not self._held():
            return
        if self.flushing is not None and not self.flushing.done():
            self.again = True  # asked while a flush runs (its own report asks for the next)
        else:
            self.flushing = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        self.again = True
        while self.again and self._held():
            self.again = False
            try:
                durable = await self.data.flush()
            except Exception as error:  # noqa: BLE001 - a failed flush stops the shard
                self.lose(error)
                return
            if self._held():
                self.report(durable)

    def put_run(self, frame: bytes) -> int:
        if (self.dropped or self.data.epoch != self.epoch) and not self._held():
            return len(self.data.runs)
        try:
            return self.data.put_run(frame)
        except Exception as error:  # noqa: BLE001 - reported, never raised: the shard stops
            self.lose(error, now=True)  # at once: the shard must not reference the offset
            return len(self.data.runs)

    async def get_runs(self, offsets: Sequence[int]) -> list[bytes]:
        self.data.run_reads += 1
        return [await self.data.get_run(offset) for offset in offsets]

    async def latest_checkpoint(self) -> tuple[int, bytes] | None:
        data = self.data.checkpoint_data
        return None if data is None else (self.data.checkpoint_position, data)

    async def records(self, after: int, max_bytes: int = PAGE_BYTES) -> list[bytes]:
        data = self.data
        page: list[bytes] = []
        size = 0
        for entry in data.log[max(after, data.log_start) - data.log_start : data.durable - data.log_start]:
            if page and size + len(entry) > max_bytes:
                break
            page.append(entry)
            size += len(entry)
        return page

    async def checkpoint(self, position: int, data: bytes) -> None:
        if not self._held():
            raise LeaseLostError(f"shard lease {self.epoch} is no longer held: its checkpoint is not written")
        await self.data.checkpoint(position, data)

    async def close(self) -> None:
        self.dropped = True
        self.release()

    def abandon(self) -> None:
        self.dropped = True
        self.release()
        if self.flushing is not None:
            self.flushing.cancel()

    def fenced(self) -> bool:
        return False  # one process: no lease to lose unheard


class MemoryStorage:
    """Every shard in memory; nothing survives the process."""

    durability = Durability.MEMORY

    def __init__(self, shards: int, instant: bool = True) -> None:
        self.shards = shards
        self.stores = [MemoryShardStore(instant=instant) for _ in range(shards)]
        self.relayed = Relay()

    async def open_shard(self, index: int, report: Report, receive: Receive) -> MemoryLease:
        data = self.stores[index]
        if data.lease is not None:
            data.lease.abandon()  # a holder that never let go is deposed (it crashed)
        data.lose_unflushed()
        data.epoch += 1
        lease = data.lease = MemoryLease(
            data, data.epoch, report, lambda: self.relayed.detach(index, receive)
        )
        self.relayed.attach(index, receive)
        return lease

    def relay(self, index: int, item: Msg | Ack) -> None:
        self.relayed.send(index, item)

    def revoke(self, index: int) -> None:
        """Take shard `index`'s lease from its holder, as the server does from a silent
        worker: the holder is told at once, and its writes from now on are refused."""
        data = self.stores[index]
        data.epoch += 1
        if data.lease is not None:
            data.lease.lose(LeaseLostError(f"shard {index}: its lease was revoked"))

    async def close(self) -> None:
        """Nothing to release: each engine closes the shards it holds (a shard another
        engine holds on the same storage keeps working)."""

    async def abandon(self) -> None:
        for data in self.stores:
            if data.lease is not None:
                data.lease.abandon()
