"""The remote backend: a worker's shards stored by a `fusee server` over the wire.

A shard's records go to the server as one APPEND per flush and nothing waits for its
answer: a shard may send its next section before the last one is durable, and the
records, run-store frames and messages of every shard leave in one socket write per
turn of the loop (connection.py). The server answers with DURABLE positions, pushed
back; the shard reports them as it would a local flush.

Run-store frames are appended at offsets this side computes (the store's length), and
the server's answer is checked against them: a disagreement either way stops the shard
before anything it sent later is acknowledged (the server answers a run-store append
before the DURABLE of any section sent after it).

Everything is held under the lease epoch the server granted; when the connection goes,
every shard hears of a lost lease and stops, and its next holder recovers it from the
server's disk. A long-lived worker connects again by itself (a server restart, a broken
connection, a lease revoked after a stop), with backoff and jitter, until it is closed:
the new server grants it shards under new epochs, and it attaches and recovers them as a
standby does (docs/server.md, *Reconnecting*). An invoked worker does not: its invocation
ended with its connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Self

import msgspec

from fusee import _errors as errors
from fusee._backoff import Backoff
from fusee._errors import FuseeError, IoError, LeaseLostError
from fusee.journal import Ack, Msg
from fusee.protocol import messages as m
from fusee.protocol.address import Address
from fusee.protocol.connection import ClientConnection, connect, passed_over
from fusee.protocol.pinger import Pinger
from fusee.storage.contract import PAGE_BYTES, Durability, Receive, Report
from fusee.storage.relay import Relay

logger = logging.getLogger("fusee.remote")

FRAME_HEADER = 8  # a run-store frame: length and checksum, then its bytes
SILENCE_SHARE = 0.8  # of the server's liveness timeout: silent longer, a worker lets its leases go
APPEND_BYTES = 8 << 20  # records per APPEND frame, about (one record may be up to the log's limit)
RECORD_BYTES_MAX = (64 << 20) - 4096  # the log's limit on one record (a batch's room)
RECONNECT_FIRST_S = 0.05
FIRST_WAIT_S = 10.0  # of a list, the first connection waits this long for a server (a failover)
RECONNECT_MAX_S = 1.0  # a restarted server has its worker back within about a second

_msg = msgspec.msgpack.Decoder(Msg)
_ack = msgspec.msgpack.Decoder(Ack)
_encode = msgspec.msgpack.encode


class RemoteStorage:
    """A worker's (or a client's) connection to the server."""

    durability = Durability.SERVER

    def __init__(self, address: Address, role: str = m.ROLE_WORKER) -> None:
        self.address = address
        self.opening = m.Open(m.VERSION, role, address.max_shards, address.invocation)
        self.conn: ClientConnection | None = None
        self.wire: _Wire | None = None  # the handler of `conn`: frames of older ones are dropped
        self.connections = 0  # connections taken up so far (the first, then each reconnect)
        # A long-lived worker connects again when its connection goes; an invoked worker's
        # lease ends with its connection (the server refuses its invocation ID from then on).
        self.reconnects = role == m.ROLE_WORKER and address.invocation is None
        self.reconnecting: asyncio.Task[None] | None = None
        self.closing = False
        self.shards = 0
        self.callback_url: str | None = None  # the server's --public-url: the base of `cb.url`
        self.granted: dict[int, int] = {}  # shard -> epoch of the lease the server granted
        self.preopened: dict[int, m.Opened] = {}  # opens the server answered in WELCOME
        self.stores: dict[int, RemoteShardStore] = {}
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.rids = 0
        self.relayed = Relay()  # messages for granted shards not attached yet wait here
        self.lost: errors.ConnectionError | None = None
        self.on_lease: Callable[[int], None] | None = None  # a standby was granted a shard
        self.on_call: Callable[[m.Call], None] | None = None
        self.ticker: asyncio.TimerHandle | None = None
        self.ticker_thread: asyncio.TimerHandle | None = None  # an invoked worker's pinger, started late
        self.pinger: Pinger | None = None
        self.ping_s = 1.0
        self.silence_limit_s = 0.0  # 0: the server never revokes a silent lease
        self.last_tick = 0.0  # time.monotonic() of the loop's last ping tick (a heartbeat)
        self.budget_ms = 0  # an invoked worker's budget left, as its lease said
        self.drained: asyncio.Future[None] | None = None
        self.held_calls: list[m.Call] = []
        self.permits: Any = None  # the engine's limits, which hears of grants (RemotePermits)

    def serve_calls(self, on_call: Callable[[m.Call], None]) -> None:
        """From now on `on_call` answers the calls relayed here (and those held so far)."""
        self.on_call = on_call
        held, self.held_calls = self.held_calls, []
        for call in held:
            on_call(call)

    @classmethod
    async def connect(cls, address: Address, role: str = m.ROLE_WORKER) -> Self:
        storage = cls(address, role)
        await storage._connect(FIRST_WAIT_S)
        return storage

    async def _connect(self, wait_s: float = 0.0) -> None:
        """Connect, and take the connection up: its grants, its pings, then the frames that
        came behind its WELCOME. `wait_s`: the first connection waits that long for a
        server of a list (a failover under way), as connect() says."""
        wire = _Wire(self)
        conn, welcome = await connect(self.address, self.opening, wire, wait_s)
        if wire.lost is not None:  # gone between its WELCOME and now
            raise wire.lost
        if self.connections and welcome.shards != self.shards:
            conn.close()
            raise errors.ConnectionError(
                f"the server at {conn.where} has {welcome.shards} shards, not the {self.shards} this "
                "worker opened with (another data directory?)"
            )
        self.conn, self.wire = conn, wire
        self.connections += 1
        self.lost = None
        self.shards = welcome.shards
        self.granted = dict(welcome.granted)
        self.preopened = {opened.shard: opened for opened in welcome.opened}
        self.budget_ms = welcome.budget_ms
        self.callback_url = welcome.callback_url or None
        if welcome.timeout_ms:
            self.ping_s = welcome.ping_ms / 1000
            # Well inside the server's timeout: a worker that was silent this long may be
            # deposed already (the server judges by when bytes arrived, a little later).
            self.silence_limit_s = welcome.timeout_ms / 1000 * SILENCE_SHARE
            self.last_tick = 0.0  # the last connection's ticks say nothing about this one
            self._ping()
            if welcome.session:
                # The pings that do not depend on this event loop (pinger.py).
                if self.address.invocation is None:
                    self._start_pinger(welcome.session)
                else:
                    # Most invocations end within a few hundred ms: their thread and second
                    # connection would cost more than the pings they send (the loop's own
                    # pings cover a loop that is not blocked). Not even made before then:
                    # its thread and event objects cost the cold start about 40 us.
                    delay = self.ping_s / 2
                    self.ticker_thread = asyncio.get_running_loop().call_later(
                        delay, self._start_pinger, welcome.session
                    )
        if self.on_lease is not None:
            # Connected again: the engine takes what this connection was granted (before
            # the calls behind the WELCOME, which wait for their shard's attach).
            for index in sorted(self.granted):
                self.on_lease(index)
        early, wire.early = wire.early, None
        for message in early or ():
            if self.lost is not None:
                break  # (lost again meanwhile: what is left belongs to a dead connection)
            self.on_message(message)

    def _start_pinger(self, session: bytes) -> None:
        # To the server the worker's connection reached (of a list: the one owning the shards).
        reached = (
            self.conn.address if self.conn is not None and self.conn.address is not None else self.address
        )
        self.pinger = Pinger(reached, session, self.ping_s, self.silence_limit_s)
        self.pinger.start()

    @property
    def initial_shards(self) -> list[int]:
        return sorted(self.granted)

    def _ping(self) -> None:
        # Only when nothing else went out for a while: any frame shows we are alive. (The
        # pinger thread does the same on its own connection while this loop is busy.)
        conn = self.conn
        if conn is None or conn.closed:
            return
        now = time.monotonic()
        if self.silence_limit_s and self.stores and self.last_tick and self._was_silent():
            # This tick came late by more than the server waits: the process was stopped
            # (or starved) meanwhile, and its leases are gone. Ticking on would make the
            # frames waiting in the socket look fresh (_was_silent reads last_tick).
            return
        if self.address.others and self.silence_limit_s and now - conn.last_read > self.silence_limit_s:
            # The server answers every ping: one that said nothing this long is stopped or
            # cut off, and of a list of servers another may own the shards by now.
            silent = now - conn.last_read
            if conn.address is not None:
                passed_over(self.address, conn.address)
            conn.close()
            self.on_lost(
                errors.ConnectionError(f"the server at {conn.where} answered nothing for {silent:.1f} s")
            )
            return
        self.last_tick = now
        if self.last_tick - conn.last_sent >= self.ping_s * 0.9:
            conn.send(m.Ping())
        self.ticker = asyncio.get_running_loop().call_later(self.ping_s, self._ping)

    # -- from the server ----------------------------------------------------------------

    def on_message(self, message: Any) -> None:
        if self.silence_limit_s and self.stores and self._was_silent():
            return
        kind = type(message)
        if kind is m.Durable:
            for shard, epoch, position in message.positions:
                store = self.stores.get(shard)
                if store is not None and store.epoch == epoch:
                    store.durable(position)
        elif kind is m.Reply or kind is m.Answer:
            future = self.pending.pop(message.rid, None)
            if future is not None and not future.done():
                future.set_result(message)
        elif kind is m.RunPut:
            store = self.stores.get(message.shard)
            if store is not None and store.epoch == message.epoch:
                store.run_put(message)
        elif kind is m.Relay:
            item: Msg | Ack = _ack.decode(message.item) if message.ack else _msg.decode(message.item)
            self.relayed.send(message.shard, item)
        elif kind is m.Drain:
            if self.drained is not None and not self.drained.done():
                self.drained.set_result(None)
        elif kind is m.PermitGrant:
            if self.permits is not None:
                self.permits.granted(message)
            else:
                self.send(m.PermitReturn(message.tickets))
        elif kind is m.Lease:
            self.granted[message.shard] = message.epoch
            if self.on_lease is not None:
                self.on_lease(message.shard)
        elif kind is m.Ping:
            pass  # the server's answer to ours: it is alive (`_ping`)
        elif kind is m.Call:
            if self.on_call is not None:
                self.on_call(message)
            else:
                # Calls that waited at the server come right behind the grant, often in
                # the same read as the WELCOME: held until the engine serves calls.
                self.held_calls.append(message)
        else:
            logger.warning("ignoring a %s frame from the server", kind.__name__)

    def silent(self) -> bool:
        """Whether this process said nothing for longer than the server waits before it
        revokes a lease, as far as can be told without acting on it (a step thread may
        ask, while the loop has not yet read what waited in its socket)."""
        if not self.silence_limit_s or self.lost is not None:
            return self.lost is not None
        pinger = self.pinger
        if pinger is not None and pinger.stalled:
            return True
        last = max(self.last_tick, pinger.last_beat if pinger is not None else 0.0)
        return bool(last) and time.monotonic() - last > self.silence_limit_s

    def _was_silent(self) -> bool:
        """Whether this process said nothing for longer than the server waits before it
        revokes a lease (it was stopped, or starved of CPU): then the server has given its
        shards to another holder, and what it reads now (a durable position waiting in
        the socket) must not start a step that holder may have run and recorded. It lets
        its leases go instead, as if the connection had closed."""
        if not self.silent():
            return False
        assert self.conn is not None
        pinger = self.pinger
        silent = time.monotonic() - max(self.last_tick, pinger.last_beat if pinger is not None else 0.0)
        self.conn.close()  # its close, reported later, is this loss (the wire drops it)
        self.on_lost(errors.ConnectionError(f"this worker sent nothing for {silent:.1f} s (was it stopped?)"))
        return True

    def on_lost(self, error: errors.ConnectionError) -> None:
        if self.lost is not None:
            return
        self.lost = error
        self._stop_pings()
        again = self.reconnects and not self.closing
        if again:
            why = "; it connects again and takes its shards back (or a standby takes them): retry"
            logger.warning("%s: connecting again", error)
        else:
            why = " (a standby takes its shards)"
        lease = LeaseLostError(f"{error}: this worker's leases are gone{why}")
        for store in list(self.stores.values()):
            store.lose(lease)
        if self.permits is not None:
            self.permits.lost()
        for future in [*self.pending.values(), self.drained]:
            if future is not None and not future.done():
                future.set_exception(error)
        self.pending.clear()
        # Granted on the lost connection and not attached: those grants died with it.
        # Relayed messages waiting for them are dropped (their senders send them again).
        self.granted.clear()
        self.preopened.clear()
        self.relayed.waiting.clear()
        if again and self.reconnecting is None:
            self.reconnecting = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        """Connect again until connected or closed, waiting by the backoff between tries."""
        backoff = Backoff(RECONNECT_FIRST_S, RECONNECT_MAX_S)
        failures = 0
        try:
            while not self.closing:
                await asyncio.sleep(backoff.next())
                try:
                    await self._connect()
                except (FuseeError, OSError) as error:  # (a token file being replaced, say)
                    failures += 1
                    if failures == 1:
                        logger.warning("%s; trying again (at least once a second)", error)
                    continue
                logger.warning(
                    "connected again to the server at %s; granted shards %s",
                    self.conn.where if self.conn is not None else "?",
                    sorted(self.granted),
                )
                return
        finally:
            self.reconnecting = None

    # -- to the server -----------------------------------------------------------------

    def send(self, message: Any) -> None:
        if self.conn is not None:
            self.conn.send(message)

    async def ask(self, message: Any) -> Any:
        """A round trip: `message` must have a `rid` field, set here."""
        if self.lost is not None:
            raise self.lost
        self.rids += 1
        message.rid = self.rids
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[self.rids] = future
        self.send(message)
        return await future

    async def request(self, op: str, store: RemoteShardStore, **fields: Any) -> m.Reply:
        reply: m.Reply = await self.ask(m.Request(0, op, store.index, store.epoch, **fields))
        if reply.error is not None:
            raise IoError(reply.error)
        return reply

    # -- the storage contract -----------------------------------------------------------

    async def open_shard(self, index: int, report: Report, receive: Receive) -> RemoteShardStore:
        epoch = self.granted.get(index)
        if epoch is None:
            raise LeaseLostError(f"shard {index} is not leased to this worker")
        if self.lost is not None:
            raise LeaseLostError(str(self.lost))
        store = RemoteShardStore(self, index, epoch, report, receive)
        ahead = self.preopened.pop(index, None)
        if ahead is not None and ahead.epoch == epoch:
            # The server answered this open in its WELCOME (spent once: a second open of
            # the shard in this process asks, as any other).
            store.opened(
                m.Reply(
                    0,
                    position=ahead.position,
                    runs_len=ahead.runs_len,
                    checkpoint=ahead.checkpoint,
                    items=ahead.items,
                )
            )
        else:
            store.opened(await self.request("open", store, max_bytes=PAGE_BYTES))
        previous = self.stores.get(index)
        if previous is not None:
            previous.lose(LeaseLostError(f"shard {index} was opened again in this process"))
        self.stores[index] = store
        self.relayed.attach(index, receive)
        return store

    def relay(self, index: int, item: Msg | Ack) -> None:
        self.send(m.Relay(index, isinstance(item, Ack), _encode(item)))

    async def drain(self, shards: list[int]) -> None:
        """Ask the server to route nothing more to `shards`; returns once everything it
        routed here before has arrived (the server's echo comes behind it)."""
        if self.lost is not None:
            raise self.lost
        self.drained = asyncio.get_running_loop().create_future()
        self.send(m.Drain(shards))
        await self.drained

    def idle(self, report: m.Idle) -> None:
        """How this invoked worker leaves a shard (sent before the connection closes)."""
        self.send(report)

    def release(self, index: int, epoch: int | None = None) -> None:
        """Give back a granted shard no store holds (its attach failed). With `epoch`,
        only that grant: an attach that failed because the connection went must not give
        back what the next connection was granted meanwhile."""
        if epoch is not None and self.granted.get(index) != epoch:
            return
        epoch = self.granted.pop(index, None)
        if epoch is not None and index not in self.stores:
            self.send(m.Request(0, "release", index, epoch))

    def let_go(self, store: RemoteShardStore) -> None:
        if self.stores.get(store.index) is store:
            del self.stores[store.index]
            if self.permits is not None:
                self.permits.forget(store.index)
            self.relayed.detach(store.index, store.receive)
            if self.granted.get(store.index) == store.epoch:
                del self.granted[store.index]

    def _stop_pings(self) -> None:
        if self.ticker is not None:
            self.ticker.cancel()
        if self.ticker_thread is not None:
            self.ticker_thread.cancel()
        if self.pinger is not None:
            self.pinger.stop()

    async def close(self) -> None:
        """Close the connection and stop connecting again (a clean close of the engine)."""
        self.closing = True
        reconnecting = self.reconnecting
        if reconnecting is not None:
            reconnecting.cancel()  # connect() closes a connection it was setting up
            await asyncio.gather(reconnecting, return_exceptions=True)
        self._stop_pings()
        if self.conn is not None:
            await self.conn.aclose()

    async def abandon(self) -> None:
        await self.close()


class _Wire:
    """The handler of one connection. Its frames reach the storage only once the storage
    took the connection up: a LEASE or a CALL can come in the same read as the WELCOME,
    before the storage knows what the WELCOME granted. And only while it is the storage's
    connection: one given up on (silent too long) reports its close later, maybe after
    the next one is up, and must not take that one down."""

    def __init__(self, storage: RemoteStorage) -> None:
        self.storage = storage
        self.early: list[Any] | None = []  # frames before the storage took it up
        self.lost: errors.ConnectionError | None = None

    def on_message(self, message: Any) -> None:
        if self.early is not None:
            self.early.append(message)
        elif self.storage.wire is self:
            self.storage.on_message(message)

    def on_lost(self, error: errors.ConnectionError) -> None:
        self.lost = error
        if self.early is None and self.storage.wire is self:
            self.storage.on_lost(error)


class RemoteShardStore:
    """One shard held under one lease: the contract's ShardStore over the wire."""

    def __init__(
        self, storage: RemoteStorage, index: int, epoch: int, report: Report, receive: Receive
    ) -> None:
        self.storage = storage
        self.index = index
        self.epoch = epoch
        self._report = report
        self.receive = receive
        self.pending: list[bytes] = []
        self.next_position = 0
        self.durable_position = 0
        self.sent_position = 0
        self.runs_len = 0
        self.run_offsets: collections.deque[int] = collections.deque()  # appends awaiting an answer
        self.checkpoint_found: tuple[int, bytes] | None = None
        self.log_end = 0  # the shard's durable position when it was opened
        self.first_page: tuple[int, list[bytes]] | None = None  # (after, records) from the open
        self.stopped: BaseException | None = None
        self.dropped = False
        # time.monotonic() of the first APPEND sent and of the first DURABLE taken (0: not
        # yet): the invoke trace's `appended` and `durable`, a cold start's first write.
        self.first_sent_at = self.first_durable_at = 0.0

    def opened(self, reply: m.Reply) -> None:
        self.next_position = self.durable_position = self.sent_position = reply.position
        self.runs_len = reply.runs_len
        self.checkpoint_found = reply.checkpoint
        # The open's answer carries the first page of the records after the checkpoint,
        # and the log ends at `reply.position` (we hold the lease: nobody else appends),
        # so recovering a small shard asks nothing more.
        self.log_end = reply.position
        self.first_page = (reply.checkpoint[0] if reply.checkpoint else 0, reply.items)

    def report(self, result: int | BaseException) -> None:
        if not self.dropped:
            self._report(result)

    def lose(self, error: BaseException) -> None:
        """Stop: nothing more is sent; the shard hears of it once, on a later turn."""
        if self.stopped is None:
            self.stopped = error
            self.pending.clear()
            asyncio.get_running_loop().call_soon(self.report, error)
            self.storage.let_go(self)

    def durable(self, position: int) -> None:
        if self.stopped is None and position > self.durable_position:
            self.durable_position = position
            if not self.first_durable_at:
                self.first_durable_at = time.monotonic()
            self.report(position)

    def append(self, entry: bytes) -> int:
        if self.stopped is None:
            self.pending.append(entry)
        self.next_position += 1
        return self.next_position

    def flush(self) -> None:
        if self.dropped:
            return
        if self.stopped is not None:
            asyncio.get_running_loop().call_soon(self.report, self.stopped)
            return
        if self.pending:
            records, self.pending = self.pending, []
            # Cut into frames of about APPEND_BYTES: a burst of large records must not make
            # one frame over the protocol's limit. Each says where its records begin.
            start = size = 0
            for i, record in enumerate(records):
                if len(record) > RECORD_BYTES_MAX:
                    self.lose(
                        IoError(
                            f"shard {self.index}: a record of {len(record)} bytes is over the log's limit"
                        )
                    )
                    return
                if size and size + len(record) > APPEND_BYTES:
                    self._send_records(records[start:i], self.sent_position + 1 + start)
                    start, size = i, 0
                size += len(record)
            self._send_records(records[start:], self.sent_position + 1 + start)
            self.sent_position = self.next_position
        elif self.durable_position >= self.next_position:
            asyncio.get_running_loop().call_soon(self.report, self.durable_position)

    def _send_records(self, records: list[bytes], first: int) -> None:
        if not self.first_sent_at:
            self.first_sent_at = time.monotonic()
        self.storage.send(m.Append(self.index, self.epoch, first, records))

    def put_run(self, frame: bytes) -> int:
        offset = self.runs_len
        if self.stopped is not None:
            return offset
        self.runs_len = offset + FRAME_HEADER + len(frame)
        self.run_offsets.append(offset)
        self.storage.send(m.PutRun(self.index, self.epoch, offset, frame))
        return offset

    def run_put(self, answer: m.RunPut) -> None:
        expected = self.run_offsets.popleft() if self.run_offsets else None
        if answer.error is not None or answer.offset != expected:
            why = answer.error or f"written at {answer.offset}, expected {expected}"
            self.lose(IoError(f"shard {self.index}: the server's run store refused a write: {why}"))

    async def get_runs(self, offsets: Sequence[int]) -> list[bytes]:
        if not offsets:
            return []
        reply = await self.storage.request("runs", self, offsets=list(offsets))
        return reply.items

    async def latest_checkpoint(self) -> tuple[int, bytes] | None:
        return self.checkpoint_found

    async def records(self, after: int, max_bytes: int = PAGE_BYTES) -> list[bytes]:
        first, self.first_page = self.first_page, None
        if first is not None and first[0] == after and max_bytes >= PAGE_BYTES:
            return first[1]
        if after >= self.log_end and self.sent_position == self.log_end:
            return []  # nothing after the log's end, and nothing of ours sent since the open
        reply = await self.storage.request("records", self, after=after, max_bytes=max_bytes)
        return reply.items

    async def checkpoint(self, position: int, data: bytes) -> None:
        await self.storage.request("checkpoint", self, after=position, data=data)

    async def close(self) -> None:
        if self.stopped is None and self.storage.lost is None:
            try:
                await self.storage.request("release", self)
            except (IoError, errors.ConnectionError):
                pass  # the connection went: the lease went with it
        self.dropped = True
        self.storage.let_go(self)

    def abandon(self) -> None:
        """As a crash: nothing staged is sent; the server hears the lease is let go."""
        self.dropped = True
        if self.stopped is None:
            self.stopped = IoError(f"shard {self.index} was let go of")
            self.pending.clear()
            self.storage.send(m.Request(0, "release", self.index, self.epoch))
        self.storage.let_go(self)

    def fenced(self) -> bool:
        return self.storage.silent()
