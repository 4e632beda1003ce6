"""Step heartbeats: `s.heartbeat(progress)`, `s.progress()` and `heartbeat_timeout`.

A heartbeat never waits for the disk. The latest progress goes on the step's op at once
(a retry in this process reads it), and into the journal as a `Heartbeat` record that
names the step's position, coalesced: while one heartbeat record of a step is on its way
to the disk, newer ones only replace the progress, which is appended when that one is
durable. So a step beating in a tight loop writes one record per flush, not one per
beat, and a flush is never asked for more often than the shard flushes anyway. After a
crash, or at the next holder after a handback, replay applies the records and
`s.progress()` returns the last durable progress.

`heartbeat_timeout` is a watchdog on the loop's clock for each attempt: an attempt
silent that long fails with TimeoutError (retried under its policy), as an attempt's
`timeout` does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Protocol

from fusee import journal as R
from fusee.engine.durability import Durability
from fusee.engine.run import RunState
from fusee.engine.streams import StepStreamWriter
from fusee.workflow.ctx import StepContext
from fusee.workflow.ops import StepOp, StepState


class BeatHost(Protocol):
    @property
    def closed(self) -> bool: ...
    @property
    def durability(self) -> Durability: ...

    heartbeats: int


class Beats:
    """One attempt's heartbeats: what its `StepContext` calls (`fusee.workflow.ctx.StepBeats`)."""

    __slots__ = (
        "_loop",
        "_thread",
        "context",
        "last",
        "latest",
        "lsn",
        "op",
        "pending",
        "run",
        "shard",
        "watchdog",
    )

    def __init__(self, shard: BeatHost, run: RunState, op: StepOp) -> None:
        self.shard = shard
        self.run = run
        self.op = op
        self.context: StepContext | None = None  # the attempt's: an older attempt's beats are dropped
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self.latest: bytes | None = None  # the newest progress of this attempt, any thread
        self.last = self._loop.time()  # when the attempt last said it was alive
        self.lsn = 0  # the position of its last heartbeat record
        self.pending = False  # a newer progress waits to be recorded
        self.watchdog: asyncio.TimerHandle | None = None

    def beat(self, context: StepContext, progress: bytes) -> None:
        self.latest = progress
        if threading.get_ident() == self._thread:
            self._beat(context, progress)
        else:
            # A thread step: everything of the run is the loop's (a closed loop means the
            # engine is gone, and the beat with it).
            try:
                self._loop.call_soon_threadsafe(self._beat, context, progress)
            except RuntimeError:
                pass

    def progress(self) -> bytes | None:
        return self.latest if self.latest is not None else self.op.progress

    def stream(self, context: StepContext, name: str) -> StepStreamWriter:
        """`s.stream`: the attempt's writer of a stream of its step (fusee/engine/streams.py)."""
        return StepStreamWriter(self.run, self.op, context, name, self._loop, self._thread, self._progressed)

    def _progressed(self) -> None:
        self.shard.heartbeats += 1  # IDLE's progress count: a chunk, as a heartbeat

    def _current(self, context: StepContext | None) -> bool:
        op = self.op
        return (
            context is self.context
            and op.context is context
            and op.state is StepState.RUNNING
            and not op.done
            and not self.run.final
            and not self.shard.closed
        )

    def _beat(self, context: StepContext, progress: bytes) -> None:
        if not self._current(context):
            return  # a beat of an attempt that ended (timed out, cancelled, let go of)
        self.op.progress = progress
        self.last = self._loop.time()
        if self.pending:
            return
        self.pending = True
        durability = self.shard.durability
        if self.lsn > durability.durable:
            durability.when_durable(self.lsn, self._record)  # coalesced behind the one on its way
        else:
            self._loop.call_soon(self._record)  # the beats of this turn become one record

    def _record(self) -> None:
        self.pending = False
        op, run = self.op, self.run
        # Recorded even once the attempt ended unless the step did (a retry reads it);
        # never after the step's outcome, nor for a run let go of.
        if op.done or run.final or self.shard.closed or op.progress is None:
            return
        run.record(R.Heartbeat(op.seq, op.name, op.progress))
        self.lsn = run.last_lsn
        self.shard.heartbeats += 1

    # -- heartbeat_timeout --------------------------------------------------------------

    def arm(self, silent: Callable[[RunState, StepOp, int], None]) -> None:
        ms = self.op.heartbeat_ms
        if ms is None:
            return
        self.last = self._loop.time()
        self.watchdog = self._loop.call_later(ms / 1000, self._check, silent)

    def _check(self, silent: Callable[[RunState, StepOp, int], None]) -> None:
        self.watchdog = None
        op = self.op
        if op.beat is not self or op.state is not StepState.RUNNING or op.done or self.shard.closed:
            return
        ms = op.heartbeat_ms or 0
        left = self.last + ms / 1000 - self._loop.time()
        if left > 0:
            self.watchdog = self._loop.call_later(left, self._check, silent)
            return
        silent(self.run, op, ms)

    def end(self) -> None:
        """The attempt ended: no watchdog outlives it (its latest progress is still recorded)."""
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None


def attempt_beats(shard: BeatHost, run: RunState, op: StepOp) -> Beats:
    beats = Beats(shard, run, op)
    op.beat = beats
    return beats
