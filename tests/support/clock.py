"""`run_on_virtual_time(main)`: `main` on an event loop whose clock moves only when nothing
is ready to run, straight to the next timer. Waits that the code measures on the loop's
clock (`asyncio.sleep`, `wait_for`, `loop.time()`) take no real time, and a test asserts
how long they lasted exactly, however loaded the machine. `LoopClock` is an engine clock
on the loop's, so a run's durable timers jump with it."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class LoopClock:
    """An engine's clock (`fusee._clock.Clock`) read from the running loop's: unix ms from
    `start_ms` at loop time 0. Rounded, not floored: a timer called at its due time reads
    its due time (a float a hair under it would make the engine arm it again)."""

    def __init__(self, start_ms: int = 1_767_225_600_000) -> None:  # 2026-01-01T00:00Z
        self.start_ms = start_ms

    def now_ms(self) -> int:
        return self.start_ms + round(asyncio.get_running_loop().time() * 1000)

    def call_at(self, due_ms: int, fn: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_at((due_ms - self.start_ms) / 1000, fn)


class _Selector(selectors.DefaultSelector):
    """A selector that, when no file is ready and the loop would sleep until a timer, moves
    the loop's clock to that timer instead (a loop with no timer waits for files as usual)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout is None or timeout <= 0:
            return ready if ready or timeout is not None else super().select(None)
        self.now += timeout
        return []


class _Loop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual = _Selector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


def run_on_virtual_time(main: Callable[[], Awaitable[T]]) -> T:
    with asyncio.Runner(loop_factory=_Loop) as runner:
        result: Any = runner.run(main())  # type: ignore[arg-type]
        return result  # type: ignore[no-any-return]
