"""A run: its journal, its code's fibers, and the deterministic scheduler between them.

The run applies records one at a time and, after each, runs its fibers until every one
waits ("quiescence"). Live, an outcome (a step's result, a timer, a signal) is recorded
and applied the same way, at quiescence and never in the middle of code, so replaying
the journal hands the code the same results at the same points and positions come out
the same however many fibers the run has.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from fusee import _codec as codec
from fusee import _errors as errors
from fusee import journal as R
from fusee._errors import (
    CodecError,
    DeterminismError,
    Failure,
    FuseeError,
    RejectedError,
    failure_from,
)
from fusee.engine import patches, streams
from fusee.engine.run_records import APPLY, Stuck, child_watch_result, decode, maybe_await, update_done
from fusee.engine.run_records import stop_step as stop_step  # shard.py's, from here
from fusee.engine.streams import StreamState
from fusee.journal import STATUS_OF, Status
from fusee.workflow.definitions import Retry, Workflow
from fusee.workflow.driver import current_step, inline_step
from fusee.workflow.ops import (
    ContinueAsNew,
    Fiber,
    FiberOp,
    Op,
    RaceOp,
    StepOp,
    StepState,
    WaitOp,
    WatchOp,
)

if TYPE_CHECKING:
    from fusee._sealing import AesGcm
    from fusee.engine.telemetry import RunTrace, Telemetry

log = logging.getLogger("fusee")
# Enum members read on every step: a module global is a dict lookup, where `Status.STUCK`
# costs a metaclass descriptor call (about 150 ns on Python 3.11).
_STUCK, _RUNNING, _OK, _STEP_RUNNING = Status.STUCK, Status.RUNNING, Status.OK, StepState.RUNNING
_ENDS = (R.Finished, R.ContinuedAsNew)


class RunSettings(Protocol):
    """What a run reads of its engine's settings."""

    @property
    def workflows(self) -> dict[str, Workflow[Any]]: ...
    @property
    def record_stacks(self) -> bool: ...
    @property
    def default_retry(self) -> Retry: ...
    @property
    def telemetry(self) -> Telemetry | None: ...
    @property
    def codec(self) -> AesGcm | None: ...  # what seals its payloads in storage (fusee/_sealing.py)
    @property
    def object_calls(self) -> Any: ...  # object calls from workflow code (fusee/engine/objects/)


class _TimerAdd(Protocol):
    def add(self, due: int, run: RunState | None, seq: int) -> None: ...


class _OpStarter(Protocol):
    def start_op(self, run: RunState, op: Op) -> None: ...


class _EndMessages(Protocol):
    def prepare_end(self, run: RunState, rec: R.Finished | R.ContinuedAsNew) -> None: ...


class RunHost(Protocol):
    """What a run needs of its shard (`fusee/engine/shard.py`): the clock and seeds, the
    log to append its records to, the operations it starts, and the calls that answer its
    callers when it ends, gets stuck or finishes an update. A type only: the run calls
    the shard's own methods, so the step path pays for no indirection."""

    @property
    def engine(self) -> RunSettings: ...
    @property
    def timers(self) -> _TimerAdd: ...
    @property
    def steps(self) -> _OpStarter: ...
    @property
    def messages(self) -> _EndMessages: ...
    def now_ms(self) -> int: ...
    def new_seed(self) -> int: ...
    def append(self, run: RunState, rec: R.Rec) -> int: ...
    def update_finished(self, run: RunState, rec: R.UpdateDone) -> None: ...
    def run_stuck(self, run: RunState) -> None: ...
    def run_finished(self, run: RunState) -> None: ...


