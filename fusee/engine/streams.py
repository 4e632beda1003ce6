"""Streams (docs/engine.md, *Streams*): chunks a run appends as it goes, read by others
only once durable.

A chunk is a journal record (`StreamChunk`) with no position: appending never waits for
the disk, and adding streaming to code shifts no journal. A stream opened in workflow
code (`ctx.stream`) belongs to the run: its appends on replay are matched, in order, to
the ones it recorded, and only those beyond are recorded; `close()` or the run's end
completes it. One opened in a step's function (`s.stream`) belongs to that step: the
step's result completes it (a `StreamEnd` just before the result's record), and a step
that runs again gets what its earlier attempts recorded from `recorded()`, so it can
continue after it rather than start over.

Readers (fusee/engine/stream_reads.py) follow `StreamState`: the chunks, the position
each was appended at (0: durable already, read back from the journal), and the end.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Protocol

from fusee import _codec as codec
from fusee import journal as R
from fusee._errors import RejectedError
from fusee.workflow.ops import StepOp, StepState

RUN = -1  # the owner of a stream the run's code opened


class StreamRun(Protocol):
    """What streams read and change of a run (`fusee/engine/run.py`'s `RunState`): its
    streams, and, while it replays, what its journal recorded of them (read before the
    code runs, as patches are) and what its code wrote past that (recorded at go-live)."""

    wid: str
    streams: dict[str, StreamState]
    streams_recorded: dict[str, int]
    streams_closed: set[str]
    streams_due: list[R.Rec]
    replaying: bool
    final: bool
    last_lsn: int

    def record(self, rec: R.Rec) -> None: ...


class StreamState:
    """One stream of a loaded run: what its readers follow."""

    __slots__ = ("chunks", "end", "end_lsn", "lsns", "owner", "steps", "waiting")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.lsns: list[int] = []  # the position each chunk was appended at (0: durable)
        self.steps: list[int] = []  # who appended each: a step's position, or RUN
        self.owner: int | None = None  # who opened it: a step's position, or RUN
        self.end: R.StreamEnd | None = None
        self.end_lsn = 0
        self.waiting: asyncio.Event | None = None  # readers waiting for more

    def add(self, rec: R.StreamChunk, lsn: int) -> None:
        self.chunks.append(rec.value)
        self.lsns.append(lsn)
        self.steps.append(rec.step)
        if self.owner is None:
            self.owner = rec.step
        self._wake()

    def ended(self, rec: R.StreamEnd, lsn: int) -> None:
        self.end = rec
        self.end_lsn = lsn
        self._wake()

    def _wake(self) -> None:
        if self.waiting is not None:
            self.waiting.set()
            self.waiting = None


def _name(name: Any) -> str:
    if type(name) is not str or not name or len(name.encode()) > 256:
        raise RejectedError(f"stream name {name!r}: a non-empty string of at most 256 bytes")
    return name


# -- applied from the journal (replay, recovery, a load) ------------------------------------


class HasStreams(Protocol):
    streams: dict[str, StreamState]


def _state(run: HasStreams, name: str) -> StreamState:
    state = run.streams.get(name)
    if state is None:
        state = run.streams[name] = StreamState()
    return state


def chunk_applied(run: HasStreams, rec: R.StreamChunk) -> None:
    _state(run, rec.stream).add(rec, 0)


def end_applied(run: HasStreams, rec: R.StreamEnd) -> None:
    _state(run, rec.stream).ended(rec, 0)


# -- writers ----------------------------------------------------------------------------------


class StreamWriter:
    """`ctx.stream(name)`: the run's own stream, written by its code (its steps may append
    to it too, `s.stream(name)`)."""

    __slots__ = ("_appended", "_run", "_state", "name")

    def __init__(self, run: StreamRun, name: str) -> None:
        self.name = _name(name)
        self._run = run
        self._state = state = _state(run, name)
        if state.owner is None:
            state.owner = RUN
        elif state.owner != RUN:
            raise RejectedError(
                f"stream '{name}' was opened by the step at position {state.owner}: only it writes it"
            )
        self._appended = 0  # this code's appends so far: matched on replay to those recorded

    @property
    def closed(self) -> bool:
        return self._state.end is not None

    def append(self, value: Any) -> None:
        """Record a chunk and return at once: readers get it once it is durable."""
        data = codec.encode(value, f"stream '{self.name}' chunk")
        run, state = self._run, self._state
        index = self._appended
        self._appended += 1
        if index < run.streams_recorded.get(self.name, 0):
            return  # in the journal already (this is a replay): not again
        if self.name in run.streams_closed or (state.end is not None and not run.replaying):
            raise RejectedError(f"stream '{self.name}' is complete: nothing more can be appended")
        if run.final:
            raise RejectedError(f"stream '{self.name}': the run has ended")
        rec = R.StreamChunk(self.name, RUN, data)
        if run.replaying:
            run.streams_due.append(rec)  # past what the crash kept: recorded at go-live
            return
        run.record(rec)
        state.add(rec, run.last_lsn)

    def close(self) -> None:
        """Complete the stream: readers end once they have every chunk."""
        run, state = self._run, self._state
        if self.name in run.streams_closed or state.end is not None or run.final:
            return
        rec = R.StreamEnd(self.name, "ok", True)
        if run.replaying:
            run.streams_due.append(rec)
            return
        run.record(rec)
        state.ended(rec, run.last_lsn)


class StepStreamWriter:
    """`s.stream(name)` inside a step's function: a stream of that step (or, if the run's
    code opened it, the run's). From a thread step too: appends go to the loop in order."""

    __slots__ = ("_context", "_counted", "_loop", "_op", "_run", "_state", "_thread", "name")

    def __init__(
        self,
        run: StreamRun,
        op: StepOp,
        context: Any,
        name: str,
        loop: asyncio.AbstractEventLoop,
        thread: int,
        counted: Any = None,
    ) -> None:
        self.name = _name(name)
        self._run = run
        self._op = op
        self._context = context
        self._loop = loop  # the engine's, and its thread: a thread step's appends go there
        self._thread = thread
        # Called per chunk recorded: a step that streams through an invocation's budget
        # made progress (its next attempt continues after it), as one that heartbeats.
        self._counted = counted
        if threading.get_ident() == thread:
            self._state = _opened(run, name, op)
        else:
            # A thread step: the run's streams are the loop's, opened there (waited for).
            async def opening() -> StreamState:
                return _opened(run, name, op)

            self._state = asyncio.run_coroutine_threadsafe(opening(), loop).result(30)

    @property
    def closed(self) -> bool:
        """An earlier attempt completed it (the crash took only the step's result):
        appends are dropped."""
        return self._state.end is not None

    def recorded(self) -> list[Any]:
        """What earlier attempts of this step appended (durable after a crash): continue
        after it (a model's answer so far, as a prefill)."""
        state = self._state
        seq = self._op.seq
        return [
            codec.decode(chunk) for chunk, step in zip(state.chunks, state.steps, strict=True) if step == seq
        ]

    @property
    def recorded_count(self) -> int:
        seq = self._op.seq
        return sum(1 for step in self._state.steps if step == seq)

    def append(self, value: Any) -> None:
        data = codec.encode(value, f"stream '{self.name}' chunk")
        if self.closed:
            return
        if threading.get_ident() == self._thread:
            self._append(data)
        else:
            try:
                self._loop.call_soon_threadsafe(self._append, data)
            except RuntimeError:
                pass  # the loop is gone, and the engine with it

    def _append(self, data: bytes) -> None:
        op, run, state = self._op, self._run, self._state
        if op.context is not self._context or op.state is not StepState.RUNNING or op.done or run.final:
            return  # an attempt that ended (timed out, cut, let go of) appends nothing more
        if state.end is not None:
            return
        rec = R.StreamChunk(self.name, op.seq, data)
        run.record(rec)
        state.add(rec, run.last_lsn)
        if self._counted is not None:
            self._counted()

    def close(self) -> None:
        """Streams of a step complete with its result; an explicit close does it now."""
        if threading.get_ident() == self._thread:
            self._close()
        else:
            self._loop.call_soon_threadsafe(self._close)

    def _close(self) -> None:
        op, run, state = self._op, self._run, self._state
        if state.end is not None or op.done or run.final or op.context is not self._context:
            return
        rec = R.StreamEnd(self.name, "ok", True)
        run.record(rec)
        state.ended(rec, run.last_lsn)


