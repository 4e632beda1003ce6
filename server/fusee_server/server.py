"""`fusee server`: every shard's log in one store (this machine's disk, or a PostgreSQL
database several servers share), shards leased to workers over the wire, calls and messages relayed between them.

Everything here runs on one event loop, so a lease check and the write it guards happen
in one step: no other frame can move the lease between them. The `Server` wires the
rooms that hold each mechanism (docs/server.md, *The server's rooms*):

- `leases.py`: the lease table, epochs, liveness and revocation;
- `relay.py`: messages, calls and listings, and what waits for a holder;
- `seam.py`: what the server asks of its store: `disk.py`, the Rust disk path, or
  `postgres/`, a database several servers share;
- `invoker.py`: invoked workers, for shards with work and no holder;
- `limits.py`: limits' definitions, permits under leases and their waiting queue;
- `listener.py`: a connection's handshake and states, handing every frame here.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fusee.protocol import messages as m
from fusee.protocol.frames import PAYLOAD_BYTES_MAX, FrameError
from fusee_server.disk import Disk
from fusee_server.invoker import Invoker, Reason
from fusee_server.leases import EPOCH_SHIFT, Lease, Leases
from fusee_server.limits import ServerLimits
from fusee_server.listener import ServerConnection
from fusee_server.relay import Relay
from fusee_server.seam import Store

if TYPE_CHECKING:
    from fusee_server.postgres.store import PgStore

logger = logging.getLogger("fusee.server")

WATCH_S = 0.25  # how often liveness and waiting calls' deadlines are looked at


class Server:
    frame_limit = PAYLOAD_BYTES_MAX

    def __init__(
        self, store: Store, stopped: asyncio.Event, epochs: Callable[[int], int] | None = None
    ) -> None:
        self.store = store
        self.stopped = stopped
        self.shards = store.shard_count
        self.leases = Leases(self.shards, self, epochs)
        self.relay = Relay(self.leases.table, store)
        self.limits = ServerLimits(store.definitions)
        self.relay.limits = self.limits
        self.limits.wake = self._permit_kept
        self.listeners: list[asyncio.Server] = []
        self.watch: asyncio.Task[None] | None = None
        self._invoker: Invoker | None = None
        self.callback_url: str | None = None  # --public-url: workers build `cb.url` on it

    @classmethod
    async def open(cls, root: str, shards: int | None, backup: str | None = None) -> Server:
        """Open (or create) the directory and recover its log (`Disk.open`), with a
        continuous backup to `backup` if named."""
        stopped = asyncio.Event()
        return cls(await Disk.open(root, shards, stopped.set, backup), stopped)

    @classmethod
    def on_store(cls, store: PgStore) -> Server:
        """A server on a PostgreSQL store whose shards this process owns now: worker
        epochs grow with the store's epochs, across every server (leases.py)."""
        stopped = asyncio.Event()
        store.failed = stopped.set
        return cls(store, stopped, lambda index: store.ownership.epochs[index] << EPOCH_SHIFT)

    @property
    def invoker(self) -> Invoker | None:
        return self._invoker

    @invoker.setter
    def invoker(self, invoker: Invoker | None) -> None:
        self._invoker = invoker
        self.relay.invoker = invoker

    def start(self) -> None:
        self.watch = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            self.relay.expire()
            self.leases.check_liveness()
            self.limits.expire()

    # -- what the invoker asks (invoker.Shards) -------------------------------------------

    def holder(self, index: int) -> ServerConnection | None:
        return self.leases.holder(index)

    def calls_wait(self, index: int) -> bool:
        return self.relay.calls_wait(index)

    def calls_waiting(self) -> int:
        return self.relay.waiting()

    def revoke(self, conn: ServerConnection, why: str) -> None:
        self.leases.revoke(conn, why)

    def fail_waiting(self, index: int, before: float, why: str) -> None:
        self.relay.fail_waiting(index, before, why)

    def dues(self) -> list[int | None]:
        return self.store.dues()

    def set_due(self, index: int, due_ms: int) -> None:
        self.store.set_due(index, due_ms)

    # -- connections ----------------------------------------------------------------------

    def opened(self, conn: ServerConnection) -> str | None:
        """A connection finished its setup: a worker takes the free shards it has room for."""
        refusal = self.store.serving()
        if refusal is not None:
            return refusal
        leases = self.leases
        if conn.role == m.ROLE_PINGER:
            worker = leases.sessions.get(conn.session)
            if worker is None:
                return "no worker connection has that session (it closed)"
            worker.pinger = conn
            leases.connections.add(conn)
            conn.send(m.Welcome(self.shards, [], int(leases.ping_s * 1000), int(leases.silence_s * 1000)))
            return None
        leases.connections.add(conn)
        granted: list[tuple[int, int]] = []
        if conn.invocation is not None:
            return self._opened_invoked(conn)
        if conn.role == m.ROLE_WORKER:
            conn.session = os.urandom(16)
            leases.sessions[conn.session] = conn
            leases.workers.append(conn)
            for lease in leases.table:
                if lease.holder is None and leases.has_room(conn):
                    granted.append((lease.index, leases.grant(lease, conn)))
        timeout_ms = int(leases.silence_s * 1000) if conn.liveness else 0
        conn.send(
            m.Welcome(
                self.shards,
                granted,
                int(leases.ping_s * 1000),
                timeout_ms,
                conn.session,
                callback_url=self.callback_url or "",
            )
        )
        for index, _ in granted:
            self.granted(index)
        return None

    def _opened_invoked(self, conn: ServerConnection) -> str | None:
        """An invoked worker: it gets exactly its invocation's shards that no one holds by
        now, and never waits as a standby."""
        assert conn.invocation is not None
        leases = self.leases
        invocation = self.invoker.lookup(conn.invocation) if self.invoker is not None else None
        if invocation is None:
            leases.connections.discard(conn)
            return f"invocation {conn.invocation} is unknown or finished"
        if invocation.conn is not None:
            leases.connections.discard(conn)
            return f"invocation {conn.invocation} is connected already"
        invocation.conn = conn
        invocation.connected = asyncio.get_running_loop().time()
        conn.max_shards = 0
        conn.session = os.urandom(16)
        leases.sessions[conn.session] = conn
        granted = [
            (i, leases.grant(leases.table[i], conn))
            for i in invocation.shards
            if leases.table[i].holder is None
        ]
        invocation.leased = bool(granted)
        now = asyncio.get_running_loop().time()
        conn.send(
            m.Welcome(
                self.shards,
                granted,
                int(leases.ping_s * 1000),
                int(leases.silence_s * 1000),
                conn.session,
                invocation.budget_left_ms(now),
                self.store.preopen(granted),
                self.callback_url or "",
            )
        )
        for index, _ in granted:
            self.granted(index)
        return None

    def _permit_kept(self, index: int) -> None:
        """A permit was reserved for shard `index` (limits.py): the shard is due for it
        once nobody holds it (a holder's steps take it as they ask again). After this
        turn: the shard's release that made it may not have freed the lease yet."""
        asyncio.get_running_loop().call_soon(self._due_for_permit, index)

    def _due_for_permit(self, index: int) -> None:
        if self.invoker is not None and self.leases.holder(index) is None and self.limits.reserved.get(index):
            self.invoker.make_due(index, Reason.PERMIT)

    def granted(self, index: int) -> None:
        """After the grant went out: what waited for a holder goes to it."""
        self.store.set_due(index, 0)  # held: if this server goes now, the next one looks at it
        self.limits.held_by(index)
        if self.invoker is not None:
            self.invoker.held(index)
        self.relay.granted(index)

    def unheld(self, index: int, holder: ServerConnection) -> None:
        if self.invoker is not None:
            self.invoker.freed(index, holder)

    def lost(self, conn: ServerConnection) -> None:
        leases = self.leases
        leases.connections.discard(conn)
        if conn.role == m.ROLE_PINGER:
            return
        if leases.sessions.get(conn.session) is conn:
            del leases.sessions[conn.session]
        if conn.pinger is not None:
            conn.pinger.close()
        if conn in leases.workers:
            leases.workers.remove(conn)
        if conn.invocation is not None and self.invoker is not None:
            invocation = self.invoker.lookup(conn.invocation)
            if invocation is not None and invocation.conn is conn:
                invocation.closed.set()
        for index in sorted(conn.held):
            self.limits.released(conn, index)
        self.limits.lost(conn)
        held = set(conn.held)
        for index in sorted(held):
            leases.free(leases.table[index], f"let go: {conn} closed its connection")
        self.relay.lost(conn, held)

    # -- frames ---------------------------------------------------------------------------

    def received(self, conn: ServerConnection, message: Any) -> None:
        kind = type(message)
        if kind is m.Append:
            lease = self.leases.held(conn, message.shard, message.epoch)
            if lease is not None:
                self.store.append(conn, lease, message)
        elif kind is m.PutRun:
            lease = self.leases.held(conn, message.shard, message.epoch)
            if lease is not None:
                self.store.put_run(conn, lease, message)
        elif kind is m.Ping:
            if conn.role != m.ROLE_PINGER:
                # Answered: a worker or a client of a list of servers hears one that
                # stopped (RemoteStorage._ping, client/_link.py).
                conn.send(m.Ping())
        elif conn.role == m.ROLE_PINGER:
            conn.fail(f"{kind.__name__} on a pinger connection (it sends PING only)")
        elif kind is m.Request:
            # The lease is checked as the frame arrives, in the connection's order: a
            # release processed here must not fail a request that came before it.
            lease = self.leases.held(conn, message.shard, message.epoch)
            if lease is None:
                pass
            elif message.op == "release":
                self._release(conn, lease, message)
            else:
                asyncio.get_running_loop().create_task(self._request(conn, lease, message))
        elif kind is m.Relay:
            self.relay.relay(conn, message)
        elif kind is m.Call:
            self.relay.call(conn, message)
        elif kind is m.Answer:
            self.relay.answered(conn, message)
        elif kind is m.Idle:
            if self.leases.held(conn, message.shard, message.epoch) is not None and self.invoker is not None:
                self.invoker.idle(conn, message)
        elif kind is m.PermitAsk and conn.role == m.ROLE_WORKER:
            self.limits.ask(conn, message)
        elif kind is m.PermitReturn and conn.role == m.ROLE_WORKER:
            self.limits.returned(conn, message)
        elif kind is m.PermitRenew and conn.role == m.ROLE_WORKER:
            self.limits.renew(conn, message)
        elif kind is m.Drain and conn.role == m.ROLE_WORKER:
            if not all(index in conn.held for index in message.shards):
                conn.fail(f"DRAIN of shards {message.shards}: it holds {sorted(conn.held)}")
                return
            conn.draining.update(message.shards)
            conn.send(message)  # the OK: behind every call routed to it before
        else:
            conn.fail(f"{kind.__name__} is not a frame a {conn.role} sends")

    def _release(self, conn: ServerConnection, lease: Lease, request: m.Request) -> None:
        """A holder lets a shard go, at once, in the connection's order of frames: the
        frames behind the release and its connection's close come after it. So a call its
        worker had not answered when the connection closed goes to the next holder as
        never acted on, not failed as by a worker that went holding the shard (its
        release was still waiting for a turn of the loop: relay.py, `Relay.lost`). And
        the log's last record of the shard is noted now: the records the worker sent are
        all staged, none comes after, and an answer behind the release may rest on them
        (a close past its deadline answers as if they were durable: Shard.close), so the
        relay holds such an answer until they are (Relay.answered)."""
        conn.released[lease.index] = self.store.appended(lease.index)
        self.limits.released(conn, lease.index)
        self.leases.free(lease, f"released by {conn}", skip=conn)
        conn.send(m.Reply(request.rid))

    async def _request(self, conn: ServerConnection, lease: Lease, request: m.Request) -> None:
        reply = await self.store.reply(lease.index, request)
        try:
            conn.send(reply)
        except FrameError as error:  # an answer over the frame limit (too many frames asked for)
            conn.send(m.Reply(request.rid, error=f"shard {lease.index}: {request.op}: {error}"))

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
        for conn in list(self.leases.connections):
            conn.close()
            self.lost(conn)
        await self.store.close()
