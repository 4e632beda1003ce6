"""The server's limits (docs/limits.md, *Server mode*): definitions persisted in the
directory (`limits.json`), permits granted to workers under leases, and every worker's
waiting steps in one queue, so the order (priority, fairness turns, arrival) is the same
whichever worker asks.

A permit's lease lapses PERMIT_LEASE_MS after the holder last renewed it. A worker whose
connection closes (it was SIGKILLed, its machine went away) keeps its permits until then:
its attempts may still be calling the limited service, and the bound counts them until
their lease says otherwise. A restarted server does not know which permits it granted
before, so it grants nothing for a lease's length after it starts."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from fusee._clock import SystemClock
from fusee._errors import FuseeError
from fusee.engine.limits.handle import check_definition
from fusee.engine.limits.local import Limiter, Permit
from fusee.protocol import messages as m
from fusee_server.listener import ServerConnection

logger = logging.getLogger("fusee.server")

FILE = "limits.json"

Ticket = tuple[ServerConnection, int]


class ServerLimits:
    def __init__(self, root: Path) -> None:
        self.path = Path(root) / FILE
        self.clock = SystemClock()
        self.limiter = Limiter(self.clock)
        self.defs: dict[str, dict[str, Any]] = {}
        self.waiting: set[Ticket] = set()
        self.held: dict[Ticket, tuple[Permit, str]] = {}
        self.expires: dict[Ticket, int] = {}  # ms on the server's clock
        if self.path.exists():
            self.defs = {d["name"]: d for d in json.loads(self.path.read_text())}
            wait_out = self.clock.now_ms() + m.PERMIT_LEASE_MS
            for spec in self.defs.values():
                limit = self.limiter.get(spec["name"])
                limit.define(spec["concurrent"], spec["per_second"])
                limit.not_before_ms = wait_out

    # -- definitions, through CALL ----------------------------------------------------------

    def call(self, call: m.Call) -> m.Answer:
        try:
            args = m.decode_value(call.args) if call.args else {}
            value = self._call(call.method, args if isinstance(args, dict) else {})
        except FuseeError as error:
            return m.Answer(call.rid, code=error.code, message=str(error))
        return m.Answer(call.rid, m.encode_value(value))

    def _call(self, method: str, args: dict[str, Any]) -> Any:
        if method == "limit":
            spec = check_definition(args.get("name"), args.get("concurrent"), args.get("per_second"))  # type: ignore[arg-type]
            self.defs[spec["name"]] = spec
            self._persist()  # before it applies: what is enforced is what a restart reads
            self.limiter.get(spec["name"]).define(spec["concurrent"], spec["per_second"])
            return None
        if method == "limits":
            return [{**d, **self.usage(d["name"])} for _, d in sorted(self.defs.items())]
        return self.usage(str(args.get("name")))

    def usage(self, name: str) -> dict[str, int]:
        limit = self.limiter.limits.get(name)
        return limit.usage() if limit is not None else {"in_use": 0, "waiting": 0}

    def _persist(self) -> None:
        data = json.dumps(list(self.defs.values()), sort_keys=True).encode()
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

    # -- permits, from workers ---------------------------------------------------------------

    def ask(self, conn: ServerConnection, ask: m.PermitAsk) -> None:
        ticket = (conn, ask.ticket)
        self.waiting.add(ticket)

        def grant(permit: Any) -> bool:
            if ticket not in self.waiting or conn.closed:
                return False  # withdrawn, or its worker left while it waited
            self.waiting.discard(ticket)
            self.held[ticket] = (permit, ask.name)
            self.expires[ticket] = self.clock.now_ms() + m.PERMIT_LEASE_MS
            conn.send(m.PermitGrant([ask.ticket]))
            return True

        self.limiter.get(ask.name).acquire(grant, ask.priority, ask.key, max(1, ask.weight))

    def returned(self, conn: ServerConnection, message: m.PermitReturn) -> None:
        for number in message.tickets:
            ticket = (conn, number)
            self.waiting.discard(ticket)
            self._release(ticket)

    def renew(self, conn: ServerConnection, message: m.PermitRenew) -> None:
        until = self.clock.now_ms() + m.PERMIT_LEASE_MS
        for number in message.tickets:
            if (conn, number) in self.expires:
                self.expires[(conn, number)] = until

    def lost(self, conn: ServerConnection) -> None:
        """Its waiting tickets go; the permits it holds stay until their leases lapse."""
        self.waiting = {t for t in self.waiting if t[0] is not conn}

    def expire(self) -> None:
        now = self.clock.now_ms()
        for ticket in [t for t, until in self.expires.items() if until <= now]:
            name = self.held[ticket][1]
            logger.warning(
                "limit '%s': a permit of %s lapsed (not renewed); it is granted again", name, ticket[0]
            )
            self._release(ticket)

    def _release(self, ticket: Ticket) -> None:
        held = self.held.pop(ticket, None)
        self.expires.pop(ticket, None)
        if held is not None:
            held[0].release()
