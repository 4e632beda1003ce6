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
        self.waiting: dict[int, Grant] = {}
        self.held: set[int] = set()
        self.renewer: asyncio.TimerHandle | None = None
        storage.permits = self

    async def call(self, method: str, args: dict[str, Any]) -> Any:
        answer = await self.storage.ask(m.Call(0, method, -1, m.encode_value(args)))
        if answer.code is not None:
            raise error_from(Failure(answer.message or answer.code, type=answer.code))
        return m.decode_value(answer.value) if answer.value else None

    def acquire(self, name: str, priority: int, key: str | None, weight: int, grant: Grant) -> None:
        ticket = next(self.tickets)
        self.waiting[ticket] = grant
        self.storage.send(m.PermitAsk(ticket, name, priority, key, weight))

    def granted(self, message: m.PermitGrant) -> None:
        for ticket in message.tickets:
            grant = self.waiting.pop(ticket, None)
            if grant is None:
                self.storage.send(m.PermitReturn([ticket]))
                continue
            self.held.add(ticket)
            if not grant(RemotePermit(self, ticket)):
                self.give_back(ticket)
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

    def lost(self) -> None:
        """The connection went: the server dropped this worker's waiting tickets (their
        steps' shards are lost with it too), and lets its permits lapse."""
        self.waiting.clear()
        self.held.clear()
        if self.renewer is not None:
            self.renewer.cancel()
            self.renewer = None
