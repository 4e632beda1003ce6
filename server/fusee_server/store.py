"""Local mode: the engine's storage backend over a data directory on this machine.

Every shard's records go to the directory's one shared log. A shard asking for a flush
joins the write in flight or starts the next one, which takes every shard's staged
records as one batch with one durable flush (group commit). Writes run on one dedicated
thread with the GIL released, so the event loop never waits on the disk.

The other disk work (recovery, shard opens, retirement, checkpoints) runs on the
storage's own small executors, never on the loop's default one: the application's threads
may fill that one, and a checkpoint queued behind them would never finish (nor would a
close waiting on it).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn

from fusee._errors import IoError, LeaseLostError, RejectedError
from fusee.journal import Ack, Msg
from fusee.storage import PAGE_BYTES, Durability, Receive, Report
from fusee.storage.relay import Relay
from fusee_server import _native
from fusee_server.backup.continuous import Backup
from fusee_server.backup.continuous import Options as BackupOptions
from fusee_server.backup.targets import target as backup_target

logger = logging.getLogger("fusee.local")

FRAME_HEADER = 8  # a run-store frame: length and checksum, then the bytes
CHECKPOINT_THREADS_MAX = 4  # checkpoints of different shards run side by side, up to this
RECORD_BYTES_MAX = _native.RECORD_BYTES_MAX


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
        self.executor = executor  # recovery, shard opens, retirement: one at a time
        # Checkpoints: bounded, and apart from the loop's default executor (see above).
        self.checkpoints = ThreadPoolExecutor(
            max_workers=min(CHECKPOINT_THREADS_MAX, self.shards), thread_name_prefix="fusee-checkpoint"
        )
        self.stores: dict[int, LocalShardStore] = {}
        self.epochs: dict[int, int] = {}  # one process holds the directory: epochs count its opens
        self.relayed = Relay()  # messages for shards this process has not opened wait here
        self.waiters: list[tuple[int, int, Report]] = []
        self.notify_fd = -1
        self.failed: BaseException | None = None
        self.released = False  # closed or abandoned: its native objects are let go
        self.backup: Backup | None = None  # continuous backup (docs/backup.md)

    @classmethod
    async def open(
        cls,
        root: str | Path,
        shards: int | None = None,
        *,
        direct_io: bool = True,
        segment_bytes_min: int = 1 << 20,
        segment_bytes_max: int = 64 << 20,
        backup: str | None = None,
        backup_options: BackupOptions | None = None,
    ) -> LocalStorage:
        """Lock the directory, check its meta and shard count (or create it: its log
        first, the meta last), and recover its log (on the log's thread: recovery reads
        every segment). Damage that loses acknowledged records refuses with IoError
        naming the file."""
        root = Path(root)
        # A target that cannot work refuses before the directory is touched.
        to = backup_target(backup) if backup is not None else None
        try:
            directory = _native.Directory(root, shards, segment_bytes_min)
        except _native.DirectoryError as error:
            raise RejectedError(f"{root}: {error}") from None
        except (_native.CorruptionError, OSError) as error:
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
        storage = cls(root, directory, log, executor)
        if to is not None:
            # Before anything can retire a segment: the backup holds what it lacks.
            try:
                storage.backup = Backup(root, log, directory.shards, to, backup_options or BackupOptions())
            except BaseException:
                await storage.abandon()
                raise
            storage.backup.start()
        storage.start_writer()
        return storage

    async def open_shard(self, index: int, report: Report, receive: Receive) -> LocalShardStore:
        loop = asyncio.get_running_loop()
        try:
            # Checks the shard's checkpoint against the log and every run-store frame it
            # references, before anything is changed.
            files = await loop.run_in_executor(self.executor, _native.Shard, str(self.root), index, self.log)
        except (_native.CorruptionError, OSError) as error:
            raise IoError(f"{self.root}: {error}") from None
        previous = self.stores.get(index)
        if previous is not None:
            previous.lose(LeaseLostError(f"shard {index} was opened again in this process"))
        self.epochs[index] = epoch = self.epochs.get(index, 0) + 1
        store = LocalShardStore(
            self, index, files, epoch, report, lambda: self.relayed.detach(index, receive)
        )
        self.stores[index] = store
        self.relayed.attach(index, receive)
        return store

    def relay(self, index: int, item: Msg | Ack) -> None:
        self.relayed.send(index, item)

    def start_writer(self) -> None:
        """The log's writer thread signals an eventfd after each write; the loop reads it
        and releases the flushes the write made durable."""
        self.notify_fd = self.log.start_writer()
        asyncio.get_running_loop().add_reader(self.notify_fd, self._written)

    def request(self, shard: int, target: int, callback: Callable[[int | BaseException], None]) -> None:
        """Call `callback` once `shard` is durable up to `target` (from the loop)."""
        self.check()
        durable = self.log.durable(shard)
        if durable >= target:
            asyncio.get_running_loop().call_soon(callback, durable)
            return
        self.waiters.append((shard, target, callback))
        self.log.request_write()

    def check(self) -> None:
        if self.failed is not None:
            raise IoError(
                f"{self.root}: the log stopped after a failed flush ({self.failed}); restart the process"
            )

    def _written(self) -> None:
        if self.notify_fd >= 0:
            try:
                os.read(self.notify_fd, 8)
            except BlockingIOError:
                pass
        failure = self.log.failure()
        if failure is not None and self.failed is None:
            # Never acknowledge after a failed flush (the kernel may have dropped the
            # pages): every waiting and later flush of every shard fails.
            self.failed = OSError(failure)
        waiting, self.waiters = self.waiters, []
        for shard, target, waiter in waiting:
            durable = self.log.durable(shard)
            if durable >= target:
                waiter(durable)
            elif self.failed is not None:
                waiter(IoError(f"{self.root}: log write failed: {self.failed}"))
            else:
                self.waiters.append((shard, target, waiter))

    def _stop_writer(self) -> None:
        if self.notify_fd >= 0:
            asyncio.get_running_loop().remove_reader(self.notify_fd)
            self.notify_fd = -1
        self.log.stop_writer()

    async def retire(self, fresh: bool = False) -> None:
        """Retire log segments that both retained checkpoints of every shard cover (at a
        clean close, `fresh`: move to an empty segment first when they cover it all)."""
        if len(self.stores) < self.shards:
            return  # a shard this process does not hold may still need any segment
        covered = self.held([self.stores[i].files.covered() for i in range(self.shards)])
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, self.log.retire, covered, fresh)

    def held(self, covered: list[int]) -> list[int]:
        """The positions retirement may pass: with a backup, none past what it holds."""
        return covered if self.backup is None else self.backup.hold(covered)

    async def abandon(self) -> None:
        """Stop as a crash would (the test kit's `crash()`): nothing more is written; a
        write under way finishes before the lock is released, so it cannot land after the
        next open began writing."""
        if self.released:
            return  # closed or abandoned already
        self.failed = RuntimeError("abandoned")
        if self.backup is not None:
            self.backup.abandon()  # as a crash: no last upload
        self._stop_writer()
        self._shutdown()
        self._release_files()
        self.directory.release()

    def _release_files(self) -> None:
        """Let go of the native objects that hold the directory's files, so they close now:
        the engine's objects refer to each other in cycles, and an engine dropped after its
        close would otherwise keep its segment and run-store files open until the cyclic
        collector ran (a process that opens many engines runs out of descriptors). A late
        call on a closed storage gets IoError."""
        self.released = True
        for store in self.stores.values():
            store.files = _CLOSED  # type: ignore[assignment]
            store.log = _CLOSED  # type: ignore[assignment]
        self.log = _CLOSED  # type: ignore[assignment]

    def _shutdown(self) -> None:
        # A checkpoint under way finishes before the lock is released, so it cannot land
        # after the next open began reading the shard's files.
        self.checkpoints.shutdown(wait=True)
        self.executor.shutdown(wait=True)

    async def close(self) -> None:
        if self.released:
            return  # closed or abandoned already
        self._stop_writer()  # lets a write under way finish
        self._written()
        if self.backup is not None:
            # The last upload of everything, so the segments can go at the retirement below.
            await asyncio.get_running_loop().run_in_executor(None, self.backup.stop)
        if self.failed is None and len(self.stores) == self.shards:
            await self.retire(fresh=True)
        self._shutdown()
        self._release_files()
        self.directory.release()


class _Closed:
    """Stands where the native objects were once the storage is closed."""

    def __getattr__(self, name: str) -> NoReturn:
        raise IoError("the data directory was closed; open it again")


_CLOSED = _Closed()


class LocalShardStore:
    """One shard of a data directory: its records in the shared log, its run store and
    its checkpoints."""

    def __init__(
        self,
        storage: LocalStorage,
        index: int,
        files: _native.Shard,
        epoch: int,
        report: Report,
        release: Callable[[], None],
    ) -> None:
        self.storage = storage
        self.index = index
        self.files = files
        self.log = storage.log
        self.epoch = epoch
        self._report = report
        self.release = release  # stops the relay delivering to this holder
        self.runs_len = files.runs_len
        self.last_checkpoint: tuple[int, bytes] | None = None
        self.writing: asyncio.Future[None] | None = None  # the checkpoint being written
        self.pending: list[bytes] = []
        self.stopped: IoError | LeaseLostError | None = None
        self.dropped = False  # closed or abandoned: nothing more is reported
        # What recovery reads: the checkpoint and the log after it, as the directory's
        # open found them (the log is read once per open; later records are the engine's).
        checkpoint = files.recovered_checkpoint()
        self.found_checkpoint: tuple[int, bytes] | None = checkpoint
        self.recovered_from = checkpoint[0] if checkpoint is not None else 0
        self.log.ensure_next(index, self.recovered_from)
        self.next_position = self.log.appended(index)
        self.recovered: list[bytes] = self.log.take_recovered(index, self.recovered_from)

    def report(self, result: int | BaseException) -> None:
        if not self.dropped:
            self._report(result)

    def lose(self, error: IoError | LeaseLostError, *, now: bool = False) -> None:
        """Stop: nothing staged from now on is written, and the shard hears of it once
        (`now`: from inside this call, else on a later turn)."""
        if self.stopped is None:
            self.stopped = error
            self.pending.clear()
            if now:
                self.report(error)
            else:
                asyncio.get_running_loop().call_soon(self.report, error)
            self.dropped = True
            self.release()

    def append(self, entry: bytes) -> int:
        # Kept here until the shard flushes: the engine flushes between turns of the
        # loop, so the records of one turn (an effect and its dedupe record, a run's end
        # and the next run's start) reach the log together and share a batch. Handing
        # them over one by one would let the writer thread cut a batch between them.
        if self.stopped is None:
            self.pending.append(entry)
        self.next_position += 1
        return self.next_position

    def _hand_over(self) -> None:
        if self.stopped is not None:
            raise self.stopped
        if self.pending:
            pending, self.pending = self.pending, []
            try:
                last = self.log.stage_many(self.index, pending)
            except ValueError as error:
                # A record longer than the log takes (recovery would refuse its batch):
                # it was never staged, so its position and every later one are holes.
                # The shard stops as after a failed flush; nothing is acknowledged.
                self.stopped = IoError(f"{self.storage.root}: shard {self.index}: {error}")
                raise self.stopped from None
            if last != self.next_position:
                self.stopped = IoError(
                    f"shard {self.index}: log position {last}, expected {self.next_position}"
                )
                raise self.stopped

    def flush(self) -> None:
        """Hand the staged records to the log; the durable position is reported once a
        write covers them (or the error of a failed flush)."""
        if self.dropped:
            return
        try:
            self._hand_over()
            # The shard's own report: a late one after an abandon finds the shard closed.
            self.storage.request(self.index, self.next_position, self._report)
        except (IoError, LeaseLostError) as error:
            self.dropped = True
            self.release()
            asyncio.get_running_loop().call_soon(self._report, error)

    def put_run(self, frame: bytes) -> int:
        # The writer states the offset; the store refuses one that is not its length.
        offset = self.runs_len
        if self.stopped is not None:
            return offset
        try:
            self.files.append_run(offset, frame)
        except (_native.CorruptionError, OSError) as error:
            # Reported at once: the shard must not go on to reference the offset.
            why = f"{self.storage.root}: shard {self.index}: the run store refused a write: {error}"
            self.lose(IoError(why), now=True)
            return offset
        self.runs_len = offset + FRAME_HEADER + len(frame)
        return offset

    async def get_runs(self, offsets: Sequence[int]) -> list[bytes]:
        try:
            read = self.files.read_run
            return [read(offset) for offset in offsets]
        except (_native.CorruptionError, OSError) as error:
            raise IoError(f"{self.storage.root}: {error}") from None

    async def latest_checkpoint(self) -> tuple[int, bytes] | None:
        return self.found_checkpoint

    async def records(self, after: int, max_bytes: int = PAGE_BYTES) -> list[bytes]:
        """Pages of what the open recovered after the checkpoint. Records appended since
        the open are the engine's own: this process never reads them back."""
        if after < self.recovered_from:
            raise IoError(
                f"shard {self.index}: records after {after} were asked for, but the log "
                f"here begins after the checkpoint at {self.recovered_from}"
            )
        page: list[bytes] = []
        size = 0
        for entry in self.recovered[after - self.recovered_from :]:
            if page and size + len(entry) > max_bytes:
                break
            page.append(entry)
            size += len(entry)
        return page

    def abandon(self) -> None:
        """Drop the shard as a crash would: nothing staged is written, nothing reported."""
        self.dropped = True
        if self.stopped is None:
            self.stopped = IoError(f"shard {self.index} was let go of")
        self.pending.clear()
        self.release()

    def fenced(self) -> bool:
        return False  # the data directory's lock is this process's for its life

    async def checkpoint(self, position: int, data: bytes) -> None:
        await self._write_checkpoint(position, data)
        await self.storage.retire()

    async def _write_checkpoint(self, position: int, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        # On the storage's checkpoint executor: not the log's (a checkpoint's flushes
        # must not delay retirement), not the loop's default (threads of the application
        # may fill it).
        writing = loop.run_in_executor(self.storage.checkpoints, self.files.checkpoint, position, data)

        def written(done: asyncio.Future[None]) -> None:
            # Recorded as the write completes, before anyone awaiting it resumes: a close
            # waiting on it sees this checkpoint.
            if not done.cancelled() and done.exception() is None:
                self.last_checkpoint = (position, data)
            if self.writing is done:
                self.writing = None

        writing.add_done_callback(written)
        self.writing = writing
        await writing

    async def close(self) -> None:
        """After the engine's closing checkpoint, a second copy of it: with every record
        covered by two checkpoints, the next open replays nothing and the log under them
        can be retired. A checkpoint still being written finishes first (the engine may
        have started one that its close did not wait for); the copy is made only of a
        checkpoint that covers every record, and only once."""
        self.release()
        writing = self.writing
        if writing is not None:
            await asyncio.wait([writing])
        self.dropped = True
        last = self.last_checkpoint
        if last is None or self.storage.failed is not None or self.stopped is not None:
            return
        position, data = last
        if position != self.next_position or self.files.checkpoint_positions() == [position, position]:
            return
        try:
            await self._write_checkpoint(position, data)
        except OSError as error:
            # The first copy is durable: the next open uses it and replays nothing
            # lost; only the log under it stays until the next close.
            logger.warning(
                "shard %d: the second copy of its closing checkpoint failed: %s", self.index, error
            )
