"""The server's limits (docs/limits.md, *Server mode*): definitions persisted in the
directory (`limits.json`), permits granted to workers under leases, and every worker's
waiting steps in one queue, so the order (priority, fairness turns, arrival) is the same
whichever worker asks.

A permit's lease lapses PERMIT_LEASE_MS after the holder last renewed it. A worker whose
connection closes (it was SIGKILLed, its machine went away) keeps its permits until then:
its attempts may still be calling the limited service, and the bound counts them until
their lease says otherwise. A restarted server does not know which permits it granted
before, so it grants nothing for a lease's length after it starts.

A step's wait outlives its worker (docs/limits.md, *A waiting step holds no invocation*):
an ask names the step's shard, and when the shard's holder lets it go (an invoked worker
whose runs wait only for permits reports the shard idle and leaves), the ask stays in the
queue, kept for the shard. Granted, its permit is reserved for the shard, which is made
due (`wake`: the invoker's reason `permit`); the step of the shard's next holder asking
for the same limit, priority and key takes it at once. An ask of the next holder that
finds its shard's ask still waiting takes that one's place in the queue instead."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fusee._clock import SystemClock
from fusee._errors import FuseeError
from fusee.engine.limits.handle import check_definition
from fusee.engine.limits.local import Limiter, Permit
from fusee.protocol import messages as m
from fusee_server.listener import ServerConnection
from fusee_server.seam import Definitions

logger = logging.getLogger("fusee.server")

FILE = "limits.json"

Ticket = tuple[ServerConnection, int]
Kind = tuple[str, int, str | None]  # (limit, priority, key): asks that are served alike

RESERVE_MS = 10_000  # a permit reserved for a shard and never taken goes back after this


class DefinitionsFile:
    """The definitions of a data directory's server: `limits.json`, rewritten whole."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / FILE

    def load(self) -> bytes | None:
        return self.path.read_bytes() if self.path.exists() else None

    def save(self, data: bytes) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a power cut
        finally:
            os.close(fd)


