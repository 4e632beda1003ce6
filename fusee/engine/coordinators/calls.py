"""How the coordinators are reached: `send` (update-with-start, sent again while the
coordinator it reaches is ending) and `wait_started` (`run.started()`). Used by the
engine's and the client's calls alike."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fusee._errors import NotFoundError, RejectedError
from fusee.engine.schedules.flow import Starter

# Sends to one key before giving up: each retry follows a coordinator that ended as the
# event reached it, and the next one is started by the retry itself.
ATTEMPTS = 20


async def send(
    target: Any,
    kind: str,
    cid: str,
    state: dict[str, Any],
    update: str,
    arg: Any,
    *,
    update_id: str | None = None,
    accepted: bool = False,
) -> Any:
    """Update-with-start on coordinator (or object key) `cid`, sent again while the run it
    reaches is ending; the update's result (None with `accepted`: once it is accepted)."""
    # One update ID for every send: a send whose reply was lost, sent again to the same
    # coordinator run, gets the recorded receipt instead of adding the event twice.
    update_id = update_id or uuid.uuid4().hex
    extra = {"accepted": True} if accepted else {}
    for attempt in range(ATTEMPTS):
        try:
            _, receipt = await target.update_with_start(
                kind, cid, state, update, arg, update_id=update_id, **extra
            )
        except (RejectedError, NotFoundError) as error:
            # The coordinator ended as the event reached it: refused before its handler
            # ran, so the event is in no window; the next send starts the key's next
            # coordinator.
            if attempt + 1 == ATTEMPTS or not _ended(error):
                raise
            continue
        return receipt
    raise AssertionError("unreachable")


class Reaching:
    """What reaches a run on any shard for an engine or a client (`target`): the
    coordinators' and the objects' calls. A key's run may be on a shard another worker
    holds: an engine on a worker of a server reaches it through a client of that server,
    as a schedule's steps reach their runs (an engine alone, or a client, calls it itself)."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self._reach = Starter(target) if hasattr(target, "storage") else None

    async def via(self) -> Any:
        """The engine or client that reaches a run on any shard."""
        if self._reach is None:
            return self._target
        await self._reach.route()
        return self._reach.target

    async def close(self) -> None:
        if self._reach is not None:
            await self._reach.close()


def _ended(error: Exception) -> bool:
    text = str(error)
    return "ended before the update finished" in text or "no running workflow" in text


async def wait_started(run: Any) -> Any:
    """`run.started()` of an engine's run and a client's: the run's summary once it
    exists. A debounced or batched run exists only once its window closes; nothing tells
    a caller when, so it looks again, backing off to a second."""
    pause = 0.01
    while True:
        try:
            return await run.status()
        except NotFoundError:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
