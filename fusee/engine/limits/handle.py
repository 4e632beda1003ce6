"""What `engine.limit()`, `engine.limits()` and `engine.limit_usage()` do, and where a
limit's definition is kept: the run `fusee.limit/NAME` of a small built-in workflow, whose
input (carried on through `continue_as_new`) is the definition. So a definition is made of
the journal's existing records, survives a crash and a reopen like any run, and needs no
store of its own; the permits and the waiting queue are memory (docs/limits.md)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from fusee import _names as names
from fusee._errors import FuseeError, NotFoundError, RejectedError
from fusee.engine.limits.local import Limit, Limiter
from fusee.engine.limits.queue import Grant
from fusee.journal import FINAL
from fusee.storage import Durability
from fusee.workflow.definitions import Workflow

if TYPE_CHECKING:
    from fusee.workflow.ctx import Ctx

log = logging.getLogger("fusee.limits")

TYPE = "fusee.limit"
PREFIX = TYPE + "/"
SET_SIGNAL = "fusee.limit.set"
DESCRIBE = "describe"
SETS_PER_RUN = 50  # redefinitions before the run continues as new, keeping its journal short


def limit_id(name: str) -> str:
    return PREFIX + name


async def _definition(ctx: Ctx, spec: dict[str, Any]) -> None:
    """Holds a limit's definition: waits for new ones, answers what it holds."""
    ctx.on_query(DESCRIBE, lambda _arg: spec)
    for _ in range(SETS_PER_RUN):
        new = await ctx.wait_for(SET_SIGNAL)
        spec.clear()
        spec.update(new)
    ctx.continue_as_new(spec)


WORKFLOW: Workflow[Any] = Workflow(_definition, TYPE, input=dict[str, Any])


def check_definition(name: str, concurrent: Any, per_second: Any) -> dict[str, Any]:
    names.name(name, "limit name")
    if concurrent is not None and (type(concurrent) is not int or concurrent < 1):
        raise RejectedError(f"limit '{name}': concurrent={concurrent!r}: expected a positive int (or None)")
    if per_second is not None and (type(per_second) not in (int, float) or not 0 < per_second < float("inf")):
        raise RejectedError(
            f"limit '{name}': per_second={per_second!r}: expected a positive number (or None)"
        )
    if concurrent is None and per_second is None:
        raise RejectedError(f"limit '{name}': give concurrent=, per_second= or both")
    return {"name": name, "concurrent": concurrent, "per_second": per_second}


class Limits:
    """An engine's limits: definitions (stored as runs), permits (this process's)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.limiter = Limiter(engine.clock)
        self._loading: set[asyncio.Task[None]] = set()
        # Server mode: the server holds definitions, permits and the queue, for every
        # worker (remote.py); the wire code is loaded only then.
        self._remote: Any = None
        if getattr(engine.storage, "durability", None) is Durability.SERVER:
            from fusee.engine.limits.remote import RemotePermits

            self._remote = RemotePermits(engine.storage)

    async def limit(
        self, name: str, *, concurrent: int | None = None, per_second: float | None = None
    ) -> None:
        """`engine.limit()`: define (or change) limit `name`: at most `concurrent` attempts
        inside at once, at most `per_second` begun per second. Stored, so a reopen keeps it."""
        spec = check_definition(name, concurrent, per_second)
        if self._remote is not None:
            await self._remote.call("limit", spec)
            return
        # One call that makes the definition's run or hands the running one the new
        # definition: two processes defining the same limit get one run.
        await self._engine.signal_with_start(TYPE, limit_id(name), spec, SET_SIGNAL, spec)
        # Applied once stored: what this process enforces is what a reopen reads back.
        self.limiter.get(name).define(concurrent, per_second)

    async def limits(self) -> list[dict[str, Any]]:
        """`engine.limits()`: every stored definition, with its usage (this process's;
        in server mode, the server's: every worker's)."""
        if self._remote is not None:
            listed: list[dict[str, Any]] = await self._remote.call("limits", {})
            return listed
        out = []
        async for row in self._engine.list(type=TYPE):
            if row.status in FINAL or not row.id.startswith(PREFIX):
                continue
            try:
                spec = await self._engine.run(row.id).query(DESCRIBE)
            except NotFoundError:
                continue
            out.append({**spec, **self.usage(spec["name"])})
        return sorted(out, key=lambda d: d["name"])

    async def limit_usage(self, name: str) -> dict[str, int]:
        """`engine.limit_usage()`: `in_use` (permits held) and `waiting` (steps queued)."""
        if self._remote is not None:
            used: dict[str, int] = await self._remote.call(
                "limit_usage", {"name": names.name(name, "limit name")}
            )
            return used
        return self.usage(name)

    def usage(self, name: str) -> dict[str, int]:
        names.name(name, "limit name")
        limit = self.limiter.limits.get(name)
        return limit.usage() if limit is not None else {"in_use": 0, "waiting": 0}

    @property
    def remote(self) -> bool:
        """The server holds the permits and the queue (server mode)."""
        return self._remote is not None

    def acquire(
        self, name: str, priority: int, key: str | None, weight: int, grant: Grant, shard: int = -1
    ) -> None:
        """Queue a step of `shard` for a permit of `name`; `grant(permit)` when its turn
        comes."""
        if self._remote is not None:
            self._remote.acquire(name, priority, key, weight, grant, shard)
            return
        limit = self.limiter.limits.get(name)
        if limit is None:
            limit = self.limiter.get(name)
            # First asked since the engine opened (a reopen): read the stored definition.
            task = asyncio.ensure_future(self._load(limit))
            self._loading.add(task)
            task.add_done_callback(self._loading.discard)
        limit.acquire(grant, priority, key, weight)

    async def _load(self, limit: Limit) -> None:
        try:
            spec = await self._engine.run(limit_id(limit.name)).query(DESCRIBE)
        except NotFoundError:
            log.warning(
                "limit '%s' is not defined: its steps wait until engine.limit('%s', ...) is called",
                limit.name,
                limit.name,
            )
            return
        except FuseeError as error:
            log.warning(
                "limit '%s': its definition could not be read (%s); its steps wait", limit.name, error
            )
            return
        if not limit.defined:  # else `engine.limit()` defined it meanwhile: that one is newer
            limit.define(spec["concurrent"], spec["per_second"])

    def close(self) -> None:
        for task in self._loading:
            task.cancel()
        self.limiter.close()
