"""A shard's log position and what waits on it: records are staged at once (visible
before they are durable) and made durable in batches, one flush in flight per shard; the
store pushes each durable position back, and what waited for it is released in order.

Only outputs wait for durability (an acknowledgment, a result, a message to another
shard) and a step's function, for the records before it; the code never does.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Callable
from time import perf_counter
from typing import Any, Protocol

from fusee._errors import FuseeError, LeaseLostError
from fusee.storage.contract import ShardStore

log = logging.getLogger("fusee")

RELAYED: contextvars.ContextVar[bool] = contextvars.ContextVar("fusee_relayed_call", default=False)
"""True in the task that answers a call the server relayed (fusee/engine/remote_calls.py):
its answer goes back through the server, which holds it until the records it depends on
are durable there (docs/server.md, *Calls at a handback*). `Durability.settle_sent`
reads it. (A task the call starts inherits it: harmless, as a drop cancels the shard's
own tasks, whatever their waits are told.)"""


class Watchers(Protocol):
    """The engine's count of `wait_idle` callers, and the event that wakes them."""

    @property
    def idle_waiters(self) -> int: ...
    @property
    def activity(self) -> asyncio.Event: ...


class DurabilityHost(Protocol):
    """What durability needs of its shard: the store it flushes, and how to stop the
    shard when a write fails or the lease is lost."""

    @property
    def index(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def store(self) -> ShardStore: ...
    @property
    def engine(self) -> Watchers: ...
    def check(self) -> None: ...
    def stopped_error(self) -> FuseeError: ...
    def stop(self, error: FuseeError) -> None: ...
    def fail(self, exc: BaseException, why: str = ...) -> None: ...


class Durability:
    def __init__(self, shard: DurabilityHost) -> None:
        self.shard = shard
        self.appended = 0  # the last staged record's position
        self.durable = 0  # the last position the store reported durable
        self.gates: deque[tuple[int, Callable[[], None]]] = deque()
        self.waiting: set[asyncio.Future[Any]] = set()  # what a stop fails
        # durable_at's callers: their positions, and whether the server relayed their call
        self.awaited: dict[asyncio.Future[None], tuple[int, bool]] = {}
        self.flushed = 0  # the last position handed to the store's flush (maybe written)
        self.sealed = False  # closing: nothing more is handed to the store (Shard.close)
        self.flushing = False  # a flush is asked for and not yet reported
        self.appending = False  # inside the store's append (it may report from there)
        self.releasing = False  # running the gates a durable position opened
        # Outcomes of step functions a release ran (`hold`), applied by the same release
        # once its gates are run: never on a later turn, where a close resumed by one of
        # those gates would take its last checkpoint without them and let go of a step
        # that ran (the next open would run it again).
        self.held: deque[Callable[[], None]] = deque()
        # Counters (fusee/engine/shard_metrics.py): records staged are `appended - first`.
        self.first = 0  # the position this holder began at
        self.bytes = 0
        self.flushes = self.flushed_records = self.flush_us = 0
        self.flush_began = 0.0  # perf_counter when the flush in flight was asked for
        self.gated_waits = self.gate_wait_us = 0

    def reset(self, position: int) -> None:
        """Recovery: the log is durable up to `position`, nothing staged."""
        self.appended = self.durable = self.first = position

    def stage(self, entry: bytes) -> int:
        self.bytes += len(entry)
        self.appending = True
        self.appended = lsn = self.shard.store.append(entry)
        self.appending = False
        return lsn

    def made(self, lsn: int) -> None:
        """After a staged record's bookkeeping: release what it made durable (a store
        durable on append), or ask for a flush."""
        shard = self.shard
        if shard.engine.idle_waiters:
            shard.engine.activity.set()
        if self.durable >= lsn:
            if self.gates:
                self.release()
        elif not self.flushing:
            # Asked for on the next turn: the records this turn makes (an effect and its
            # dedupe record, a run's end and the next run's start) share one batch.
            self.flushing = True
            asyncio.get_running_loop().call_soon(self._start_flush)

    def _start_flush(self) -> None:
        if self.shard.closed or self.sealed:
            self.flushing = False
            return
        self.flushed = self.appended
        self.flush_began = perf_counter()
        self.shard.store.flush()

    def on_durable(self, durable: int | BaseException) -> None:
        """The store's one report: durable up to a position, or a failure that stops the
        shard. One flush is asked for at a time; the next is asked for at the end of
        this report, so whatever the released gates recorded goes in the next batch."""
        if durable.__class__ is int:  # the common case first (a failure is an exception)
            if self.appending:
                # From inside the store's append (durable on append): the record's own
                # bookkeeping releases once it is done.
                if durable > self.durable:
                    self.durable = durable
                return
            shard = self.shard
            if shard.closed:
                # Abandoned (a crash), closed or stopped: nothing is answered or released
                # from here on, as nothing would be by a process that died.
                self.flushing = False
                return
            if durable > self.durable:
                if self.flush_began:
                    self.flushes += 1
                    self.flushed_records += durable - self.durable
                    self.flush_us += int((perf_counter() - self.flush_began) * 1_000_000)
                    self.flush_began = 0.0
                self.durable = durable
            if shard.engine.idle_waiters:
                shard.engine.activity.set()
            self.release()
            if self.durable < self.appended and not shard.closed and not self.sealed:
                self.flushed = self.appended
                self.flush_began = perf_counter()
                shard.store.flush()
            else:
                self.flushing = False
            return
        self.flushing = False
        shard = self.shard
        if shard.closed or not isinstance(durable, BaseException):
            return
        # Never acknowledge after a failed write: the kernel may have dropped the pages,
        # or another holder owns the shard now. Callers waiting on it get the error;
        # nothing gated (a step, a message) is released.
        if isinstance(durable, LeaseLostError):
            log.warning("shard %d: lease lost, the shard stops here: %s", shard.index, durable)
            shard.stop(durable)
        else:
            log.error("shard %d: a write failed, the shard stops: %s", shard.index, durable)
            shard.fail(durable, "stopped after a failed write")

    def when_durable(self, lsn: int, fn: Callable[[], None]) -> None:
        """Run `fn` once everything up to `lsn` is durable (at once if it is)."""
        if self.durable >= lsn:
            fn()
        else:
            self.gates.append((lsn, fn))

    async def durable_at(self, lsn: int) -> None:
        """Wait until everything up to `lsn` is durable (what an output waits for)."""
        if self.durable >= lsn:
            return
        self.shard.check()
        if self.shard.closed:
            # Let go of (a close or a drop): nothing is flushed any more, so the gate would
            # never open; a remote call that recorded this late is answered Moved, its
            # record never sent (Shard.close).
            raise self.shard.stopped_error()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.add(fut)
        self.awaited[fut] = (lsn, RELAYED.get())

        def release() -> None:
            self.waiting.discard(fut)
            self.awaited.pop(fut, None)
            if not fut.done():
                fut.set_result(None)

        self.gates.append((lsn, release))
        await fut

    def settle_sent(self, error: FuseeError) -> None:
        """Ahead of a drop (Shard.close past its deadline): the callers waiting for a
        record handed to the store and not reported durable. The server writes what it
        received before the shard's release (which the drop sends next), so the record
        will be in the log unless the disk fails. A call the server relayed goes on as if
        its record were durable (its answer is known once recorded): the answer leaves
        after the release, and the server holds it until this connection's records of
        the shard are durable, or answers a retriable error if that write fails
        (docs/server.md, *Calls at a handback*). Failing it instead would make a call
        without an ID, retried, act twice; answering it MOVED would have the next holder
        act on it again. Any other caller (in this process) fails with `error`, as at a
        crash: it cannot know if its call took effect. Those waiting for a record never
        handed to the store hear why the shard let go (Callers.fail_all): not written."""
        for fut, (lsn, relayed) in list(self.awaited.items()):
            if lsn <= self.flushed and not fut.done():
                if relayed:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)
                    fut.exception()  # one nobody awaits any more must not be reported as unretrieved
                self.waiting.discard(fut)
                del self.awaited[fut]

    def release(self) -> None:
        """Run what waited for the durable position, then apply the outcomes of the steps
        it ran (`hold`): every released step's function runs before any run goes on, so a
        release of many woken runs does not make the last wait for all the others to
        advance. Called from the store's report, which serves every shard of a data
        directory: a gate that raises must not reach it (the other shards' waiters behind
        it would be dropped, and this shard would stay `flushing` for ever), so the error
        stops this shard alone."""
        if self.releasing:
            # From inside a gate or an outcome (a record made durable on append): the loop
            # below goes on with what that opened.
            return
        gates, held = self.gates, self.held
        self.releasing = True
        try:
            while True:
                while gates and gates[0][0] <= self.durable:
                    gates.popleft()[1]()
                if not held:
                    return
                held.popleft()()  # may open gates (a store durable on append): run them first
        except Exception as error:
            held.clear()
            log.exception("shard %d: stopping after an internal error", self.shard.index)
            self.shard.fail(error, "stopped after an internal error")
        finally:
            self.releasing = False

    def hold(self, apply: Callable[[], None]) -> None:
        """A step's outcome, reached while a release runs: applied by that release once
        its gates are run (see `release`)."""
        self.held.append(apply)
