"""An ASGI request's body, read under a deadline and a cap (docs/invoke.md, *Slow and
cut-short bodies*).

The handler is reachable by anyone who finds its URL, and the signature can only be
checked once the whole body is in. Without bounds, a peer that sends a body byte by byte
(or never) keeps the request, its connection and, on Cloud Run, a billed instance busy
for as long as it likes. So:

- the whole body must arrive within `timeout_s` of the request's headers (408 after it,
  however many bytes are trickling in: the deadline is for the body, not for each read);
- at most `waits_max` requests wait for their body at once on one event loop; when one
  more has to wait, the one that has waited longest is answered 503. A body the server
  sends arrives in milliseconds, so the requests that are cut are the ones that are
  being held open, not the server's;
- a body cut short by a disconnect (Content-Length not reached) is never taken for the
  whole: the request is dropped, nothing is checked or connected to.
"""

from __future__ import annotations

import asyncio
import enum
import weakref
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fusee.invoke import _request as request_

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

BODY_TIMEOUT_S = 10.0  # far above what a body of a few hundred bytes takes on any network
BODY_WAITS_MAX = 16  # the server's default --invoke-concurrency, all on one process


class Refused(enum.Enum):
    """Why a body was not read whole; each value is its HTTP status (0: no answer)."""

    CUT = 0
    """The peer disconnected before the body was whole: dropped, nobody to answer."""
    TOO_LARGE = 413
    """Over request_.BODY_BYTES_MAX, declared or received: not read further."""
    LATE = 408
    """Not whole within the deadline."""
    CROWDED = 503
    """Made room for a newer request while `waits_max` were waiting."""


class _Wait:
    """One request waiting for its body: its deadline, which the cap may bring forward."""

    __slots__ = ("crowded", "deadline")

    def __init__(self) -> None:
        self.deadline: asyncio.Timeout | None = None
        self.crowded = False

    def crowd_out(self, loop: asyncio.AbstractEventLoop) -> None:
        self.crowded = True
        if self.deadline is not None:
            self.deadline.reschedule(loop.time())  # its read ends at its next await


class Bodies:
    """The bodies being waited for, per event loop (a deadline can only be moved from its
    own loop's thread; an ASGI server runs one loop, the Lambda adapter one per thread)."""

    def __init__(self, timeout_s: float = BODY_TIMEOUT_S, waits_max: int = BODY_WAITS_MAX) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"body_timeout_s: expected a number of seconds above 0, got {timeout_s!r}")
        if isinstance(waits_max, bool) or not isinstance(waits_max, int) or waits_max < 1:
            raise ValueError(f"body_waits_max: expected a whole number from 1, got {waits_max!r}")
        self.timeout_s = float(timeout_s)
        self.waits_max = waits_max
        # Insertion order is waiting order: the first is the one that has waited longest.
        self._waiting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Wait, None]] = (
            weakref.WeakKeyDictionary()
        )

    async def read(self, receive: Receive) -> bytes | Refused:
        loop = asyncio.get_running_loop()
        waiting = self._waiting.setdefault(loop, {})
        wait = _Wait()
        try:
            async with asyncio.timeout(self.timeout_s) as wait.deadline:
                if len(waiting) >= self.waits_max:
                    oldest = next(iter(waiting))
                    del waiting[oldest]
                    oldest.crowd_out(loop)
                waiting[wait] = None
                try:
                    return await _receive(receive)
                finally:
                    waiting.pop(wait, None)
        except TimeoutError:
            return Refused.CROWDED if wait.crowded else Refused.LATE


async def _receive(receive: Receive) -> bytes | Refused:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            # Before `more_body` said the body was complete: what came is a prefix of it.
            return Refused.CUT
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > request_.BODY_BYTES_MAX:
            return Refused.TOO_LARGE
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
