"""A shard's timers: one heap of loaded runs' timers (sleeps, waits' timeouts, step
retries, deadlines) and the shard's sweep, plus the run index's due buckets for parked
runs, behind one clock callback armed for the earliest of them.

A run that leaves memory leaves its heap entries behind as stale (checked when they
come due, or dropped when they reach the top as the next due time is asked for); the heap
is rebuilt once stale entries are the majority. The sweep's entries have a heap of their
own, so the earliest live run timer is the top of `heap` once its stale top is dropped
(idleness asks for it at every change of an invoked shard).
"""

from __future__ import annotations

import heapq
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from fusee._clock import Clock
from fusee.engine.index import RunIndex

if TYPE_CHECKING:
    from fusee.engine.run import RunState

TICK = -4  # a heap entry's position for the shard's sweep (parking, resends, checkpoints)

Entry = tuple[int, int, str, int, int]  # due, order, workflow ID, run, position


class TimerHost(Protocol):
    """What the timers need of their shard: its clock, its loaded runs and index to check
    an entry against, and what to call when one comes due."""

    @property
    def clock(self) -> Clock: ...
    @property
    def closed(self) -> bool: ...
    @property
    def runs(self) -> dict[str, RunState]: ...
    @property
    def index_entries(self) -> RunIndex: ...
    def now_ms(self) -> int: ...
    def poke(self) -> None: ...
    def sweep(self, now: int) -> None: ...
    def timer_due(self, run: RunState, seq: int) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    async def wake(self, keys: list[int]) -> None: ...


class Timers:
    def __init__(self, shard: TimerHost) -> None:
        self.shard = shard
        self.heap: list[Entry] = []
        self.ticks: list[Entry] = []  # the sweep's (seq TICK)
        self.count = 0
        self.stale = 0
        self.armed_at = 0
        self.handle: Any = None

    def add(self, due: int, run: RunState | None, seq: int) -> None:
        self.count += 1
        wid, run_no = (run.wid, run.run_no) if run is not None else ("", 0)
        heapq.heappush(self.ticks if seq == TICK else self.heap, (due, self.count, wid, run_no, seq))
        self.arm_for(due)

    def arm_for(self, due: int) -> None:
        if self.handle is None or due < self.armed_at:
            self.arm(due)

    def arm(self, due: int) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed_at = due
        self.handle = self.shard.clock.call_at(due, self.fire)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def fire(self) -> None:
        self.handle = None
        shard = self.shard
        if shard.closed:
            return
        shard.poke()
        now = shard.now_ms()
        heap, ticks = self.heap, self.ticks
        while True:
            # Both heaps' due entries in (due, order) order, as one heap would give them.
            if heap and heap[0][0] <= now and not (ticks and ticks[0] < heap[0]):
                due, _, wid, run_no, seq = heapq.heappop(heap)
                run = shard.runs.get(wid)
                if run is not None and run.run_no == run_no and run.timers.get(seq) == due:
                    shard.timer_due(run, seq)
            elif ticks and ticks[0][0] <= now:
                heapq.heappop(ticks)
                shard.sweep(now)
            else:
                break
        due_keys = shard.index_entries.take_due(now)
        if due_keys:
            shard.spawn(shard.wake(due_keys))
        firsts = (heap[0][0] if heap else 0, ticks[0][0] if ticks else 0, shard.index_entries.next_load_ms())
        nexts = [d for d in firsts if d]
        if nexts:
            self.arm(min(nexts))

    def next_due_ms(self) -> int:
        """The earliest live timer of a loaded run (0: none). A stale entry on top is
        dropped: it can never be live again (a run that comes back into memory, or a
        timer set anew, adds entries of its own)."""
        heap = self.heap
        while heap and not self.valid(heap[0]):
            heapq.heappop(heap)
            self.stale = max(0, self.stale - 1)
        return heap[0][0] if heap else 0

    def valid(self, entry: Entry) -> bool:
        due, _, wid, run_no, seq = entry
        run = self.shard.runs.get(wid)
        return run is not None and run.run_no == run_no and run.timers.get(seq) == due

    def forget(self, run: RunState) -> None:
        """A run left memory: its entries are stale. Rebuild the heap once they are the
        majority, so a parked run keeps nothing here."""
        self.stale += len(run.timers) + 1
        if self.stale > 256 and self.stale * 2 > len(self.heap):
            # In place: `fire` may be iterating this very list.
            self.heap[:] = [t for t in self.heap if self.valid(t)]
            heapq.heapify(self.heap)
            self.stale = 0
