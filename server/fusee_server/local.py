"""Local mode: the engine's storage backend over a data directory on this machine.

Every shard's records go to the directory's one shared log. A shard asking for a flush
joins the write in flight or starts the next one, which takes every shard's staged
records as one batch with one durable flush (group commit). Writes run on one dedicated
thread with the GIL released, so the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fusee._errors import IoError, RejectedError
from fusee._storage import Durability, Recovered
from fusee_server import _native

FRAME_HEADER = 8  # a run-store frame: length and checksum, then the bytes


class LocalStorage:
    """The storage of a data directory, opened by one process at a time."""

    durability = Durability.LOCAL

    def __init__(
        self, root: Path, directory: _native.Directory, log: _native.Log, executor: ThreadPoolExecutor
    ) -> None:
        self.root = root
        self.directory = directory
        self.log = log
        self.shards = directory.shards
        self.executor = executor
        self.stores: dict[int, LocalShardStore] = {}
        self.write_task: asyncio.Future[None] | None = None
        self.failed: BaseException | None = None

    @classmethod
    async def open(
        cls,
        root: str | Path,
        shards: int | None = None,
        *,
        direct_io: bool = True,
        segment_bytes_min: int = 1 << 20,
        segment_bytes_max: int = 64 << 20,
    ) -> LocalStorage:
        """Lock the directory, check its shard count, and recover its log (on the log's
        thread: recovery reads every segment)."""
        root = Path(root)
        try:
            directory = _native.Directory(root, shards)
        except _native.DirectoryError as error:
            raise RejectedError(f"{root}: {error}") from None
        except OSError as error:
            raise IoError(f"{root}: {error}") from None
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fusee-log")
        loop = asyncio.get_running_loop()
        try:
            log = await loop.run_in_executor(
                executor,
                lambda: _native.Log(
                    str(root / "wal"), directory.shards, direct_io, segment_bytes_min, segment_bytes_max
                ),
            )
        except _native.CorruptionError as error:
            directory.release()
            executor.shutdown(wait=False)
            raise IoError(f"{root}: {error}") from None
        except OSError as error:
            directory.release()
            executor.shutdown(wait=False)
            raise IoError(f"{root}: {error}") from None
        return cls(root, directory, log, executor)

    async def open_shard(self, index: int) -> LocalShardStore:
        loop = asyncio.get_running_loop()
        try:
            files = await loop.run_in_executor(self.executor, _native.Shard, str(self.root), index)
        except _native.CorruptionError as error:
            raise IoError(f"{self.root}: {error}") from None
        store = LocalShardStore(self, index, files)
        self.stores[index] = store
        return store

    async def flush_for(self, shard: int) -> int:
        """Make `shard`'s staged records durable: join the write in flight, or start the
        next one once it completes (it takes what every shard staged meanwhile)."""
        log = self.log
        target = log.appended(shard)
        while log.durable(shard) < target:
            if self.failed is not None:
                raise IoError(
                    f"{self.root}: the log stopped after a failed flush ({self.failed}); restart the process"
                )
            task = self.write_task
            if task is None:
                task = self.write_task = asyncio.ensure_future(self._write())
            await asyncio.shield(task)
        return log.durable(shard)

    async def _write(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, self.log.write)
        except OSError as error:
            # Never acknowledge after a failed flush (the kernel may have dropped the
            # pages): every later flush of every shard fails too.
            self.failed = error
            raise IoError(f"{self.root}: log write failed: {error}") from None
        finally:
            self.write_task = None

    async def retire(self, fresh: bool = False) -> None:
        """Retire log segments that both retained checkpoints of every shard cover (at a
        clean close, `fresh`: move to an empty segment first when they cover it all)."""
        if len(self.stores) < self.shards:
            return  # a shard this process does not hold may still need any segment
        covered = [self.stores[i].files.covered() for i in range(self.shards)]
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, self.log.retire, covered, fresh)

    async def abandon(self) -> None:
        """Stop as a crash would (the test kit's `crash()`): nothing staged is written; the
        write in flight, if any, finishes before the lock is released, so it cannot land
        after the next open began writing."""
        self.failed = RuntimeError("abandoned")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.executor.shutdown, True)
        self.directory.release()

    async def close(self) -> None:
        if self.write_task is not None:
            try:
                await asyncio.shield(self.write_task)
            except IoError:
                pass
        if self.failed is None and len(self.stores) == self.shards:
            await self.retire(fresh=True)
        self.executor.shutdown(wait=True)
        self.directory.release()


class LocalShardStore:
    """One shard of a data directory: its records in the shared log, its run store and
    its checkpoints."""

    instant = False

    def __init__(self, storage: LocalStorage, index: int, files: _native.Shard) -> None:
        self.storage = storage
        self.index = index
        self.files = files
        self.log = storage.log
        self.runs_len = files.runs_len
        self.last_checkpoint: tuple[int, bytes] | None = None

    def append(self, entry: bytes) -> int:
        return self.log.stage(self.index, entry)

    async def flush(self) -> int:
        return await self.storage.flush_for(self.index)

    def put_run(self, frame: bytes) -> int:
        # The writer states the offset; the store refuses one that is not its length.
        offset = self.runs_len
        self.files.append_run(offset, frame)
        self.runs_len = offset + FRAME_HEADER + len(frame)
        return offset

    async def get_run(self, offset: int) -> bytes:
        return self.files.read_run(offset)

    async def recover(self) -> Recovered:
        checkpoint = self.files.recovered_checkpoint()
        position, data = checkpoint if checkpoint is not None else (0, None)
        self.log.ensure_next(self.index, position)
        return Recovered(data, self.log.take_recovered(self.index, position))

    async def checkpoint(self, position: int, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        # Not on the log's thread: a checkpoint's flushes must not delay log writes.
        await loop.run_in_executor(None, self.files.checkpoint, position, data)
        self.last_checkpoint = (position, data)
        await self.storage.retire()

    async def close(self) -> None:
        """After the engine's closing checkpoint, a second copy of it: with every record
        covered by two checkpoints, the next open replays nothing and the log under them
        can be retired."""
        last = self.last_checkpoint
        if last is not None and last[0] == self.log.appended(self.index) and self.storage.failed is None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self.files.checkpoint, last[0], last[1])
