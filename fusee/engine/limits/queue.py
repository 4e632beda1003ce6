"""The queue of steps waiting for one limit's permit (docs/limits.md, *Who goes next*):
priority first (higher first, strict), then, within a priority, fairness keys taking
turns of up to their weight, then arrival within a key. Nothing here is journaled: a
waiting step holds no record, and after a crash its code asks again."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable

# A waiter's grant: called with the permit; False when the step no longer wants it (its
# run ended while it waited), so the permit goes to the next; None (falsy too) when its
# shard was let go of while it waited: in server mode the server keeps the permit for the
# shard's next holder (docs/limits.md, *A waiting step holds no invocation*).
Grant = Callable[["object"], "bool | None"]


class _Level:
    """One priority: the keys with waiters, in their turn order."""

    __slots__ = ("keys", "taken", "turns", "weights")

    def __init__(self) -> None:
        self.keys: dict[str | None, deque[Grant]] = {}
        self.weights: dict[str | None, int] = {}
        self.turns: deque[str | None] = deque()  # the key at the front has its turn
        self.taken = 0  # permits the front key took in its current turn

    def push(self, grant: Grant, key: str | None, weight: int) -> None:
        waiting = self.keys.get(key)
        if waiting is None:
            # A key joins (or rejoins, after it ran out of waiters) at the back.
            waiting = self.keys[key] = deque()
            self.turns.append(key)
        waiting.append(grant)
        self.weights[key] = weight  # the latest waiter of a key sets its weight

    def pop(self) -> Grant:
        key = self.turns[0]
        waiting = self.keys[key]
        grant = waiting.popleft()
        self.taken += 1
        if not waiting:
            del self.keys[key], self.weights[key]
            self.turns.popleft()
            self.taken = 0
        elif self.taken >= self.weights[key]:
            self.turns.rotate(-1)
            self.taken = 0
        return grant


class WaitQueue:
    """Every waiter of one limit, by priority level."""

    __slots__ = ("_levels", "_order", "count")

    def __init__(self) -> None:
        self._levels: dict[int, _Level] = {}
        self._order: list[int] = []  # the priorities with waiters, ascending
        self.count = 0

    def push(self, grant: Grant, priority: int = 0, key: str | None = None, weight: int = 1) -> None:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _Level()
            bisect.insort(self._order, priority)
        level.push(grant, key, weight)
        self.count += 1

    def pop(self) -> Grant:
        """The next waiter (the queue must not be empty)."""
        priority = self._order[-1]
        level = self._levels[priority]
        grant = level.pop()
        if not level.turns:
            del self._levels[priority]
            self._order.pop()
        self.count -= 1
        return grant
