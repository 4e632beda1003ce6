"""The PostgreSQL store of `fusee server --store postgresql://...` (docs/postgresql.md): the
same contract as the disk path (seam.py), over the tables of schema.py.

Group commit as on the disk: the holders' records, run-store frames and the invoker's due
times wait in one staged batch while the commit before them runs; each batch is one call
of `fusee_commit_v1` (one statement, one transaction, one round trip), fenced by the
epochs this server owns the shards under. Nothing is acknowledged before its commit
returned. A connection lost mid-commit leaves the outcome unknown: once the database
answers again, the shards' rows say whether the batch landed (their positions, run-store
lengths and due times are written in the same transaction), and it is sent again if not.

Reads see only committed rows, and a new holder's open first waits until everything the
previous holder sent is committed (`_settle`), as on the disk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeVar

from fusee._backoff import Backoff
from fusee._errors import IoError
from fusee.engine.shard_metrics import zeros
from fusee.protocol import messages as m
from fusee_server.postgres import database
from fusee_server.postgres.database import connection_errors, driver, fenced
from fusee_server.postgres.ownership import Ownership
from fusee_server.seam import acknowledge

if TYPE_CHECKING:
    from fusee_server.leases import Lease
    from fusee_server.listener import ServerConnection

logger = logging.getLogger("fusee.server")
T = TypeVar("T")

FRAME_HEADER = 8  # the run store's offsets count a frame's length and checksum, as on disk
RECORD_BYTES_MAX = 64 << 20
PAGE_BYTES_MAX = 16 << 20
PAGE_ROWS = 1024  # records fetched per query of a page
DUE_UNCHANGED = -2  # fusee_commit_v1: leave the shard's due time alone
DUE_DELAY_S = 0.1  # due times alone are committed this long after they change, at most
COMMIT = "SELECT fusee_commit_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"


class Deposed(Exception):
    """Another server owns the shards now (or this one could not renew in time)."""


class Batch:
    """What waits for the next group commit."""

    def __init__(self) -> None:
        self.records: dict[int, list[bytes]] = {}
        self.first: dict[int, int] = {}  # shard -> position of its first record here
        self.frames: list[tuple[int, int, bytes]] = []  # (shard, offset, frame)
        self.runs_len: dict[int, int] = {}  # shard -> its run store's length after the frames
        self.dues: dict[int, int] = {}
        self.checkpoints: list[tuple[int, int, int, bytes, asyncio.Future[None]]] = []

    def __bool__(self) -> bool:
        return bool(self.records or self.frames or self.dues or self.checkpoints)

    def shards(self) -> list[int]:
        return sorted({*self.records, *self.runs_len, *self.dues})

    def last(self, shard: int) -> int | None:
        records = self.records.get(shard)
        return self.first[shard] + len(records) - 1 if records else None


class PgDefinitions:
    """The limits' definitions, in `fusee_meta` under `limits`; a save is fenced by the
    epoch of shard 0, so a deposed server cannot change them either."""

    def __init__(self, store: PgStore) -> None:
        self.store = store
        self.saved: bytes | None = None

    def load(self) -> bytes | None:
        return self.saved

    def save(self, data: bytes) -> Awaitable[None]:
        return self._save(data)

    async def _save(self, data: bytes) -> None:
        store = self.store
        try:
            async with store.pool.acquire() as conn:
                done = await conn.fetchval(
                    "WITH owned AS (SELECT 1 FROM fusee_shards WHERE shard = 0 AND epoch = $2 FOR SHARE) "
                    "INSERT INTO fusee_meta (key, value) SELECT 'limits', $1 FROM owned "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value RETURNING 1",
                    data.decode(),
                    store.ownership.epochs.get(0, -1),
                )
        except connection_errors() as error:
            raise IoError(
                f"the limit's definition was not saved: the database is not answering: {error}"
            ) from None
        if done is None:
            store._stop(Deposed("another server owns the shards now"), deposed=True)
            raise IoError("the limit's definition was not saved: another server owns the shards now")
        self.saved = data


class PgStore:
    """Every shard's records, run stores and checkpoints in one PostgreSQL database."""

    backup = None  # the database's own backups cover it (docs/postgresql.md)
    definitions: PgDefinitions

    def __init__(self, pool: Any, url: str, shards: int, ownership: Ownership) -> None:
        self.pool = pool
        self.url = url
        self.shard_count = shards
        self.ownership = ownership
        self.failed: Callable[[], None] = lambda: None  # the store stopped: the server stops
        self.deposed = False
        self.stopped: BaseException | None = None
        self.counts = [zeros() for _ in range(shards)]
        self._appended = [0] * shards
        self._durable = [0] * shards
        self.runs_len = [0] * shards
        self.due_ms: list[int | None] = [None] * shards
        self.pending_frames: list[dict[int, bytes]] = [{} for _ in range(shards)]
        self.staged = Batch()
        # (shard, position, callback, frames too): what waits for a commit
        self.waiters: list[tuple[int, int, Callable[[int | BaseException], None], bool]] = []
        self.committer: asyncio.Task[None] | None = None
        # The committer's own connection, kept between commits: a pool's acquire and
        # release cost about 45 µs of every group commit here.
        self.commit_conn: Any = None
        self.writing: dict[int, asyncio.Lock] = {i: asyncio.Lock() for i in range(shards)}
        self.checkpointing: set[asyncio.Task[None]] = set()
        self.renewer: asyncio.Task[None] | None = None
        self.lazy: asyncio.TimerHandle | None = None  # a commit for due times alone
        self.definitions = PgDefinitions(self)

    async def take(self) -> None:
        """The shards were claimed: read where each stands, and keep the claim renewed."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT shard, position, runs_len, due_ms FROM fusee_shards ORDER BY shard"
            )
            limits = await conn.fetchval("SELECT value FROM fusee_meta WHERE key = 'limits'")
        self.definitions.saved = limits.encode() if limits is not None else None
        for row in rows:
            i = row["shard"]
            self._appended[i] = self._durable[i] = row["position"]
            self.runs_len[i] = row["runs_len"]
            self.due_ms[i] = row["due_ms"]
        self.renewer = asyncio.get_running_loop().create_task(self._renew())

    # -- the seam (seam.py) -----------------------------------------------------------------

    def appended(self, index: int) -> int:
        return self._appended[index]

    def serving(self) -> str | None:
        # Resumed after a freeze (SIGSTOP, a paused VM) past its own deadline, this server
        # hears its listener before its renewal: a worker it took would be granted shards
        # a standby owns now (each write is fenced, but the worker would wait on it).
        if self.stopped is None and self.ownership.owned():
            return None
        return "this server no longer owns the shards (a standby took them over): try the next server"

    def dues(self) -> list[int | None]:
        return list(self.due_ms)

    def set_due(self, index: int, due_ms: int) -> None:
        """Staged for the next commit, which is not hurried for it: a due time lost in a
        crash costs one invocation more, never one less. A shard's "held" (0) goes with
        the next records, so the records of a holder are never committed without it."""
        if self.stopped is None and self.due_ms[index] != due_ms:
            self.due_ms[index] = due_ms
            self.staged.dues[index] = due_ms
            if self.lazy is None:
                self.lazy = asyncio.get_running_loop().call_later(DUE_DELAY_S, self._lazy_kick)

    def _lazy_kick(self) -> None:
        self.lazy = None
        self._kick()

    def append(self, conn: ServerConnection, lease: Lease, message: m.Append) -> None:
        index = lease.index
        expected = self._appended[index] + 1
        if message.first != expected:
            conn.fail(f"shard {index}: records from {message.first}, but the log is at {expected}")
            return
        if not message.records:
            return
        for record in message.records:
            if len(record) > RECORD_BYTES_MAX:
                lease.refused = f"a record of {len(record)} bytes is over the limit of {RECORD_BYTES_MAX}"
                conn.fail(f"shard {index}: {lease.refused}")
                return
        staged = self.staged.records.setdefault(index, [])
        if not staged:
            self.staged.first[index] = expected
        staged.extend(message.records)
        last = expected + len(message.records) - 1
        self._appended[index] = last
        counts = self.counts[index]
        counts["records"] += len(message.records)
        counts["bytes"] += sum(map(len, message.records))
        epoch, asked = lease.epoch, perf_counter()
        self._request(
            index,
            last,
            lambda result: self._durable_to(conn, lease, epoch, result, (asked, len(message.records))),
        )

    def _durable_to(
        self,
        conn: ServerConnection,
        lease: Lease,
        epoch: int,
        result: int | BaseException,
        flush: tuple[float, int],
    ) -> None:
        if isinstance(result, BaseException):
            return  # the store stopped (and the server with it): nothing is acknowledged
        acknowledge(self.counts[lease.index], conn, lease, epoch, result, flush)

    def after_durable(self, index: int, position: int, then: Callable[[str | None], None]) -> None:
        def written(result: int | BaseException) -> None:
            then(str(result) if isinstance(result, BaseException) else None)

        self._request(index, position, written)

    def put_run(self, conn: ServerConnection, lease: Lease, message: m.PutRun) -> None:
        index = lease.index
        if message.offset != self.runs_len[index] or self.stopped is not None:
            lease.refused = (
                f"the run store refused a write at {message.offset}: shard {index}'s store is "
                f"{self.runs_len[index]} bytes long"
            )
            conn.send(m.RunPut(index, lease.epoch, message.offset, lease.refused))
            return
        self.pending_frames[index][message.offset] = message.frame
        self.runs_len[index] += FRAME_HEADER + len(message.frame)
        self.staged.frames.append((index, message.offset, message.frame))
        self.staged.runs_len[index] = self.runs_len[index]
        self._kick()
        conn.send(m.RunPut(index, lease.epoch, message.offset))

    def preopen(self, granted: list[tuple[int, int]]) -> list[m.Opened]:
        return []  # an invoked worker opens its shards with a REQUEST, as a long-lived one

    async def reply(self, index: int, request: m.Request) -> m.Reply:
        try:
            return await self._while_owned(lambda: self._serve(index, request))
        except (ValueError, IoError) as error:
            return m.Reply(request.rid, error=f"shard {index}: {error}")
        except connection_errors() as error:
            return m.Reply(request.rid, error=f"shard {index}: the database is not answering: {error}")
        except Exception as error:  # a bug here must answer, not leave the worker waiting
            logger.exception("shard %d: %s request failed", index, request.op)
            return m.Reply(request.rid, error=f"shard {index}: internal error: {error!r}")

    async def _while_owned(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, asked again (with backoff) while the database is away and this server
        still owns the shards: a lease at most, since past it, it steps down. A read or a
        checkpoint that failed instead would stop its holder's shard, lease held. The
        loss is raised once the store stopped or the shards are no longer owned."""
        backoff = Backoff(0.05, 1.0)
        while True:
            try:
                return await call()
            except connection_errors():
                if self.stopped is not None or not self.ownership.owned():
                    raise
            await asyncio.sleep(backoff.step())

    async def close(self) -> None:
        """The staged writes committed (unless the store stopped), checkpoints finished,
        the leases ended (the pool is its opener's to close)."""
        if self.renewer is not None:
            self.renewer.cancel()
        if self.stopped is None:
            while self.committer is not None or self.staged:
                if self.committer is None:
                    self._kick()
                if self.committer is not None:
                    await asyncio.wait([self.committer])
                if self.stopped is not None:
                    break
        if self.checkpointing:
            await asyncio.wait(list(self.checkpointing))
        if self.lazy is not None:
            self.lazy.cancel()
        if self.commit_conn is not None:
            await self.commit_conn.close()
            self.commit_conn = None
        if self.stopped is None:
            await self.ownership.release()

    # -- reads ----------------------------------------------------------------------------

    async def _serve(self, index: int, request: m.Request) -> m.Reply:
        op = request.op
        if op == "open":
            await self._settle(index)
            async with self.pool.acquire() as conn:
                row = await conn.fetchrow(
                    "SELECT position, data FROM fusee_checkpoints WHERE shard = $1 ORDER BY seq DESC LIMIT 1",
                    index,
                )
                checkpoint = (row["position"], bytes(row["data"])) if row is not None else None
                after = checkpoint[0] if checkpoint is not None else 0
                page = await self._records(conn, index, after, min(request.max_bytes, PAGE_BYTES_MAX))
            return m.Reply(
                request.rid,
                position=self._durable[index],
                runs_len=self.runs_len[index],
                checkpoint=checkpoint,
                items=page,
            )
        if op == "records":
            async with self.pool.acquire() as conn:
                page_bytes = min(max(request.max_bytes, 1), PAGE_BYTES_MAX)
                return m.Reply(request.rid, items=await self._records(conn, index, request.after, page_bytes))
        if op == "runs":
            return m.Reply(request.rid, items=await self._frames(index, request.offsets))
        if op == "checkpoint":
            await self._checkpoint(index, request.after, request.data)
            self.counts[index]["checkpoints"] += 1
            return m.Reply(request.rid)
        raise ValueError(f"no request {op!r} (expected one of {', '.join(m.OPS)})")

    async def _records(self, conn: Any, index: int, after: int, page_bytes: int) -> list[bytes]:
        """From `after + 1` on, about `page_bytes` (one record at least when there is one),
        never past the durable position; ValueError if checkpoints retired `after + 1`."""
        durable = self._durable[index]
        page: list[bytes] = []
        size = 0
        position = after
        while position < durable and (size < page_bytes or not page):
            rows = await conn.fetch(
                "SELECT position, record FROM fusee_records WHERE shard = $1 AND position > $2 "
                "AND position <= $3 ORDER BY position LIMIT $4",
                index,
                position,
                durable,
                PAGE_ROWS,
            )
            if not rows or rows[0]["position"] != position + 1:
                raise ValueError(
                    f"the records after position {position} are gone (checkpoints covered them and "
                    "they were deleted)"
                )
            for row in rows:
                page.append(bytes(row["record"]))
                size += len(page[-1])
                position = row["position"]
                if size >= page_bytes:
                    break
        return page

    async def _frames(self, index: int, offsets: list[int]) -> list[bytes]:
        pending = self.pending_frames[index]
        found = {o: pending[o] for o in offsets if o in pending}
        wanted = [o for o in offsets if o not in found]
        if wanted:
            async with self.pool.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT run_offset, frame FROM fusee_runs WHERE shard = $1 AND run_offset = ANY($2::bigint[])",
                    index,
                    wanted,
                )
            found.update((row["run_offset"], bytes(row["frame"])) for row in rows)
        missing = [o for o in offsets if o not in found]
        if missing:
            raise ValueError(f"no run-store frame at offset {missing[0]}")
        return [found[o] for o in offsets]

    async def _settle(self, index: int) -> None:
        """Before a new holder recovers: everything the previous holder sent is committed,
        its checkpoints too, so nothing of its lands after what the new holder reads."""
        if self._durable[index] < self._appended[index] or index in self.staged.runs_len:
            done: asyncio.Future[int | BaseException] = asyncio.get_running_loop().create_future()
            self._request(index, self._appended[index], done.set_result, force=True)
            result = await done
            if isinstance(result, BaseException):
                raise IoError(str(result))
        async with self.writing[index]:
            pass

    # -- writes: the committer --------------------------------------------------------------

    def _request(
        self, index: int, target: int, callback: Callable[[int | BaseException], None], force: bool = False
    ) -> None:
        """`callback(position)` once shard `index` is committed up to `target` (and, with
        `force`, its staged frames too), or `callback(error)` if the store stopped."""
        if self.stopped is not None:
            asyncio.get_running_loop().call_soon(callback, IoError(f"the store stopped: {self.stopped}"))
            return
        if self._durable[index] >= target and not (force and index in self.staged.runs_len):
            asyncio.get_running_loop().call_soon(callback, self._durable[index])
            return
        self.waiters.append((index, target, callback, force))
        self._kick()

    def _kick(self) -> None:
        if self.committer is None and self.stopped is None:
            self.committer = asyncio.get_running_loop().create_task(self._commit_loop())

    async def _commit_loop(self) -> None:
        try:
            while self.staged and self.stopped is None:
                batch, self.staged = self.staged, Batch()
                if batch.shards():
                    await self._commit(batch)
                self._committed(batch)
        except Deposed as error:
            self._stop(error, deposed=True)
        except Exception as error:  # noqa: BLE001  (a refused write, a bug: nothing more is acknowledged)
            logger.critical("the PostgreSQL store failed a write: %s; stopping", error)
            self._stop(error)
        finally:
            self.committer = None

    def _arguments(self, batch: Batch) -> list[Any]:
        shards = batch.shards()
        epochs = self.ownership.epochs
        positions = [batch.last(i) or self._durable[i] for i in shards]
        r_shards: list[int] = []
        r_positions: list[int] = []
        r_records: list[bytes] = []
        for i, records in batch.records.items():
            first = batch.first[i]
            r_shards.extend([i] * len(records))
            r_positions.extend(range(first, first + len(records)))
            r_records.extend(records)
        return [
            shards,
            [epochs[i] for i in shards],
            positions,
            [batch.runs_len.get(i, 0) for i in shards],
            [batch.dues.get(i, DUE_UNCHANGED) for i in shards],
            r_shards,
            r_positions,
            r_records,
            [f[0] for f in batch.frames],
            [f[1] for f in batch.frames],
            [f[2] for f in batch.frames],
        ]

    async def _commit(self, batch: Batch) -> None:
        arguments = self._arguments(batch)
        backoff = Backoff(0.05, 2.0)
        said = False
        while True:
            try:
                if self.commit_conn is None:
                    self.commit_conn = await database.connection(self.url)
                await self.commit_conn.execute(COMMIT, *arguments)
                if said:
                    logger.warning("the database answers again; the writes go on")
                return
            except driver().PostgresError as error:
                if fenced(error):
                    raise Deposed(
                        "another server owns the shards now: its epoch refused this write"
                    ) from None
                if not isinstance(error, connection_errors()):
                    raise
                failure: BaseException = error
            except connection_errors() as error:
                failure = error
            self._drop_commit_conn()
            if not said:
                said = True
                logger.warning("the database is not answering (%s); the writes wait for it", failure)
            while True:
                if self.stopped is not None:  # (stopped meanwhile: it says why itself)
                    raise Deposed(f"the store stopped: {self.stopped}")
                if not self.ownership.owned():
                    raise Deposed("the database was away for longer than the lease")
                await asyncio.sleep(backoff.step())
                try:
                    if await self._landed(batch, arguments):
                        return
                    break
                except connection_errors():
                    continue

    def _drop_commit_conn(self) -> None:
        conn, self.commit_conn = self.commit_conn, None
        if conn is not None:
            conn.terminate()  # (lost, or its statement's outcome unknown: not reused)

    async def _landed(self, batch: Batch, arguments: list[Any]) -> bool:
        """Whether a batch whose commit's outcome is unknown is in the database."""
        shards, epochs, positions, runs_lens, dues = arguments[:5]
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT shard, epoch, position, runs_len, due_ms FROM fusee_shards WHERE shard = ANY($1::integer[])",
                shards,
            )
        found = {row["shard"]: row for row in rows}
        for i, epoch, position, runs_len, due in zip(shards, epochs, positions, runs_lens, dues, strict=True):
            row = found[i]
            if row["epoch"] != epoch:
                raise Deposed(f"shard {i} is owned under another epoch now")
            if row["position"] < position or row["runs_len"] < runs_len:
                return False
            if due != DUE_UNCHANGED and row["due_ms"] != due:
                return False
        return True

    def _committed(self, batch: Batch) -> None:
        for i in batch.records:
            self._durable[i] = max(self._durable[i], batch.last(i) or 0)
        for i, offset, _ in batch.frames:
            self.pending_frames[i].pop(offset, None)
        waiting, self.waiters = self.waiters, []
        for waiter in waiting:
            index, target, callback, force = waiter
            if self._durable[index] >= target and not (force and index in self.staged.runs_len):
                callback(self._durable[index])
            else:
                self.waiters.append(waiter)
        loop = asyncio.get_running_loop()
        for checkpoint in batch.checkpoints:
            task = loop.create_task(self._write_checkpoint(*checkpoint))
            self.checkpointing.add(task)
            task.add_done_callback(self.checkpointing.discard)

    def _stop(self, error: BaseException, deposed: bool = False) -> None:
        if self.stopped is not None:
            return
        self.stopped = error
        self.deposed = deposed
        if deposed:
            logger.error("stepping down: %s", error)
        self._drop_commit_conn()
        waiting, self.waiters = self.waiters, []
        for _, _, callback, _ in waiting:
            callback(IoError(f"the store stopped: {error}"))
        for *_, future in self.staged.checkpoints:
            if not future.done():
                future.set_exception(IoError(f"the store stopped: {error}"))
        self.failed()

    # -- checkpoints ------------------------------------------------------------------------

    async def _checkpoint(self, index: int, position: int, data: bytes) -> None:
        """Written once every frame staged before it is committed (it references them)."""
        if self.stopped is not None:
            raise IoError(f"the store stopped: {self.stopped}")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.staged.checkpoints.append((index, position, self.runs_len[index], data, future))
        self._kick()
        await future

    async def _write_checkpoint(
        self, index: int, position: int, runs_len: int, data: bytes, future: asyncio.Future[None]
    ) -> None:
        async def write() -> None:
            async with self.pool.acquire() as conn:
                await conn.fetchval(
                    "SELECT fusee_checkpoint_v1($1, $2, $3, $4, $5)",
                    index,
                    self.ownership.epochs[index],
                    position,
                    runs_len,
                    data,
                )

        # One at a time per shard: the newest checkpoint is the one written last. Written
        # again after a lost connection (twice keeps the same two newest).
        async with self.writing[index]:
            try:
                await self._while_owned(write)
            except connection_errors() as error:
                if not future.done():
                    future.set_exception(IoError(f"checkpoint: the database is not answering: {error}"))
                return
            except driver().PostgresError as error:
                if fenced(error):
                    self._stop(Deposed("another server owns the shards now"), deposed=True)
                if not future.done():
                    future.set_exception(IoError(f"checkpoint: {error}"))
                return
        if not future.done():
            future.set_result(None)

    # -- the claim --------------------------------------------------------------------------

    async def _renew(self) -> None:
        ownership = self.ownership
        lost: tuple[type[BaseException], ...] = (TimeoutError, *connection_errors())
        while self.stopped is None:
            await asyncio.sleep(ownership.renew_s)
            left = ownership.deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(left, 0.01)):
                    if not await ownership.renew():
                        self._stop(Deposed("another server claimed the shards"), deposed=True)
                        return
            except lost as error:
                if not ownership.owned():
                    self._stop(Deposed(f"the leases could not be renewed in time ({error!r})"), deposed=True)
                    return
