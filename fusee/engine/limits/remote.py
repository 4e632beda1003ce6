"""A worker's side of the server's limits (docs/limits.md, *Server mode*): each waiting
step is a ticket at the server; granted permits are renewed every second while held, and
returned when the attempt ends. The queue and the bound are the server's."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from fusee._errors import Failure, error_from
from fusee.engine.limits.queue import Grant
from fusee.protocol import messages as m


class RemotePermit:
    __slots__ = ("_owner", "_ticket")

    def __init__(self, owner: RemotePermits, ticket: int) -> None:
        self._owner: RemotePermits | None = owner
        self._ticket = ticket

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.give_back(self._ticket)


class RemotePermits:
    def __init__(self, storage: Any) -> None:
        self.storage = storage
        # Unique in this process, across reconnections: a return or renewal of an old
        # connection's permit can never name a new connection's ticket.
        self.tickets = itertools.count(1)
        self.waiting: dict[int, tuple[Grant, int]] = {}  # ticket: (grant, shard)
        self.held: set[int] = set()
        self.renewer: asyncio.TimerHandle | None = None
        storage.permits = self

    async def call(self, method: str, args: dict[str, Any]) -> Any:
        answer = await self.storage.ask(m.Call(0, method, -1, m.encode_value(args)))
        if answer.code is not None:
            raise error_from(Failure(answer.message or answer.code, type=answer.code))
        return m.decode_value(answer.value) if answer.value else None

    def acquire(
        self, name: str, priority: int, key: str | None, weight: int, grant: Grant, shard: int = -1
    ) -> None:
        ticket = next(self.tickets)
        self.waiting[ticket] = (grant, shard)
        self.storage.send(m.PermitAsk(ticket, name, priority, key, weight, shard))

    def granted(self, message: m.PermitGrant) -> None:
        unused: list[int] = []
        for ticket in message.tickets:
            waiter = self.waiting.pop(ticket, None)
            if waiter is None:
                # Its shard was let go of (`forget`): the server keeps it for the shard.
                unused.append(ticket)
                continue
            self.held.add(ticket)
            taken = waiter[0](RemotePermit(self, ticket))
            if taken is None:
                self.held.discard(ticket)
                unused.append(ticket)
            elif not taken:
                self.give_back(ticket)
        if unused:
            self.storage.send(m.PermitReturn(unused, unused=True))
        if self.held and self.renewer is None:
            self.renewer = asyncio.get_running_loop().call_later(m.PERMIT_RENEW_MS / 1000, self._renew)

    def give_back(self, ticket: int) -> None:
        if ticket in self.held:
            self.held.discard(ticket)
            self.storage.send(m.PermitReturn([ticket]))

    def _renew(self) -> None:
        self.renewer = None
        if self.held:
            self.storage.send(m.PermitRenew(sorted(self.held)))
            self.renewer = asyncio.get_running_loop().call_later(m.PERMIT_RENEW_MS / 1000, self._renew)

    def forget(self, shard: int) -> None:
        """`shard` was let go of: the server keeps its steps' waits for its next holder
        (docs/limits.md, *A waiting step holds no invocation*); this process forgets them."""
        for ticket in [t for t, (_, s) in self.waiting.items() if s == shard]:
            del self.waiting[ticket]

    def lost(self) -> None:
        """The connection went, and its shards with it: the server keeps this worker's
        waiting tickets for their shards (whose next holders ask again), and lets its
        permits lapse."""
        self.waiting.clear()
        self.held.clear()
        if self.renewer is not None:
            self.renewer.cancel()
            self.renewer = None