class ServerLimits:
    def __init__(self, definitions: Definitions) -> None:
        self.definitions = definitions
        self.clock = SystemClock()
        self.limiter = Limiter(self.clock)
        self.defs: dict[str, dict[str, Any]] = {}
        self.waiting: dict[Ticket, Ask] = {}  # asks of connected workers
        self.held: dict[Ticket, tuple[Permit, Ask]] = {}
        self.expires: dict[Ticket, int] = {}  # ms on the server's clock
        self.parked: dict[int, list[Ask]] = {}  # by shard: asks its last holder left waiting
        self.reserved: dict[int, list[Reservation]] = {}  # by shard: permits kept for it
        self.held_since: dict[int, int] = {}  # by shard: when its holder took it (ms)
        # By limit: withdrawn asks still in its queue (taken out when their turn comes),
        # which `usage` does not count as waiting.
        self.withdrawn: Counter[str] = Counter()
        # Called when a permit is reserved for a shard (the server makes it due).
        self.wake: Callable[[int], None] = lambda _shard: None
        saved = definitions.load()
        if saved is not None:
            self.defs = {d["name"]: d for d in json.loads(saved)}
            wait_out = self.clock.now_ms() + m.PERMIT_LEASE_MS
            for spec in self.defs.values():
                limit = self.limiter.get(spec["name"])
                limit.define(spec["concurrent"], spec["per_second"])
                limit.not_before_ms = wait_out

    # -- definitions, through CALL ----------------------------------------------------------

    def call(self, call: m.Call) -> m.Answer | Awaitable[m.Answer]:
        """The answer, or (a definition saved to a database) an awaitable of it."""
        try:
            args = m.decode_value(call.args) if call.args else {}
            args = args if isinstance(args, dict) else {}
            if call.method == "limit":
                return self._define(call, args)
            value = self._call(call.method, args)
        except FuseeError as error:
            return m.Answer(call.rid, code=error.code, message=str(error))
        return m.Answer(call.rid, m.encode_value(value))

    def _define(self, call: m.Call, args: dict[str, Any]) -> m.Answer | Awaitable[m.Answer]:
        spec = check_definition(args.get("name"), args.get("concurrent"), args.get("per_second"))  # type: ignore[arg-type]
        defs = {**self.defs, spec["name"]: spec}
        # Saved before it applies: what is enforced is what a restart reads.
        saving = self.definitions.save(json.dumps(list(defs.values()), sort_keys=True).encode())

        def apply() -> m.Answer:
            self.defs = defs
            self.limiter.get(spec["name"]).define(spec["concurrent"], spec["per_second"])
            return m.Answer(call.rid, m.encode_value(None))

        if saving is None:
            return apply()

        async def saved() -> m.Answer:
            try:
                await saving
            except FuseeError as error:
                return m.Answer(call.rid, code=error.code, message=str(error))
            return apply()

        return saved()

    def _call(self, method: str, args: dict[str, Any]) -> Any:
        if method == "limits":
            return [{**d, **self.usage(d["name"])} for _, d in sorted(self.defs.items())]
        return self.usage(str(args.get("name")))

    def usage(self, name: str) -> dict[str, int]:
        limit = self.limiter.limits.get(name)
        if limit is None:
            return {"in_use": 0, "waiting": 0}
        return {"in_use": limit.in_use, "waiting": limit.queue.count - self.withdrawn[name]}

    # -- permits, from workers ---------------------------------------------------------------

    def ask(self, conn: ServerConnection, message: m.PermitAsk) -> None:
        ticket = (conn, message.ticket)
        ask = Ask(conn, message)
        if ask.shard not in conn.held:
            ask.shard = -1  # only a shard its worker holds has its waits kept (and woken)
        if ask.shard >= 0:
            reservation = _take(self.reserved, ask.shard, ask.kind)
            if reservation is not None:
                self._hand(ask, reservation.permit)
                return
            parked = _take(self.parked, ask.shard, ask.kind)
            if parked is not None:  # the same step (or one like it) asking again: its place
                parked.conn, parked.ticket = conn, message.ticket
                self.waiting[ticket] = parked
                return
        self.waiting[ticket] = ask
        self.limiter.get(ask.name).acquire(
            lambda permit: self._granted(ask, permit), ask.priority, ask.key, max(1, message.weight)
        )

    def _granted(self, ask: Ask, permit: Any) -> bool:
        """The queue's turn came for `ask`: to its worker, or kept for its shard."""
        if ask.withdrawn:
            self.withdrawn[ask.name] -= 1
            return False
        conn = ask.conn
        if conn is not None:
            self.waiting.pop((conn, ask.ticket), None)
            if not conn.closed:
                self._hand(ask, permit)
                return True
        elif ask in self.parked.get(ask.shard, ()):
            self.parked[ask.shard].remove(ask)
        if ask.shard < 0:
            return False  # its worker left, and no shard to keep it for
        self._reserve(ask, permit)
        return True

    def _hand(self, ask: Ask, permit: Any) -> None:
        assert ask.conn is not None
        ticket = (ask.conn, ask.ticket)
        self.held[ticket] = (permit, ask)
        self.expires[ticket] = self.clock.now_ms() + m.PERMIT_LEASE_MS
        ask.conn.send(m.PermitGrant([ask.ticket]))

    def _reserve(self, ask: Ask, permit: Permit) -> None:
        """Keep `permit` for `ask`'s shard: its next holder's step takes it."""
        self.reserved.setdefault(ask.shard, []).append(Reservation(permit, ask, self.clock.now_ms()))
        self.wake(ask.shard)

    def returned(self, conn: ServerConnection, message: m.PermitReturn) -> None:
        for number in message.tickets:
            ticket = (conn, number)
            waiting = self.waiting.pop(ticket, None)
            if waiting is not None:
                self._withdraw(waiting)
            held = self.held.pop(ticket, None)
            self.expires.pop(ticket, None)
            if held is None:
                continue
            permit, ask = held
            if message.unused and ask.shard >= 0:
                # Granted as its worker let the shard go: unused, kept for the shard.
                self._reserve(ask, permit)
            else:
                permit.release()

    def renew(self, conn: ServerConnection, message: m.PermitRenew) -> None:
        until = self.clock.now_ms() + m.PERMIT_LEASE_MS
        for number in message.tickets:
            if (conn, number) in self.expires:
                self.expires[(conn, number)] = until

    def held_by(self, shard: int) -> None:
        """`shard` has a new holder."""
        self.held_since[shard] = self.clock.now_ms()

    def released(self, conn: ServerConnection, shard: int) -> None:
        """`conn` lets `shard` go (a release, or its connection closed): its steps' waits
        stay in the queue, kept for the shard. A permit reserved for the shard before
        `conn` took it was its to take (its steps asked again as it recovered): one it
        did not take is not wanted, and goes back. One reserved since is the next
        holder's: the shard is due for it."""
        for ticket, ask in [(t, a) for t, a in self.waiting.items() if t[0] is conn and a.shard == shard]:
            del self.waiting[ticket]
            ask.conn = None
            self.parked.setdefault(shard, []).append(ask)
        since = self.held_since.pop(shard, 0)
        reservations = self.reserved.pop(shard, [])
        kept = [r for r in reservations if r.made_ms >= since]
        for reservation in reservations:
            if reservation.made_ms < since:
                reservation.permit.release()
        if kept:
            self.reserved[shard] = kept
            self.wake(shard)

    def lost(self, conn: ServerConnection) -> None:
        """Its waits for shards are kept for them (`released` parked those of the shards
        it held); the others go. The permits it holds stay until their leases lapse."""
        for ticket, ask in [(t, a) for t, a in self.waiting.items() if t[0] is conn]:
            del self.waiting[ticket]
            if ask.shard >= 0:
                ask.conn = None
                self.parked.setdefault(ask.shard, []).append(ask)
            else:
                self._withdraw(ask)

    def _withdraw(self, ask: Ask) -> None:
        """Its queue entry grants nothing when its turn comes."""
        if not ask.withdrawn:
            ask.withdrawn = True
            self.withdrawn[ask.name] += 1

    def expire(self) -> None:
        now = self.clock.now_ms()
        for ticket in [t for t, until in self.expires.items() if until <= now]:
            name = self.held[ticket][1].name
            logger.warning(
                "limit '%s': a permit of %s lapsed (not renewed); it is granted again", name, ticket[0]
            )
            self.expires.pop(ticket, None)
            self.held.pop(ticket)[0].release()
        for shard in [s for s, kept in self.reserved.items() if kept[0].made_ms + RESERVE_MS <= now]:
            kept = self.reserved.pop(shard)
            for reservation in kept:
                if reservation.made_ms + RESERVE_MS <= now:
                    reservation.permit.release()
                else:
                    self.reserved.setdefault(shard, []).append(reservation)


