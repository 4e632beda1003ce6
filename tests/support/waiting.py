"""`eventually`: the one way a test waits for a condition, instead of a sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(
    check: Callable[[], Any | Awaitable[Any]],
    timeout: float = 5.0,
    every: float = 0.001,
    why: Callable[[], str] | None = None,
) -> Any:
    """Retry `check` (sync or async) every `every` seconds until it returns a truthy value
    without raising; that value. After `timeout` (on the loop's clock), its last
    AssertionError, or one saying so (with `why()`, what was seen instead).

    `every` is 1 ms for in-process checks (they cost nothing); a check that asks a real
    process (a server's metrics) polls more slowly, 50 ms, so as not to load it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            error: BaseException | None = None
        except AssertionError as exc:
            error = exc
        if loop.time() > deadline:
            if error is not None:
                raise error
            seen = f": {why()}" if why is not None else ""
            raise AssertionError(f"condition never held within {timeout} s{seen}")
        await asyncio.sleep(every)


def done_at(future: asyncio.Future[Any]) -> list[float]:
    """A list that gets the monotonic time `future` finished (its done callback appends it):
    `assert done_at(...)[0] >= released` says it finished only after the release, which a
    look at `done()` after a sleep cannot say (a slow loop had not got there yet)."""
    at: list[float] = []
    future.add_done_callback(lambda _: at.append(time.monotonic()))
    return at
