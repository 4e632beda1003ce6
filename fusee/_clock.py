"""Clocks: the system's, and the test kit's virtual one (one test engine at a time)."""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable
from typing import Protocol


class Handle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def call_at(self, due_ms: int, fn: Callable[[], None]) -> Handle: ...


class SystemClock:
    """Unix milliseconds; callbacks on the running event loop."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def call_at(self, due_ms: int, fn: Callable[[], None]) -> Handle:
        loop = asyncio.get_running_loop()
        # From the exact time, not the floored millisecond: that would fire up to 1 ms late.
        return loop.call_later(max(0.0, due_ms / 1000 - time.time()), fn)


class _VirtualHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Time that moves only when told: `advance` fires what falls due, in order."""

    def __init__(self, start_ms: int = 1_767_225_600_000) -> None:  # 2026-01-01T00:00Z
        self._now = start_ms
        self._timers: list[tuple[int, int, _VirtualHandle, Callable[[], None]]] = []
        self._count = 0

    def now_ms(self) -> int:
        return self._now

    def call_at(self, due_ms: int, fn: Callable[[], None]) -> Handle:
        handle = _VirtualHandle()
        self._count += 1
        heapq.heappush(self._timers, (due_ms, self._count, handle, fn))
        if due_ms <= self._now:
            asyncio.get_running_loop().call_soon(self._run_due)
        return handle

    def next_due_ms(self) -> int | None:
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _run_due(self) -> None:
        while self._timers and self._timers[0][0] <= self._now:
            _, _, handle, fn = heapq.heappop(self._timers)
            if not handle.cancelled:
                fn()

    def set(self, now_ms: int) -> None:
        """Move to `now_ms`, firing every callback due by then, in due order."""
        while True:
            due = self.next_due_ms()
            if due is None or due > now_ms:
                break
            self._now = max(self._now, due)
            self._run_due()
        self._now = max(self._now, now_ms)