class Ask:
    """One step's wait: its worker's ticket while the worker holds the step's shard; no
    worker (`conn` None) while the shard's wait is kept for its next holder."""

    __slots__ = ("conn", "key", "name", "priority", "shard", "ticket", "withdrawn")

    def __init__(self, conn: ServerConnection, message: m.PermitAsk) -> None:
        self.conn: ServerConnection | None = conn
        self.ticket = message.ticket
        self.name = message.name
        self.priority = message.priority
        self.key = message.key
        self.shard = message.shard
        self.withdrawn = False

    @property
    def kind(self) -> Kind:
        return (self.name, self.priority, self.key)


class Reservation:
    """A permit granted to a shard's kept wait, for the shard's next holder."""

    __slots__ = ("ask", "made_ms", "permit")

    def __init__(self, permit: Permit, ask: Ask, made_ms: int) -> None:
        self.permit = permit
        self.ask = ask
        self.made_ms = made_ms


def _take(by_shard: dict[int, list[Any]], shard: int, kind: Kind) -> Any:
    """The first of `shard`'s asks or reservations of `kind`, taken out (None: none)."""
    items = by_shard.get(shard)
    if not items:
        return None
    for i, item in enumerate(items):
        if (item.ask if isinstance(item, Reservation) else item).kind == kind:
            del items[i]
            if not items:
                del by_shard[shard]
            return item
    return None
