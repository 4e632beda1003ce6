"""The disk path of `fusee server`: the holders' writes and reads handed to the Rust log
(`_native.Log`, one for every shard) and each shard's files (`_native.Shard`: its run
store and checkpoints), and their answers sent back.

The loop never waits on the disk: the log's writes and flushes run on the log's own
thread (group commit, as in local mode: `store.py`), and the disk work that may wait
(recovery reads, run-store reads, checkpoints, log retirement) on executors. Only what is
known to be small is read on the loop (INLINE_READ_BYTES: a thread hop costs more).
Every write here comes after its lease was checked (`Leases.held`) in the same step of
the loop: no other frame can move the lease between them (docs/server.md, *Leases and
liveness*; *The disk and the event loop*).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter
from typing import TYPE_CHECKING, Any

from fusee._errors import IoError
from fusee.engine.shard_metrics import zeros
from fusee.protocol import messages as m
from fusee_server import _native
from fusee_server.backup.continuous import Backup
from fusee_server.limits import DefinitionsFile
from fusee_server.seam import acknowledge
from fusee_server.store import LocalStorage

if TYPE_CHECKING:
    from fusee_server.leases import Lease
    from fusee_server.listener import ServerConnection

logger = logging.getLogger("fusee.server")

READ_THREADS = 4
PREOPEN_BYTES = 1 << 20  # an invoked worker's WELCOME carries this much of its shards at most
INLINE_READ_BYTES = 64 << 10  # an open's reads this small are made on the loop, not a thread
PAGE_BYTES_MAX = 16 << 20  # a recovery page asked for is cut to this (a reply fits one frame)

DISK_ERRORS = (ValueError, OSError, _native.CorruptionError, IoError)  # a request's, answered


class ShardFiles:
    """One shard's files, held open for the server's life, and its checkpoints in flight."""

    def __init__(self, files: _native.Shard, checkpoint_bytes: int) -> None:
        self.files = files
        self.checkpoint_bytes = checkpoint_bytes  # the size of its newest checkpoint
        self.writing: set[asyncio.Future[Any]] = set()  # its checkpoints in flight


class Disk:
    def __init__(self, storage: LocalStorage, shards: list[ShardFiles], failed: Callable[[], None]) -> None:
        self.storage = storage
        self.log = storage.log
        self.shards = shards
        self.shard_count = len(shards)
        self.failed = failed  # the log stopped after a failed write: the server stops
        self.definitions = DefinitionsFile(storage.root)
        self.readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="fusee-read")
        # Per shard, what the server sees of it (`/metrics`, fusee_<counter>{shard="N"}):
        # the records its holders append, their flushes, its checkpoints.
        self.counts = [zeros() for _ in shards]

    @classmethod
    async def open(
        cls, root: str, shards: int | None, failed: Callable[[], None], backup: str | None = None
    ) -> Disk:
        """Open (or create) the directory and recover its log; every shard's files are
        checked and held open for the server's life. With `backup`, a continuous backup to
        that target (docs/backup.md)."""
        storage = await LocalStorage.open(root, shards, backup=backup)
        loop = asyncio.get_running_loop()
        opened = []
        try:
            for index in range(storage.shards):
                files = await loop.run_in_executor(storage.executor, _native.Shard, root, index, storage.log)
                checkpoint = files.recovered_checkpoint()
                storage.log.ensure_next(index, checkpoint[0] if checkpoint is not None else 0)
                storage.log.take_recovered(index, 0)  # the open's copy; leases read the disk
                opened.append(ShardFiles(files, len(checkpoint[1]) if checkpoint is not None else 0))
        except (_native.CorruptionError, OSError) as error:
            await storage.abandon()
            raise IoError(f"{root}: {error}") from None
        return cls(storage, opened, failed)

    @property
    def backup(self) -> Backup | None:
        return self.storage.backup

    def appended(self, index: int) -> int:
        return self.log.appended(index)

    def dues(self) -> list[int | None]:
        return [None] * self.shard_count  # a restarted server hears every shard once

    def set_due(self, index: int, due_ms: int) -> None:
        pass  # kept in the invoker's memory only: one server, and a restart hears them all

    def serving(self) -> str | None:
        return None  # the directory's lock is this server's while it runs

    # -- writes ---------------------------------------------------------------------------

    def append(self, conn: ServerConnection, lease: Lease, message: m.Append) -> None:
        expected = self.log.appended(lease.index) + 1
        if message.first != expected:
            conn.fail(f"shard {lease.index}: records from {message.first}, but the log is at {expected}")
            return
        try:
            last = self.log.stage_many(lease.index, message.records)
        except ValueError as error:
            lease.refused = str(error)
            conn.fail(f"shard {lease.index}: {error}")
            return
        epoch = lease.epoch
        counts = self.counts[lease.index]
        counts["records"] += len(message.records)
        counts["bytes"] += sum(map(len, message.records))
        asked = perf_counter()
        # Never written here, however fast the disk was: a write on the loop holds every
        # connection, call and ping (and the liveness watch) for as long as its flush
        # takes, and one flush that stalls stalls them all. The writer thread writes, and
        # its eventfd brings the answer (tests/server_mode/test_disk_stall.py).
        try:
            self.storage.request(
                lease.index,
                last,
                lambda result: self._durable(conn, lease, epoch, result, (asked, len(message.records))),
            )
        except IoError as error:
            self._durable(conn, lease, epoch, error)

    def _durable(
        self,
        conn: ServerConnection,
        lease: Lease,
        epoch: int,
        result: int | BaseException,
        flush: tuple[float, int] | None = None,
    ) -> None:
        if isinstance(result, BaseException):
            logger.critical("the log stopped after a failed write: %s; stopping", result)
            self.failed()
            return
        if flush is not None:
            acknowledge(self.counts[lease.index], conn, lease, epoch, result, flush)
        elif lease.holder is conn and lease.epoch == epoch:
            conn.send(m.Durable([(lease.index, epoch, result)]))

    def after_durable(self, index: int, position: int, then: Callable[[str | None], None]) -> None:
        """`then(None)` once shard `index`'s log is durable up to `position` (at once if it
        is), or `then(why)` if its write failed (the server stops then: `_durable`)."""
        if self.log.durable(index) >= position:
            then(None)
            return

        def written(result: int | BaseException) -> None:
            then(str(result) if isinstance(result, BaseException) else None)

        try:
            self.storage.request(index, position, written)
        except IoError as error:  # the log stopped already
            then(str(error))

    def put_run(self, conn: ServerConnection, lease: Lease, message: m.PutRun) -> None:
        files = self.shards[lease.index].files
        try:
            offset = files.append_run(message.offset, message.frame)
        except (_native.CorruptionError, OSError) as error:
            lease.refused = f"the run store refused a write at {message.offset}: {error}"
            conn.send(m.RunPut(lease.index, lease.epoch, message.offset, lease.refused))
            return
        conn.send(m.RunPut(lease.index, lease.epoch, offset))

    # -- requests -------------------------------------------------------------------------

    async def reply(self, index: int, request: m.Request) -> m.Reply:
        """The answer to a holder's `request` on shard `index` (a failure in words)."""
        try:
            return await self._serve(index, request)
        except DISK_ERRORS as error:
            return m.Reply(request.rid, error=f"shard {index}: {error}")
        except Exception as error:  # a bug here must answer, not leave the worker waiting
            logger.exception("shard %d: %s request failed", index, request.op)
            return m.Reply(request.rid, error=f"shard {index}: internal error: {error!r}")

    async def _serve(self, index: int, request: m.Request) -> m.Reply:
        loop = asyncio.get_running_loop()
        shard = self.shards[index]
        op = request.op
        if op == "open":
            await self._settle(index)
            position = self.log.durable(index)
            checkpoint, page = await self._read_open(index, min(request.max_bytes, PAGE_BYTES_MAX))
            return m.Reply(
                request.rid,
                position=position,
                runs_len=shard.files.runs_len,
                checkpoint=checkpoint,
                items=page,
            )
        if op == "records":
            page_bytes = min(max(request.max_bytes, 1), PAGE_BYTES_MAX)
            page = await loop.run_in_executor(
                self.readers, self.log.read_records, index, request.after, page_bytes
            )
            return m.Reply(request.rid, items=page)
        if op == "runs":
            read = shard.files.read_run
            items = await loop.run_in_executor(self.readers, lambda: [read(o) for o in request.offsets])
            return m.Reply(request.rid, items=items)
        if op == "checkpoint":
            await self._checkpoint(index, request.after, request.data)
            self.counts[index]["checkpoints"] += 1
            return m.Reply(request.rid)
        raise ValueError(f"no request {op!r} (expected one of {', '.join(m.OPS)})")

    def preopen(self, granted: list[tuple[int, int]]) -> list[m.Opened]:
        """An invoked worker's open of each granted shard, answered before it asks (one
        round trip less in every cold start), for the shards that need no waiting: the
        previous holder's writes all settled, a small checkpoint, and a first page of
        records within what is left of PREOPEN_BYTES. The others it opens as any worker."""
        opened: list[m.Opened] = []
        room = PREOPEN_BYTES
        for index, epoch in granted:
            shard = self.shards[index]
            position = self.log.durable(index)
            if shard.writing or position < self.log.appended(index):
                continue  # not settled: its REQUEST open waits for it
            page_bytes = min(INLINE_READ_BYTES, room - shard.checkpoint_bytes)
            if shard.checkpoint_bytes > INLINE_READ_BYTES or page_bytes <= 0:
                continue
            try:
                checkpoint, page = self._read_now(index, page_bytes)
            except (ValueError, OSError, _native.CorruptionError) as error:
                logger.info("shard %d: not opened ahead (its REQUEST open will say why): %s", index, error)
                continue
            size = len(checkpoint[1]) if checkpoint else 0
            room -= size + sum(map(len, page))
            opened.append(m.Opened(index, epoch, position, shard.files.runs_len, checkpoint, page))
        return opened

    async def _read_open(self, index: int, page_bytes: int) -> tuple[tuple[int, bytes] | None, list[bytes]]:
        """The shard's newest checkpoint (read from its file: a checkpoint holds a shard's
        whole index, too much to keep in memory) and, for a `page_bytes`, the first page
        of the records after it: a recovery's first round trip does both."""
        if self.shards[index].checkpoint_bytes <= INLINE_READ_BYTES:
            # A small shard is read here, on the loop: a thread hop costs more (~0.3 ms)
            # than a small checkpoint and a short first page (the worker asks for the
            # rest, if any, as for any page).
            return self._read_now(index, min(page_bytes, INLINE_READ_BYTES))
        return await asyncio.get_running_loop().run_in_executor(
            self.readers, self._read_now, index, page_bytes
        )

    def _read_now(self, index: int, page_bytes: int) -> tuple[tuple[int, bytes] | None, list[bytes]]:
        checkpoint = self.shards[index].files.latest_checkpoint()
        if page_bytes <= 0:
            return checkpoint, []
        return checkpoint, self.log.read_records(index, checkpoint[0] if checkpoint else 0, page_bytes)

    async def _settle(self, index: int) -> None:
        """Before a new holder recovers: the previous holder's checkpoints and log writes
        in flight finish, so nothing of its can land after what the new holder reads."""
        shard = self.shards[index]
        while shard.writing:
            await asyncio.wait(list(shard.writing))
        appended = self.log.appended(index)
        if self.log.durable(index) < appended:
            done: asyncio.Future[int | BaseException] = asyncio.get_running_loop().create_future()
            self.storage.request(index, appended, done.set_result)
            result = await done
            if isinstance(result, BaseException):
                raise IoError(str(result))

    async def _checkpoint(self, index: int, position: int, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        shard = self.shards[index]
        # While it is written, an open may read either one: count the larger.
        shard.checkpoint_bytes = max(shard.checkpoint_bytes, len(data))
        writing = loop.run_in_executor(self.storage.checkpoints, shard.files.checkpoint, position, data)
        shard.writing.add(writing)
        try:
            await writing
        finally:
            shard.writing.discard(writing)
        shard.checkpoint_bytes = len(data)
        covered = self.storage.held([s.files.covered() for s in self.shards])
        await loop.run_in_executor(self.storage.executor, self.log.retire, covered, False)

    async def close(self) -> None:
        """Checkpoints in flight finished, the log's last write made durable, the directory
        closed."""
        writing = [w for shard in self.shards for w in shard.writing]
        if writing:
            await asyncio.wait(writing)
        self.readers.shutdown(wait=True)
        await self.storage.close()