class RunState:
    """A loaded run. Owned by its shard; every method runs on the shard's thread."""

    def __init__(self, shard: RunHost, wid: str, run_no: int, started: R.Started) -> None:
        self.shard = shard
        self.wid = wid
        self.run_no = run_no
        self.started = started
        self.type = started.type
        self.workflow: Workflow[Any] | None = shard.engine.workflows.get(started.type)
        self.journal: list[R.Rec] = []
        self.ops: dict[int, Op] = {}
        self.next_seq = 0
        self.ready: deque[tuple[Fiber, BaseException | None]] = deque()
        self.fibers: list[Fiber] = []
        self.pending_start: list[Op] = []
        self.completions: deque[R.Rec] = deque()
        self.driving = False
        self.replaying = False
        self.expected: dict[int, tuple[str, str]] = {}
        self.issued: dict[int, R.Rec] = {}
        self.status = _RUNNING
        self.final = False  # ended (status in FINAL): read many times a step, set once
        self.default_retry: Retry = shard.engine.default_retry  # what `ctx` steps retry by
        self.outcome: R.Finished | R.ContinuedAsNew | None = None
        self.code_outcome: tuple[Any, BaseException | None] | None = None
        self.stuck_error: DeterminismError | None = None
        self.signals: dict[str, deque[bytes]] = {}
        self.waits: dict[str, deque[WaitOp]] = {}
        self.update_handlers: dict[str, tuple[Any, Callable[..., Any], Callable[..., Any] | None]] = {}
        self.query_handlers: dict[str, tuple[Any, Callable[..., Any]]] = {}
        self.pending_updates: dict[str, list[R.UpdateAccepted]] = {}
        self.update_results: dict[str, R.UpdateDone] = {}
        self.updates_accepted: set[str] = set()
        self.signal_ids: set[str] = set()  # the IDs of the signals recorded (replay rebuilds it)
        self.updates_running: set[str] = set()
        self.compensating = False
        self.compensations: list[tuple[str, Callable[..., Any], dict[str, Any]]] = []
        self.child_results: dict[int, R.ChildResult] = {}
        self.child_watchers: dict[int, list[WatchOp]] = {}
        self.children: dict[int, str] = {}
        self.cancel_reason: str | None = None
        self.paused: int | None = None  # the position of the step paused out of retries
        self.inherited: dict[int, int] = {}  # a reset's children: position -> the run that started them
        # Patches (fusee/engine/patches.py): each one's branch once chosen (None: none yet),
        # the markers chosen during a replay, recorded when it goes live, and how far the
        # replayed journal's code went (one past its last position; ENDED at its end).
        # Search attributes (docs/engine.md, *Search attributes*): as the journal records
        # them, and as the code set them (the same live; a replay's calls are compared with
        # the journal's when it goes live, and the difference recorded).
        # Streams (fusee/engine/streams.py): each one's chunks and end; on replay, what the
        # journal holds of the code's (read first) and what the code wrote past it.
        self.streams: dict[str, StreamState] = {}
        self.streams_recorded: dict[str, int] = {}
        self.streams_closed: set[str] = set()
        self.streams_due: list[R.Rec] = []
        self.attrs: dict[str, Any] = {}
        self.code_attrs: dict[str, Any] = {}
        self.patches: dict[str, bool] | None = None
        self.markers_due: list[str] | None = None
        self.replay_horizon = 0
        self.last_lsn = 0
        self.timers: dict[int, int] = {}  # seq -> due, for parking and next due
        self.last_active_ms = 0
        self.ctx: Any = None
        # (journal length, run-store offset) of its last frame: reused while unchanged
        self.frame: tuple[int, int] | None = None
        # Its `fusee.workflow` span while its code is live here, with telemetry on
        # (fusee/engine/telemetry.py); None otherwise, which is all the step path tests.
        self.trace: RunTrace | None = None

    # -- state ------------------------------------------------------------------------

    def in_flight(self) -> bool:
        """A step's function is running or waiting for its gate: the run cannot park."""
        return any(
            isinstance(op, StepOp) and op.state is _STEP_RUNNING and not op.done for op in self.ops.values()
        )

    def stepping(self) -> bool:
        """`in_flight`, but for steps waiting for a permit at the server: those hold no
        worker, since the server keeps the wait for the shard (docs/limits.md)."""
        return any(
            isinstance(op, StepOp) and op.state is _STEP_RUNNING and not op.done and not op.asking
            for op in self.ops.values()
        )

    def next_due(self) -> int:
        return min(self.timers.values(), default=0)

    # -- replay and recording ---------------------------------------------------------

    def replay(self, records: list[R.Rec]) -> None:
        """Run the code against its journal: issued records are looked up by position
        when the code calls them, events are applied in order."""
        self.replaying = True
        last = -1
        for rec in records:
            seq = getattr(rec, "seq", None)
            if seq is not None:
                self.expected.setdefault(seq, R.op_of(rec))
                if seq > last:
                    last = seq
                if isinstance(rec, R.ISSUED):
                    self.issued[seq] = rec
            elif type(rec) is R.Patched:
                if self.patches is None:
                    self.patches = {}
                self.patches[rec.id] = True
            elif type(rec) is R.StreamChunk:
                if rec.step == streams.RUN:
                    self.streams_recorded[rec.stream] = self.streams_recorded.get(rec.stream, 0) + 1
            elif type(rec) is R.StreamEnd:
                self.streams_closed.add(rec.stream)
            elif type(rec) in _ENDS:
                last = patches.ENDED
        self.replay_horizon = last + 1
        try:
            for index, rec in enumerate(records):
                self.journal.append(rec)
                self.apply(rec)
                self._run_fibers()
                if self.status is _STUCK:
                    # A stuck run waits unchanged: it keeps every record it had, so a
                    # checkpoint or a park writes its journal whole.
                    for kept in records[index + 1 :]:
                        _keep_signal_id(self, kept)
                        self.journal.append(kept)
                    return
            # The code may have ended past the journal's last record: the end is recorded
            # when the run goes live, as it would have been without the crash.
        finally:
            self.replaying = False
            self.expected.clear()
            self.issued.clear()

    def go_live(self) -> None:
        """After replay: start what the journal left unfinished."""
        if self.final or self.status is _STUCK:
            return
        if self.markers_due is not None:
            patches.record_due(self)
        if self.streams_due:
            streams.record_due(self)
        self.streams_recorded.clear()
        self.streams_closed.clear()
        if self.code_attrs != self.attrs:
            # Set by the code past the journal's end (the crash took the record), or set
            # again the same: only what differs is recorded.
            changes = {k: self.code_attrs.get(k) for k in {*self.attrs, *self.code_attrs}}
            self.record_attributes({k: v for k, v in changes.items() if self.attrs.get(k) != v})
        # Every operation the replay left unresolved starts now, in position order (the
        # replay queued them as the code called them; each is started once).
        # A wait a kept signal satisfied during the replay still records its WaitStarted
        # if the crash lost it, as it would have live: the journal has no hole there.
        self.pending_start = [
            op
            for op in self.ops.values()
            if op.seq >= 0 and (not op.done or (isinstance(op, WaitOp) and not op.recorded))
        ]
        self.pending_start.sort(key=lambda op: op.seq)
        self.drive()

    def event(self, rec: R.Rec) -> None:
        """An outcome from outside the code (a step finished, a timer fired, a signal)."""
        self.completions.append(rec)
        self.drive()

    # -- what ctx asks of the engine (fusee.workflow.driver.Driver) ------------------------

    def now_ms(self) -> int:
        return self.shard.now_ms()

    def workflow_named(self, name: str) -> Workflow[Any] | None:
        return self.shard.engine.workflows.get(name)

    def objects(self) -> Any:
        return self.shard.engine.object_calls

    def record(self, rec: R.Rec) -> None:
        self.journal.append(rec)
        self.last_lsn = self.shard.append(self, rec)

    def drive(self) -> None:
        """Run the fibers to quiescence, then start what they called and apply outcomes,
        one at a time, until nothing is left to do now."""
        if self.driving or self.replaying:
            return
        self.driving = True
        # The code runs as the workflow's, whoever calls: a step's function may get here
        # (its start or signal drives a run on this engine), and a callback scheduled from
        # inside a step's task inherits that task's context (a pump, a flush, the done
        # callback of a step it let through), so without this a run's code, driven from
        # such a callback, was refused as a step function using ctx (found by the model).
        token = current_step.set(None)
        inline, inline_step[0] = inline_step[0], None
        try:
            while True:
                self._run_fibers()
                if self.final:
                    return
                if self.status is _STUCK:
                    # Its code cannot run, but what it is sent (a signal, a cancel) is
                    # recorded, never acknowledged and dropped: a replay with fixed code
                    # applies it in order.
                    while self.completions:
                        rec = self.completions.popleft()
                        _keep_signal_id(self, rec)
                        self.journal.append(rec)
                        self.last_lsn = self.shard.append(self, rec)
                    return
                if self.pending_start:
                    ops, self.pending_start = self.pending_start, []
                    for op in ops:
                        # A wait a kept signal satisfied at once still records its
                        # WaitStarted, so a replay checks the wait's position too.
                        if not op.done or (isinstance(op, WaitOp) and not op.recorded):
                            self.shard.steps.start_op(self, op)
                    continue
                if self.code_outcome is not None:
                    # The code ended: record the end after what it called was started, so
                    # every issued record precedes it, live as on replay.
                    self._finish_code(*self.code_outcome)
                    return
                if not self.completions:
                    return
                rec = self.completions.popleft()
                self.record(rec)
                self.apply(rec)
        finally:
            inline_step[0] = inline
            current_step.reset(token)
            self.driving = False
            # Parking counts from the last time the run did something, not from its
            # start: a run that has been busy for an hour and just suspended is not idle.
            self.last_active_ms = self.shard.now_ms()

    def _run_fibers(self) -> None:
        ready = self.ready
        while ready:
            fiber, exc = ready.popleft()
            try:
                yielded = fiber.coro.send(None) if exc is None else fiber.coro.throw(exc)
            except StopIteration as stop:
                fiber.on_done(stop.value, None)
                continue
            except Stuck:
                ready.clear()
                return
            except (Exception, ContinueAsNew) as error:  # noqa: BLE001
                # The code's failure is its outcome. Only Exception: KeyboardInterrupt,
                # SystemExit and a test runner's timeout go on up, they are not the code's.
                if self.status is _STUCK:
                    ready.clear()
                    return
                fiber.on_done(None, error)
                continue
            if self.status is _STUCK:
                ready.clear()
                return
            if isinstance(yielded, Op):
                if isinstance(yielded, WaitOp) and yielded.orphaned:
                    self._rejoin(yielded)
                if yielded.done:
                    ready.append((fiber, None))
                else:
                    yielded.waiters.append(fiber)
            else:
                ready.append(
                    (
                        fiber,
                        TypeError(
                            f"workflow code awaited {type(yielded).__name__}, which is not a ctx "
                            "operation: workflow code may await only ctx operations; put other "
                            "awaits in a step (ctx.step)"
                        ),
                    )
                )

    def spawn(
        self, coro: Coroutine[Any, Any, Any], on_done: Callable[[Any, BaseException | None], None]
    ) -> None:
        fiber = Fiber(coro, on_done)
        self.fibers.append(fiber)
        self.ready.append((fiber, None))

    def close_fibers(self) -> None:
        """Close every coroutine of the run (it ended, or its shard let go of it), so none
        is left for the garbage collector to close later, or never started."""
        fibers, self.fibers = self.fibers, []
        trace = self.trace
        if trace is not None:  # the run leaves this process's hands: its span ends
            self.trace = None
            trace.end(self)
        for fiber in fibers:
            try:
                fiber.coro.close()
            except (RuntimeError, ValueError):  # running, or already closing
                pass

    # -- operations the code calls ----------------------------------------------------

    def issue(self, op: Op) -> Op:
        """Give an operation its position, check it against the journal, start it."""
        if self.final:
            raise Stuck()
        self._not_in_step(op.kind)
        op.seq = seq = self.next_seq
        self.next_seq += 1
        self.ops[seq] = op
        if self.replaying:
            want = self.expected.get(seq)
            if want is not None and not _same_op(want, (op.kind, op.ident)):
                self.stuck(
                    f"the journal recorded {want[0]} '{want[1]}' here but the code called "
                    f"{op.kind} '{op.ident}' (position {seq})"
                )
                raise Stuck()
        self.pending_start.append(op)
        return op

    def _not_in_step(self, kind: str) -> None:
        here = inline_step[0] or current_step.get()
        if here is not None and here[0] is self:
            # This run's step function runs (task, thread or inline): ctx is not for it. A
            # step of another run may drive this run's code (it started or signalled it on
            # this engine, and the code runs on that step's stack): that code is its own.
            raise RejectedError(
                f"ctx.{kind} called inside a step's function: steps do not nest, and a step "
                "function may not use ctx. Call it from the workflow's code, or do the work "
                "directly inside the step"
            )

    def patched(self, patch: str) -> bool:
        if self.final:
            raise Stuck()
        self._not_in_step("patched")
        return patches.patched(self, patch)

    def set_attributes(self, changes: dict[str, Any]) -> None:
        """`ctx.set_attributes`: merged into what the code set; live, the changes to what
        the journal holds are recorded at once (on replay, at `go_live`)."""
        if self.final:
            raise Stuck()
        self._not_in_step("set_attributes")
        R.merge_attributes(self.code_attrs, changes)
        if not self.replaying:
            self.record_attributes({k: v for k, v in changes.items() if self.attrs.get(k) != v})

    def record_attributes(self, changes: dict[str, Any]) -> None:
        if changes:
            rec = R.AttributesSet(changes)
            self.record(rec)
            R.merge_attributes(self.attrs, changes)

    def indexed_attrs(self) -> tuple[dict[str, Any] | None, int]:
        """What the run index keeps of it: its attributes (None: none) and start time."""
        return (dict(self.attrs) if self.attrs else None), self.started.now

    def stream(self, name: str) -> streams.StreamWriter:
        if self.final:
            raise Stuck()
        self._not_in_step("stream")
        return streams.StreamWriter(self, name)

    def issued_record(self, seq: int) -> R.Rec | None:
        """On replay, what the journal recorded when the code called operation `seq`."""
        return self.issued.get(seq) if self.replaying else None

    def resolve(self, op: Op, value: Any = None, exc: BaseException | None = None) -> None:
        if op.done:
            return
        op.value, op.exc, op.done = value, exc, True
        if op.seq >= 0:  # operations without a position (-1) have no timer; -1 is the deadline's
            self.timers.pop(op.seq, None)
        self.resolve_combined(op)

    def resolve_combined(self, op: Op) -> None:
        """Wake what waits on a resolved operation: fibers, and combinators (which may
        resolve in turn)."""
        if isinstance(op, RaceOp):
            self._drop_losers(op)
        waiters, op.waiters = op.waiters, []
        for waiter in waiters:
            if isinstance(waiter, Op):
                waiter.child_done(op)
                if waiter.done:
                    self.resolve_combined(waiter)
            else:
                self.ready.append((waiter, None))

    def _drop_losers(self, race: RaceOp) -> None:
        """A race's losing waits stop taking signals, so a signal after the race goes to the
        wait the code awaits next, not to one nobody awaits. A lost wait the code awaits
        again (one wait raced against many reminders) takes signals again from then on.
        Deterministic: both happen at points of the code, live and on replay alike."""
        for op in race.ops:
            if isinstance(op, WaitOp) and not op.done:
                queue = self.waits.get(op.name)
                if queue and op in queue:
                    queue.remove(op)
                op.orphaned = True

    def _rejoin(self, op: WaitOp) -> None:
        op.orphaned = False
        self.take_signal(op)

    def combine(self, combined: Op, ops: list[Op]) -> Op:
        for op in ops:
            if isinstance(op, FiberOp):
                self.spawn(op.coro, _fiber_done(self, op))
            elif isinstance(op, WaitOp) and op.orphaned:
                self._rejoin(op)
            if not op.done:
                op.waiters.append(combined)
            else:
                combined.child_done(op)
        if not ops:
            combined.child_done(combined)
        return combined

    def take_signal(self, op: WaitOp) -> None:
        """A signal that arrived before the code waited is kept and taken here."""
        buffered = self.signals.get(op.name)
        if buffered:
            self.resolve_decoded(op, buffered.popleft(), op.type, "signal")
        else:
            self.waits.setdefault(op.name, deque()).append(op)

    def resolve_decoded(self, op: Op, data: bytes, type_: Any, what: str) -> None:
        """Resolve with a recorded payload decoded into the type the code asked for; one
        that does not match resolves the operation with CodecError, which the code sees
        where it awaits, live and on replay alike (it never escapes into the engine)."""
        try:
            value = decode(data, type_, what)
        except CodecError:
            try:  # again, only to name the operation in the message
                decode(data, type_, f"{what} '{op.name}'")
            except CodecError as error:
                self.resolve(op, None, error)
                return
        self.resolve(op, value)

    def stuck(self, message: str) -> None:
        self.status = Status.STUCK
        self.stuck_error = DeterminismError(
            f"run '{self.wid}' (run {self.run_no}) does not match its journal: {message}. "
            "The run waits, unchanged, for one of: (1) deploy code that matches its journal "
            "(branch on ctx.version, and give the changed workflow a new version= for new "
            "runs); (2) guard the change with ctx.patched('<id>'), so runs that went past it "
            "before take the old branch; (3) reset the run to before the step that differs "
            "(run.reset(before_step=...)). Or terminate it",
            workflow_id=self.wid,
        )
        log.error("%s", self.stuck_error)
        self.shard.run_stuck(self)

    # -- applying records: one function per kind, in run_records.py ---------------------

    def apply(self, rec: R.Rec) -> None:
        APPLY[type(rec)](self, rec)

    def start_update(self, rec: R.UpdateAccepted) -> None:
        definition, handler, _validate = self.update_handlers[rec.name]
        self.updates_running.add(rec.id)

        async def run_handler() -> Any:
            arg = codec.decode(rec.arg, definition.arg, f"update '{rec.name}' argument")
            return await maybe_await(handler(arg))

        def done(value: Any, exc: BaseException | None) -> None:
            self.updates_running.discard(rec.id)
            if self.replaying:
                return  # its UpdateDone follows in the journal
            if exc is not None:
                result = R.UpdateDone(rec.id, None, failure_from(exc, self.shard.engine.record_stacks))
            else:
                try:
                    result = R.UpdateDone(rec.id, codec.encode(value, f"update '{rec.name}' result"))
                except FuseeError as error:
                    result = R.UpdateDone(rec.id, None, failure_from(error))
            self.record(result)
            update_done(self, result)

        self.spawn(run_handler(), done)

    def resolve_child_watch(self, watch: WatchOp, rec: R.ChildResult) -> None:
        child_watch_result(self, watch, rec)

    # -- the end ------------------------------------------------------------------------

    def main_done(self, value: Any, exc: BaseException | None) -> None:
        self.code_outcome = (value, exc)

    def _finish_code(self, value: Any, exc: BaseException | None) -> None:
        """The main code returned or raised: record how the run ended."""
        rec: R.Finished | R.ContinuedAsNew
        if isinstance(exc, ContinueAsNew):
            rec = R.ContinuedAsNew(exc.input, exc.version, self.shard.new_seed(), self.shard.now_ms())
        elif exc is None:
            try:
                rec = R.Finished(_OK, codec.encode(value, "the workflow's result"))
            except FuseeError as error:
                rec = R.Finished(Status.FAILED, failure=failure_from(error))
        else:
            status = Status.CANCELLED if isinstance(exc, errors.CancelledError) else Status.FAILED
            rec = R.Finished(status, failure=failure_from(exc, self.shard.engine.record_stacks))
        self.end(rec)

    def end(self, rec: R.Finished | R.ContinuedAsNew) -> None:
        """Record the end live (also terminate and deadline), then apply it."""
        if self.final:
            return
        self.shard.messages.prepare_end(self, rec)
        if self.streams:
            streams.end_run_streams(self, rec.status if isinstance(rec, R.Finished) else "continued")
        self.record(rec)
        self.ended(rec)

    def ended(self, rec: R.Finished | R.ContinuedAsNew) -> None:
        self.outcome = rec
        self.status = STATUS_OF[rec.status] if isinstance(rec, R.Finished) else Status.CONTINUED
        self.final = True
        self.timers.clear()
        for op in self.ops.values():
            if not op.done:
                stop_step(op)
        self.ready.clear()
        self.close_fibers()
        if not self.replaying:
            self.shard.run_finished(self)

    def traced(self, shard: int) -> None:
        """Its code goes live in this process: with telemetry on, under a new span."""
        telemetry = self.shard.engine.telemetry
        if telemetry is not None and self.trace is None:
            self.trace = telemetry.run_trace(self, shard)

    def outcome_failure(self) -> Failure | None:
        return self.outcome.failure if isinstance(self.outcome, R.Finished) else None


def _keep_signal_id(run: RunState, rec: R.Rec) -> None:
    """A stuck run records what it is sent without applying it: the ID of a signal among
    them still goes in the run's set, so the same signal sent again is not recorded twice
    (found by the model test)."""
    if type(rec) is R.SignalReceived and rec.id is not None:
        run.signal_ids.add(rec.id)


def _same_op(recorded: tuple[str, str], called: tuple[str, str]) -> bool:
    """An async completion's attempts are step records: its kind matches either name."""
    steps = ("step", "await_completion")
    if recorded[0] in steps and called[0] in steps:
        return recorded[1] == called[1] and (recorded[0] == called[0] or recorded[0] == "step")
    return recorded == called


def _fiber_done(run: RunState, op: FiberOp) -> Callable[[Any, BaseException | None], None]:
    def done(value: Any, exc: BaseException | None) -> None:
        run.resolve(op, value, exc)

    return done
