"""One process's permits: every shard of an engine shares one counting semaphore and one
rate bucket per limit name (docs/limits.md). Grants are made on the engine's clock, so the
test kit's virtual clock drives the rate exactly as real time does."""

from __future__ import annotations

import logging
import math
from typing import Any

from fusee._clock import Clock, Handle
from fusee.engine.limits.queue import Grant, WaitQueue

log = logging.getLogger("fusee.limits")


class Permit:
    """One held permit; `release` returns it (once: a second call does nothing, so an
    attempt's several ends (outcome, cancelled task, discarded result) never return two)."""

    __slots__ = ("_limit",)

    def __init__(self, limit: Limit) -> None:
        self._limit: Limit | None = limit

    def release(self) -> None:
        limit, self._limit = self._limit, None
        if limit is not None:
            limit.in_use -= 1
            limit.pump()


class Limit:
    """A limit's semaphore (`concurrent`), rate (`per_second`) and waiting queue. A limit
    the process has no definition for yet (a step reached it before `engine.limit()` or
    before the stored definition was read) queues its waiters and grants nothing."""

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self.clock = clock
        self.defined = False
        self.concurrent: int | None = None
        self.per_second: float | None = None
        self.in_use = 0
        self.queue = WaitQueue()
        # The rate: the earliest time (ms, fractional) the next permit may be granted.
        # Grants are spaced 1000/per_second apart, a bucket of one token: no burst above
        # the rate in any window, which is what a downstream API counting calls per second
        # (or per 100 ms) needs.
        self.next_ms = 0.0
        # Nothing is granted before this (ms): a restarted server waits out the leases it
        # may have granted before it stopped, which it no longer knows of.
        self.not_before_ms = 0
        self._timer: Handle | None = None
        # Set while granting: a permit released by a step that ran inside its grant (a
        # synchronous function) does not grant again from within, which would nest one
        # call per waiter (a thousand waiters, a RecursionError); the loop goes on instead.
        self._pumping = False

    def define(self, concurrent: int | None, per_second: float | None) -> None:
        self.defined = True
        self.concurrent = concurrent
        if per_second != self.per_second:
            self.per_second = per_second
            self.next_ms = 0.0  # a new rate counts from now
        self.pump()

    def acquire(self, grant: Grant, priority: int, key: str | None, weight: int) -> None:
        self.queue.push(grant, priority, key, weight)
        self.pump()

    def pump(self) -> None:
        """Grant permits to the waiters in order while the semaphore and rate allow.
        The rate applies to whoever is next: the others wait behind it."""
        if not self.defined or self._pumping:
            return
        self._pumping = True
        try:
            self._grant_all()
        finally:
            self._pumping = False

    def _grant_all(self) -> None:
        if self.not_before_ms and self.queue.count:
            if self.clock.now_ms() < self.not_before_ms:
                self._wake_at(self.not_before_ms)
                return
            self.not_before_ms = 0
        while self.queue.count and (self.concurrent is None or self.in_use < self.concurrent):
            if self.per_second is not None:
                now = self.clock.now_ms()
                if now < math.floor(self.next_ms):
                    self._wake_at(math.floor(self.next_ms))
                    return
                self.next_ms = max(float(now), self.next_ms) + 1000.0 / self.per_second
            grant = self.queue.pop()
            self.in_use += 1
            permit = Permit(self)
            try:
                taken = grant(permit)
            except Exception:  # one step's bookkeeping must not stop the others' grants
                log.exception("limit '%s': a grant failed; its permit goes back", self.name)
                taken = False
            if not taken:
                # Nobody wants it any more: back without spending the rate a second time.
                permit._limit = None
                self.in_use -= 1
                if self.per_second is not None:
                    self.next_ms -= 1000.0 / self.per_second

    def _wake_at(self, due_ms: int) -> None:
        if self._timer is not None:
            return
        self._timer = self.clock.call_at(due_ms, self._woken)

    def _woken(self) -> None:
        self._timer = None
        self.pump()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def usage(self) -> dict[str, Any]:
        return {"in_use": self.in_use, "waiting": self.queue.count}


class Limiter:
    """Every limit of one process, by name."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.limits: dict[str, Limit] = {}

    def get(self, name: str) -> Limit:
        limit = self.limits.get(name)
        if limit is None:
            limit = self.limits[name] = Limit(name, self.clock)
        return limit

    def close(self) -> None:
        for limit in self.limits.values():
            limit.close()