def _opened(run: StreamRun, name: str, op: StepOp) -> StreamState:
    state = _state(run, name)
    if state.owner is None:
        state.owner = op.seq
    elif state.owner not in (op.seq, RUN):
        raise RejectedError(
            f"stream '{name}' was opened by the step at position {state.owner}: step '{op.name}' cannot write it"
        )
    return state


# -- ends -------------------------------------------------------------------------------------


def record_due(run: StreamRun) -> None:
    """At go-live: what the code wrote to its streams past the journal's end."""
    due, run.streams_due = run.streams_due, []
    for rec in due:
        run.record(rec)
        state = _state(run, rec.stream)  # type: ignore[attr-defined]
        if isinstance(rec, R.StreamChunk):
            state.add(rec, run.last_lsn)
        elif state.end is None and isinstance(rec, R.StreamEnd):
            state.ended(rec, run.last_lsn)


def end_step_streams(run: StreamRun, seq: int, status: str) -> None:
    """The step at `seq` has its final outcome: its streams complete, just before the
    outcome's record."""
    for name, state in run.streams.items():
        if state.owner == seq and state.end is None:
            rec = R.StreamEnd(name, status)
            run.record(rec)
            state.ended(rec, run.last_lsn)


def end_run_streams(run: StreamRun, status: str) -> None:
    """The run ends: every stream a writer opened and left open completes with the run's
    status (one only a reader waits on was never opened: nothing is recorded for it)."""
    for name, state in run.streams.items():
        if state.end is None and state.owner is not None:
            rec = R.StreamEnd(name, status)
            run.record(rec)
            state.ended(rec, run.last_lsn)
