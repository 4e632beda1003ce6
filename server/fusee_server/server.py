"""`fusee server`: one log for every shard on this machine's disk, shards leased to
workers over the wire, calls and messages relayed between them.

Everything here runs on one event loop, so a lease check and the write it guards happen
in one step: no other frame can move the lease between them. The disk work that may
wait (recovery reads, run-store reads, checkpoints, log retirement) runs on executors,
and the log's writes and flushes on the log's own thread (group commit, as in local
mode): the loop never waits on the disk.

Leases. Each shard has its own epoch, drawn from a counter that starts at the server's
start time in microseconds, so epochs only grow, across restarts too. A worker gets every
free shard up to its `max-shards` when it connects and waits as a standby for the
others; a shard let go of (its holder released it, closed, or went silent) goes to the
first standby with room. Every write names its shard's epoch and is refused unless the
connection holds that lease; a refused write closes the connection (a worker that
writes under a lease it lost is out of step, and all its leases go with it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from fusee._errors import IoError
from fusee.journal import Ack
from fusee.protocol import messages as m
from fusee.protocol.frames import PAYLOAD_BYTES_MAX, FrameError
from fusee_server import _native
from fusee_server.invoker import Invoker, Reason
from fusee_server.listener import ServerConnection
from fusee_server.local import LocalStorage

logger = logging.getLogger("fusee.server")

PING_S = 1.0
SILENCE_S = 5.0  # a holder silent this long (or not reading our writes) loses its leases
RELAY_FRAMES_MAX = 1024  # messages kept per shard while it has no holder...
RELAY_BYTES_MAX = 8 << 20  # ...and their bytes; the oldest are dropped first
READ_THREADS = 4
CALL_WAIT_S = 60.0  # a call waits this long at the server for its shard's holder
PREOPEN_BYTES = 1 << 20  # an invoked worker's WELCOME carries this much of its shards at most
INLINE_READ_BYTES = 64 << 10  # an open's reads this small are made on the loop, not a thread
PAGE_BYTES_MAX = 16 << 20  # a recovery page asked for is cut to this (a reply fits one frame)

_ack = msgspec.msgpack.Decoder(Ack)


class Slot:
    """One shard: its files, who holds it, and what waits for a holder."""

    def __init__(self, index: int, files: _native.Shard, checkpoint_bytes: int) -> None:
        self.index = index
        self.files = files
        self.checkpoint_bytes = checkpoint_bytes  # the size of its newest checkpoint
        self.holder: ServerConnection | None = None
        self.epoch = 0
        self.refused: str | None = None  # a refused run-store write: no more writes this lease
        self.waiting: deque[m.Relay] = deque()  # messages for it while no one holds it
        self.waiting_bytes = 0
        self.writing: set[asyncio.Future[Any]] = set()  # its checkpoints in flight
        # Calls waiting for a holder (invoked workers): the client, the call, until when.
        self.calls_waiting: deque[tuple[ServerConnection, m.Call, float]] = deque()


class Listing:
    """A listing sent to every holder; answered once each has, merged in shard order."""

    def __init__(self, client: ServerConnection, rid: int, parts: int) -> None:
        self.client = client
        self.rid = rid
        self.parts = parts
        self.rows: list[Any] = []
        self.error: m.Answer | None = None


class Server:
    frame_limit = PAYLOAD_BYTES_MAX

    def __init__(self, storage: LocalStorage, slots: list[Slot]) -> None:
        self.storage = storage
        self.log = storage.log
        self.slots = slots
        self.shards = len(slots)
        self.workers: list[ServerConnection] = []  # in the order they connected: standbys in line
        self.connections: set[ServerConnection] = set()
        self.sessions: dict[bytes, ServerConnection] = {}  # workers by session: their pingers find them
        self.epochs = itertools.count(time.time_ns() // 1000)
        self.rids = itertools.count(1)
        # Calls relayed to a worker, by the server's number: who asked (and its number for
        # it), the worker, the call.
        self.calls: dict[int, tuple[ServerConnection | Listing, int, ServerConnection, m.Call]] = {}
        self.readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="fusee-read")
        self.silence_s = SILENCE_S
        self.ping_s = PING_S
        self.listeners: list[asyncio.Server] = []
        self.watch: asyncio.Task[None] | None = None
        self.stopped = asyncio.Event()
        self.invoker: Invoker | None = None
        self.listings_waiting: list[tuple[ServerConnection, m.Call, float]] = []

    @classmethod
    async def open(cls, root: str, shards: int | None) -> Server:
        """Open (or create) the directory and recover its log; every shard's files are
        checked and held open for the server's life."""
        storage = await LocalStorage.open(root, shards)
        loop = asyncio.get_running_loop()
        slots = []
        try:
            for index in range(storage.shards):
                files = await loop.run_in_executor(storage.executor, _native.Shard, root, index, storage.log)
                checkpoint = files.recovered_checkpoint()
                storage.log.ensure_next(index, checkpoint[0] if checkpoint is not None else 0)
                storage.log.take_recovered(index, 0)  # the open's copy; leases read the disk
                slots.append(Slot(index, files, len(checkpoint[1]) if checkpoint is not None else 0))
        except (_native.CorruptionError, OSError) as error:
            await storage.abandon()
            raise IoError(f"{root}: {error}") from None
        return cls(storage, slots)

    def start(self) -> None:
        self.watch = asyncio.get_running_loop().create_task(self._watch())

    # -- connections ----------------------------------------------------------------------

    def opened(self, conn: ServerConnection) -> str | None:
        """A connection finished its setup: a worker takes the free shards it has room for."""
        if conn.role == m.ROLE_PINGER:
            worker = self.sessions.get(conn.session)
            if worker is None:
                return "no worker connection has that session (it closed)"
            worker.pinger = conn
            self.connections.add(conn)
            conn.send(m.Welcome(self.shards, [], int(self.ping_s * 1000), int(self.silence_s * 1000)))
            return None
        self.connections.add(conn)
        granted: list[tuple[int, int]] = []
        if conn.invocation is not None:
            return self._opened_invoked(conn)
        if conn.role == m.ROLE_WORKER:
            conn.session = os.urandom(16)
            self.sessions[conn.session] = conn
            self.workers.append(conn)
            for slot in self.slots:
                if slot.holder is None and self._has_room(conn):
                    granted.append((slot.index, self._grant(slot, conn)))
        timeout_ms = int(self.silence_s * 1000) if conn.liveness else 0
        conn.send(m.Welcome(self.shards, granted, int(self.ping_s * 1000), timeout_ms, conn.session))
        for index, _ in granted:
            self._granted(self.slots[index])
        return None

    def _opened_invoked(self, conn: ServerConnection) -> str | None:
        """An invoked worker: it gets exactly its invocation's shards that no one holds by
        now, and never waits as a standby."""
        assert conn.invocation is not None
        invocation = self.invoker.lookup(conn.invocation) if self.invoker is not None else None
        if invocation is None:
            self.connections.discard(conn)
            return f"invocation {conn.invocation} is unknown or finished"
        if invocation.conn is not None:
            self.connections.discard(conn)
            return f"invocation {conn.invocation} is connected already"
        invocation.conn = conn
        invocation.connected = asyncio.get_running_loop().time()
        conn.max_shards = 0
        conn.session = os.urandom(16)
        self.sessions[conn.session] = conn
        granted = [
            (i, self._grant(self.slots[i], conn)) for i in invocation.shards if self.slots[i].holder is None
        ]
        invocation.leased = bool(granted)
        now = asyncio.get_running_loop().time()
        conn.send(
            m.Welcome(
                self.shards,
                granted,
                int(self.ping_s * 1000),
                int(self.silence_s * 1000),
                conn.session,
                invocation.budget_left_ms(now),
                self._preopen(granted),
            )
        )
        for index, _ in granted:
            self._granted(self.slots[index])
        return None

    def _preopen(self, granted: list[tuple[int, int]]) -> list[m.Opened]:
        """An invoked worker's open of each granted shard, answered before it asks (one
        round trip less in every cold start), for the shards that need no waiting: the
        previous holder's writes all settled, a small checkpoint, and a first page of
        records within what is left of PREOPEN_BYTES. The others it opens as any worker."""
        opened: list[m.Opened] = []
        room = PREOPEN_BYTES
        for index, epoch in granted:
            slot = self.slots[index]
            position = self.log.durable(index)
            if slot.writing or position < self.log.appended(index):
                continue  # not settled: its REQUEST open waits for it
            page_bytes = min(INLINE_READ_BYTES, room - slot.checkpoint_bytes)
            if slot.checkpoint_bytes > INLINE_READ_BYTES or page_bytes <= 0:
                continue
            try:
                checkpoint, page = self._read_now(slot, page_bytes)
            except (ValueError, OSError, _native.CorruptionError) as error:
                logger.info("shard %d: not opened ahead (its REQUEST open will say why): %s", index, error)
                continue
            size = len(checkpoint[1]) if checkpoint else 0
            room -= size + sum(map(len, page))
            opened.append(m.Opened(index, epoch, position, slot.files.runs_len, checkpoint, page))
        return opened

    def _granted(self, slot: Slot) -> None:
        """After the grant went out: what waited for a holder goes to it."""
        if self.invoker is not None:
            self.invoker.held(slot.index)
        self._deliver_waiting(slot)
        holder = slot.holder
        while holder is not None and slot.calls_waiting:
            client, call, _ = slot.calls_waiting.popleft()
            if not client.closed:
                self._route(client, call, holder)
        if self.listings_waiting:
            waiting, self.listings_waiting = self.listings_waiting, []
            for client, call, _ in waiting:
                if not client.closed:
                    self._list(client, call)

    def calls_waiting(self) -> int:
        return sum(len(slot.calls_waiting) for slot in self.slots) + len(self.listings_waiting)

    def _has_room(self, conn: ServerConnection) -> bool:
        return not conn.closed and (conn.max_shards is None or len(conn.held) < conn.max_shards)

    def _grant(self, slot: Slot, conn: ServerConnection) -> int:
        slot.epoch = next(self.epochs)
        slot.holder = conn
        slot.refused = None
        conn.held.add(slot.index)
        logger.info("shard %d: leased to %s (epoch %d)", slot.index, conn, slot.epoch)
        return slot.epoch

    def _free(self, slot: Slot, why: str, skip: ServerConnection | None = None) -> None:
        """`slot`'s holder let go of it: hand it to the first standby with room."""
        holder = slot.holder
        if holder is not None:
            holder.held.discard(slot.index)
        slot.holder = None
        logger.info("shard %d: %s (epoch %d)", slot.index, why, slot.epoch)
        for conn in self.workers:
            if conn is not skip and self._has_room(conn):
                epoch = self._grant(slot, conn)
                conn.send(m.Lease(slot.index, epoch))
                self._granted(slot)
                return
        if self.invoker is not None and holder is not None:
            self.invoker.freed(slot.index, holder)

    def lost(self, conn: ServerConnection) -> None:
        self.connections.discard(conn)
        if conn.role == m.ROLE_PINGER:
            return
        if self.sessions.get(conn.session) is conn:
            del self.sessions[conn.session]
        if conn.pinger is not None:
            conn.pinger.close()
        if conn in self.workers:
            self.workers.remove(conn)
        if conn.invocation is not None and self.invoker is not None:
            invocation = self.invoker.lookup(conn.invocation)
            if invocation is not None and invocation.conn is conn:
                invocation.closed.set()
        held = set(conn.held)
        for index in sorted(held):
            self._free(self.slots[index], f"let go: {conn} closed its connection")
        for rid in conn.calls:
            entry = self.calls.pop(rid, None)
            if entry is None:
                continue
            origin, _, _, call = entry
            if not isinstance(origin, ServerConnection):
                self._answer(origin, entry[1], m.Answer(0, code="Connection", message=GONE))
            elif call.method == "result" and self.invoker is not None:
                # A wait for a result (a run asleep) outlives its worker: it goes to the
                # shard's next holder, or waits here for one without invoking one itself.
                self._reroute(conn, origin, call, due=False)
            elif call.shard >= 0 and call.shard not in held:
                # The worker released the shard before it closed, and a worker answers
                # every call it acted on before its release (fusee/engine/serve.py): this
                # one it never acted on (it came too late), so it goes to the shard's next
                # holder, as a MOVED answer would have sent it.
                self._reroute(conn, origin, call, due=True)
            else:
                self._answer(origin, entry[1], m.Answer(0, code="Connection", message=GONE))
        conn.calls.clear()

    def revoke(self, conn: ServerConnection, why: str) -> None:
        """Take every lease `conn` holds (it went silent): close it, as if it had left."""
        logger.warning("%s: revoking its leases on shards %s: %s", conn, sorted(conn.held), why)
        conn.close()
        if conn in self.connections:
            self.lost(conn)

    async def _watch(self) -> None:
        """Liveness: a holder that sent nothing for `silence_s`, or has not taken what we
        wrote for as long, loses its leases. Pings wait in the socket while the loop is
        busy, so silence is judged only after reading what arrived."""
        while True:
            await asyncio.sleep(0.25)
            self._expire_calls()
            now = time.monotonic()
            # Every holder, invoked ones too: an invoked worker frozen mid-budget (a
            # SIGSTOPped function) must lose its leases on the same silence as any other,
            # not only when its invocation's budget and grace run out.
            for conn in [c for c in self.connections if c.held]:
                if not conn.liveness or conn.transport is None:
                    continue
                last_read = conn.last_read
                if conn.pinger is not None and not conn.pinger.closed:
                    last_read = max(last_read, conn.pinger.last_read)
                if now - last_read > self.silence_s:
                    self.revoke(conn, f"no byte from it for {self.silence_s:g} s")
                    continue
                buffered = conn.transport.get_write_buffer_size()
                if buffered == 0 or conn.write_stuck is None or buffered < conn.write_stuck[0]:
                    conn.write_stuck = (buffered, now) if buffered else None
                elif now - conn.write_stuck[1] > self.silence_s:
                    self.revoke(conn, f"it has read nothing we wrote for {self.silence_s:g} s")

    def _expire_calls(self) -> None:
        now = asyncio.get_running_loop().time()
        for slot in self.slots:
            while slot.calls_waiting and slot.calls_waiting[0][2] <= now:
                client, call, _ = slot.calls_waiting.popleft()
                why = f"no worker took shard {slot.index} within {CALL_WAIT_S:g} s{self._why(slot.index)}; retry"
                client.send(m.Answer(call.rid, code="NoHolder", message=why))
        expired = [entry for entry in self.listings_waiting if entry[2] <= now]
        if expired:
            self.listings_waiting = [entry for entry in self.listings_waiting if entry[2] > now]
            free = [s.index for s in self.slots if s.holder is None]
            why = self._why(free[0]) if free else ""
            for client, call, _ in expired:
                message = f"not every shard found a holder in time{why}; retry"
                client.send(m.Answer(call.rid, code="NoHolder", message=message))

    def fail_waiting(self, index: int, before: float, why: str) -> None:
        """The calls waiting for `index` (and the listings) that arrived by `before` fail
        now, saying `why`: the invocation made for them failed on an endpoint that keeps
        failing (invoker.py, FAILED_ROUNDS_FOR_CALLS), so waiting out CALL_WAIT_S would
        only hide the reason. Those that came later wait for the next try."""
        slot = self.slots[index]
        message = f"no worker took shard {index}: {why}; retry once the endpoint answers"
        keep: deque[tuple[ServerConnection, m.Call, float]] = deque()
        for client, call, deadline in slot.calls_waiting:
            if deadline - CALL_WAIT_S <= before:
                client.send(m.Answer(call.rid, code="NoHolder", message=message))
            else:
                keep.append((client, call, deadline))
        slot.calls_waiting = keep
        listings = [entry for entry in self.listings_waiting if entry[2] - CALL_WAIT_S <= before]
        if listings:
            self.listings_waiting = [entry for entry in self.listings_waiting if entry not in listings]
            for client, call, _ in listings:
                client.send(m.Answer(call.rid, code="NoHolder", message=message))

    def _why(self, index: int) -> str:
        return f": {self.invoker.why_no_worker(index)}" if self.invoker is not None else ""

    # -- frames ---------------------------------------------------------------------------

    def received(self, conn: ServerConnection, message: Any) -> None:
        kind = type(message)
        if kind is m.Append:
            self._append(conn, message)
        elif kind is m.PutRun:
            self._put_run(conn, message)
        elif kind is m.Ping:
            pass  # its bytes were the point
        elif conn.role == m.ROLE_PINGER:
            conn.fail(f"{kind.__name__} on a pinger connection (it sends PING only)")
        elif kind is m.Request:
            asyncio.get_running_loop().create_task(self._request(conn, message))
        elif kind is m.Relay:
            self._relay(conn, message)
        elif kind is m.Call:
            self._call(conn, message)
        elif kind is m.Answer:
            self._answered(conn, message)
        elif kind is m.Idle:
            if self._held(conn, message.shard, message.epoch) is not None and self.invoker is not None:
                self.invoker.idle(conn, message)
        elif kind is m.Drain:
            if not all(index in conn.held for index in message.shards):
                conn.fail(f"DRAIN of shards {message.shards}: it holds {sorted(conn.held)}")
                return
            conn.draining.update(message.shards)
            conn.send(message)  # the OK: behind every call routed to it before
        else:
            conn.fail(f"{kind.__name__} is not a frame a {conn.role} sends")

    def _held(self, conn: ServerConnection, shard: int, epoch: int) -> Slot | None:
        """The slot, if `conn` holds `shard` under `epoch`; else the connection is closed
        (a deposed or confused worker never writes again)."""
        if 0 <= shard < self.shards:
            slot = self.slots[shard]
            if slot.holder is conn and slot.epoch == epoch:
                if slot.refused is None:
                    return slot
                conn.fail(f"shard {shard}: a write after a refused one ({slot.refused})")
                return None
        conn.fail(f"shard {shard}: epoch {epoch} is not a lease this connection holds")
        return None

    def _append(self, conn: ServerConnection, message: m.Append) -> None:
        slot = self._held(conn, message.shard, message.epoch)
        if slot is None:
            return
        expected = self.log.appended(slot.index) + 1
        if message.first != expected:
            conn.fail(f"shard {slot.index}: records from {message.first}, but the log is at {expected}")
            return
        try:
            last = self.log.stage_many(slot.index, message.records)
        except ValueError as error:
            slot.refused = str(error)
            conn.fail(f"shard {slot.index}: {error}")
            return
        epoch = slot.epoch
        # Never written here, however fast the disk was: a write on the loop holds every
        # connection, call and ping (and the liveness watch) for as long as its flush
        # takes, and one flush that stalls stalls them all. The writer thread writes, and
        # its eventfd brings the answer (tests/server_mode/test_disk_stall.py).
        try:
            self.storage.request(slot.index, last, lambda result: self._durable(conn, slot, epoch, result))
        except IoError as error:
            self._durable(conn, slot, epoch, error)

    def _durable(self, conn: ServerConnection, slot: Slot, epoch: int, result: int | BaseException) -> None:
        if isinstance(result, BaseException):
            logger.critical("the log stopped after a failed write: %s; stopping", result)
            self.stopped.set()
            return
        if slot.holder is conn and slot.epoch == epoch:
            conn.send(m.Durable([(slot.index, epoch, result)]))

    def _put_run(self, conn: ServerConnection, message: m.PutRun) -> None:
        slot = self._held(conn, message.shard, message.epoch)
        if slot is None:
            return
        try:
            offset = slot.files.append_run(message.offset, message.frame)
        except (_native.CorruptionError, OSError) as error:
            slot.refused = f"the run store refused a write at {message.offset}: {error}"
            conn.send(m.RunPut(slot.index, slot.epoch, message.offset, slot.refused))
            return
        conn.send(m.RunPut(slot.index, slot.epoch, offset))

    async def _request(self, conn: ServerConnection, request: m.Request) -> None:
        slot = self._held(conn, request.shard, request.epoch)
        if slot is None:
            return
        try:
            reply = await self._serve(conn, slot, request)
        except (ValueError, OSError, _native.CorruptionError, IoError) as error:
            reply = m.Reply(request.rid, error=f"shard {slot.index}: {error}")
        except Exception as error:  # a bug here must answer, not leave the worker waiting
            logger.exception("shard %d: %s request failed", slot.index, request.op)
            reply = m.Reply(request.rid, error=f"shard {slot.index}: internal error: {error!r}")
        try:
            conn.send(reply)
        except FrameError as error:  # an answer over the frame limit (too many frames asked for)
            conn.send(m.Reply(request.rid, error=f"shard {slot.index}: {request.op}: {error}"))

    async def _serve(self, conn: ServerConnection, slot: Slot, request: m.Request) -> m.Reply:
        loop = asyncio.get_running_loop()
        op = request.op
        if op == "open":
            await self._settle(slot)
            position = self.log.durable(slot.index)
            checkpoint, page = await self._read_open(slot, min(request.max_bytes, PAGE_BYTES_MAX))
            return m.Reply(
                request.rid,
                position=position,
                runs_len=slot.files.runs_len,
                checkpoint=checkpoint,
                items=page,
            )
        if op == "records":
            page_bytes = min(max(request.max_bytes, 1), PAGE_BYTES_MAX)
            page = await loop.run_in_executor(
                self.readers, self.log.read_records, slot.index, request.after, page_bytes
            )
            return m.Reply(request.rid, items=page)
        if op == "runs":
            read = slot.files.read_run
            items = await loop.run_in_executor(self.readers, lambda: [read(o) for o in request.offsets])
            return m.Reply(request.rid, items=items)
        if op == "checkpoint":
            await self._checkpoint(slot, request.after, request.data)
            return m.Reply(request.rid)
        if op == "release":
            if slot.holder is conn and slot.epoch == request.epoch:
                self._free(slot, f"released by {conn}", skip=conn)
            return m.Reply(request.rid)
        raise ValueError(f"no request {op!r} (expected one of {', '.join(m.OPS)})")

    async def _read_open(self, slot: Slot, page_bytes: int) -> tuple[tuple[int, bytes] | None, list[bytes]]:
        """The shard's newest checkpoint (read from its file: a checkpoint holds a shard's
        whole index, too much to keep in memory) and, for a `page_bytes`, the first page
        of the records after it: a recovery's first round trip does both."""
        if slot.checkpoint_bytes <= INLINE_READ_BYTES:
            # A small shard is read here, on the loop: a thread hop costs more (~0.3 ms)
            # than a small checkpoint and a short first page (the worker asks for the
            # rest, if any, as for any page).
            return self._read_now(slot, min(page_bytes, INLINE_READ_BYTES))
        return await asyncio.get_running_loop().run_in_executor(
            self.readers, self._read_now, slot, page_bytes
        )

    def _read_now(self, slot: Slot, page_bytes: int) -> tuple[tuple[int, bytes] | None, list[bytes]]:
        checkpoint = slot.files.latest_checkpoint()
        if page_bytes <= 0:
            return checkpoint, []
        return checkpoint, self.log.read_records(slot.index, checkpoint[0] if checkpoint else 0, page_bytes)

    async def _settle(self, slot: Slot) -> None:
        """Before a new holder recovers: the previous holder's checkpoints and log writes
        in flight finish, so nothing of its can land after what the new holder reads."""
        while slot.writing:
            await asyncio.wait(list(slot.writing))
        appended = self.log.appended(slot.index)
        if self.log.durable(slot.index) < appended:
            done: asyncio.Future[int | BaseException] = asyncio.get_running_loop().create_future()
            self.storage.request(slot.index, appended, done.set_result)
            result = await done
            if isinstance(result, BaseException):
                raise IoError(str(result))

    async def _checkpoint(self, slot: Slot, position: int, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        # While it is written, an open may read either one: count the larger.
        slot.checkpoint_bytes = max(slot.checkpoint_bytes, len(data))
        writing = loop.run_in_executor(self.storage.checkpoints, slot.files.checkpoint, position, data)
        slot.writing.add(writing)
        try:
            await writing
        finally:
            slot.writing.discard(writing)
        slot.checkpoint_bytes = len(data)
        covered = [s.files.covered() for s in self.slots]
        await loop.run_in_executor(self.storage.executor, self.log.retire, covered, False)

    # -- messages between shards --------------------------------------------------------

    def _relay(self, conn: ServerConnection, message: m.Relay) -> None:
        if not 0 <= message.shard < self.shards:
            conn.fail(f"a message for shard {message.shard}: the server has {self.shards}")
            return
        slot = self.slots[message.shard]
        if message.ack:
            try:
                ack = _ack.decode(message.item)
            except msgspec.DecodeError as error:
                conn.fail(f"a malformed acknowledgment: {error}")
                return
            # Only to the lease the message was sent under: a newer holder renumbered its
            # outbox, and this answer would remove another of its messages.
            if slot.holder is not None and slot.epoch == ack.epoch:
                slot.holder.send(message)
            return
        if slot.holder is not None and slot.index not in slot.holder.draining:
            slot.holder.send(message)
            return
        if self.invoker is not None:
            self.invoker.make_due(slot.index, Reason.MESSAGE)
        slot.waiting.append(message)
        slot.waiting_bytes += len(message.item)
        while len(slot.waiting) > RELAY_FRAMES_MAX or slot.waiting_bytes > RELAY_BYTES_MAX:
            dropped = slot.waiting.popleft()  # its sender resends it every second
            slot.waiting_bytes -= len(dropped.item)

    def _deliver_waiting(self, slot: Slot) -> None:
        holder = slot.holder
        while holder is not None and slot.waiting:
            holder.send(slot.waiting.popleft())
        slot.waiting_bytes = 0

    # -- calls from clients ---------------------------------------------------------------

    def _call(self, client: ServerConnection, call: m.Call) -> None:
        if call.method == "invocations":
            # Answered here, whatever the shard and the arguments say (it names neither).
            metrics = self.invoker.metrics() if self.invoker is not None else {"endpoints": []}
            client.send(m.Answer(call.rid, m.encode_value(metrics)))
            return
        if call.shard == -1 and call.method != "list":
            # Only a listing goes to every holder: any other call sent so would run once
            # on each of them (a start on every worker).
            why = f"call {call.method!r} names no shard (-1 is for 'list' only): give its workflow's shard"
            client.send(m.Answer(call.rid, code="Rejected", message=why))
            return
        if call.shard == -1:
            self._list(client, call)
            return
        if not 0 <= call.shard < self.shards:
            client.send(m.Answer(call.rid, code="Rejected", message=f"no shard {call.shard}"))
            return
        slot = self.slots[call.shard]
        holder = slot.holder
        if holder is None or call.shard in holder.draining:
            if self.invoker is None:
                client.send(m.Answer(call.rid, code="NoHolder", message=no_holder(call.shard)))
                return
            # It waits here (up to CALL_WAIT_S) and makes its shard due.
            deadline = asyncio.get_running_loop().time() + CALL_WAIT_S
            slot.calls_waiting.append((client, call, deadline))
            self.invoker.make_due(call.shard, Reason.CALL, type=_type_of(call))
            return
        self._route(client, call, holder)

    def _reroute(self, mover: ServerConnection, client: ServerConnection, call: m.Call, due: bool) -> None:
        """A call `mover` answered MOVED (it let the shard go before hearing of the call,
        or with the call waiting on its run): to the shard's next holder, as if it arrived
        now. While `mover` still holds the shard here (its release is on its way) it
        waits, as for a shard without holder; and it makes the shard due only if `due`
        (MOVED_WAITING: the run's own due time brings the next holder, and invoking one
        for the wait alone would repeat at every handback while the run sleeps)."""
        if client.closed:
            return
        slot = self.slots[call.shard]
        if slot.holder is not mover and (due or slot.holder is not None):
            self._call(client, call)
        elif self.invoker is None:
            client.send(m.Answer(call.rid, code="NoHolder", message=no_holder(call.shard)))
        else:
            deadline = asyncio.get_running_loop().time() + CALL_WAIT_S
            slot.calls_waiting.append((client, call, deadline))
            if due:
                self.invoker.make_due(call.shard, Reason.CALL, type=_type_of(call))

    def _route(self, client: ServerConnection, call: m.Call, holder: ServerConnection) -> None:
        rid = next(self.rids)
        self.calls[rid] = (client, call.rid, holder, call)
        holder.calls.add(rid)
        holder.send(m.Call(rid, call.method, call.shard, call.args))

    def _list(self, client: ServerConnection, call: m.Call) -> None:
        free = [s.index for s in self.slots if s.holder is None or s.index in s.holder.draining]
        if free:
            if self.invoker is None:
                client.send(m.Answer(call.rid, code="NoHolder", message=no_holder(free[0])))
                return
            # A listing invokes every shard nobody holds, and waits for all of them.
            self.listings_waiting.append((client, call, asyncio.get_running_loop().time() + CALL_WAIT_S))
            for index in free:
                self.invoker.make_due(index, Reason.CALL)
            return
        holders = list(dict.fromkeys(slot.holder for slot in self.slots if slot.holder is not None))
        listing = Listing(client, call.rid, len(holders))
        for holder in holders:
            rid = next(self.rids)
            self.calls[rid] = (listing, call.rid, holder, call)
            holder.calls.add(rid)
            holder.send(m.Call(rid, call.method, -1, call.args))

    def _answered(self, conn: ServerConnection, answer: m.Answer) -> None:
        entry = self.calls.get(answer.rid)
        if entry is None:
            return  # its client left
        origin, rid, holder, _ = entry
        if holder is not conn:
            conn.fail(f"an answer to call {answer.rid}, which went to another connection")
            return
        del self.calls[answer.rid]
        holder.calls.discard(answer.rid)
        call = entry[3]
        if (
            answer.code in (m.MOVED, m.MOVED_WAITING)
            and isinstance(origin, ServerConnection)
            and call.shard >= 0
        ):
            self._reroute(
                conn, origin, m.Call(rid, call.method, call.shard, call.args), answer.code == m.MOVED
            )
            return
        if isinstance(origin, Listing):
            try:
                rows = m.decode_value(answer.value) if answer.code is None else []
                if not isinstance(rows, list) or not all(
                    isinstance(row, dict) and type(row.get("shard")) is int for row in rows
                ):
                    raise FrameError("a listing is a list of maps with a shard")
            except FrameError as error:
                conn.fail(f"a malformed listing: {error}")
                answer = m.Answer(answer.rid, code="Connection", message=GONE)
                rows = []
            self._listed(origin, answer, rows)
            return
        self._answer(origin, rid, answer)

    def _answer(self, origin: ServerConnection | Listing, rid: int, answer: m.Answer) -> None:
        if isinstance(origin, ServerConnection):
            origin.send(m.Answer(rid, answer.value, answer.code, answer.message))
        else:
            self._listed(origin, answer, [])

    def _listed(self, listing: Listing, answer: m.Answer, rows: list[Any]) -> None:
        """One holder's part of a listing; the whole goes back once every part is in."""
        listing.parts -= 1
        if answer.code is not None:
            listing.error = listing.error or answer
        listing.rows.extend(rows)
        if listing.parts == 0:
            if listing.error is not None:
                self._answer(listing.client, listing.rid, listing.error)
            else:
                ordered = sorted(
                    listing.rows, key=lambda row: row["shard"]
                )  # stable: each shard's order kept
                listing.client.send(m.Answer(listing.rid, m.encode_value(ordered)))

    # -- stopping -------------------------------------------------------------------------

    async def stop(self) -> None:
        """Leases released (connections closed), checkpoints in flight finished, the log's
        last write made durable, the directory closed."""
        for listener in self.listeners:
            listener.close()
        if self.invoker is not None:
            await self.invoker.close()
        if self.watch is not None:
            self.watch.cancel()
        for conn in list(self.connections):
            conn.close()
            self.lost(conn)
        writing = [w for slot in self.slots for w in slot.writing]
        if writing:
            await asyncio.wait(writing)
        self.readers.shutdown(wait=True)
        await self.storage.close()


def _type_of(call: m.Call) -> str | None:
    """The workflow type a start names: the endpoint for its type runs it."""
    if call.method not in ("start", "signal_with_start", "update_with_start"):
        return None
    try:
        args = m.decode_value(call.args)
    except FrameError:
        return None
    kind = args.get("type") if isinstance(args, dict) else None
    return kind if isinstance(kind, str) else None


GONE = "the worker went away before answering; retry (the shard's next holder answers)"


def no_holder(shard: int) -> str:
    return f"no worker holds shard {shard} now; retry once one does (start a worker, or wait for a standby)"
