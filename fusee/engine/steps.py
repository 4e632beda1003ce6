"""Running operations the code called: recording what they issue, and running step
functions behind their durability gate, with retries and attempt timeouts."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

from fusee import _codec as codec
from fusee import _errors as errors
from fusee import journal as R
from fusee._errors import CodecError, Failure, FuseeError, LeaseLostError, failure_from
from fusee.engine.durability import Durability
from fusee.engine.heartbeats import attempt_beats
from fusee.engine.outbox import Outbox
from fusee.engine.run import RunState
from fusee.engine.run_records import stop_step
from fusee.engine.streams import end_step_streams
from fusee.engine.timers import Timers
from fusee.engine.tokens import make_token
from fusee.workflow.ctx import Completion, StepContext, step_key, takes_context
from fusee.workflow.driver import current_step, inline_step
from fusee.workflow.ops import (
    ChildOp,
    Op,
    SendOp,
    StepOp,
    StepState,
    TimerOp,
    WaitOp,
)

log = logging.getLogger("fusee")
_IDLE, _RUNNING = StepState.IDLE, StepState.RUNNING  # module globals: read on every step
EXHAUSTED = -1  # `_retry_at`: a retryable failure whose attempts ran out

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from fusee.engine.limits import Limits
    from fusee.storage.contract import ShardStore


class StepSettings(Protocol):
    """What steps read of the engine: mocks (the test kit), its step threads, whether
    failures keep their stacks."""

    @property
    def step_mocks(self) -> dict[tuple[str, str], Callable[[int], Any]]: ...
    @property
    def record_stacks(self) -> bool: ...
    @property
    def permits(self) -> Limits: ...
    @property
    def on_exhausted(self) -> str: ...
    def step_threads(self) -> ThreadPoolExecutor: ...
    def callback_url(self, token: str) -> str | None: ...


class StepHost(Protocol):
    """What starting operations needs of the shard: its clock, timers, durability gate,
    outbox numbering and store, and how to stop it when the process was fenced."""

    steps_run: int
    heartbeats: int

    @property
    def index(self) -> int: ...
    @property
    def engine(self) -> StepSettings: ...
    @property
    def closed(self) -> bool: ...
    @property
    def leaving(self) -> bool: ...
    @property
    def store(self) -> ShardStore: ...
    @property
    def timers(self) -> Timers: ...
    @property
    def durability(self) -> Durability: ...
    @property
    def outbox(self) -> Outbox: ...
    def now_ms(self) -> int: ...
    def stop(self, error: FuseeError) -> None: ...


class Steps:
    """The shard's part that starts operations the code called: steps (on the loop, on
    a task, or on the engine's step threads), their retries and timeouts, timers, waits
    and messages."""

    def __init__(self, shard: StepHost) -> None:
        self.shard = shard

    def start_op(self, run: RunState, op: Op) -> None:
        """Start an operation the code called (live), recording what it issued."""
        if isinstance(op, StepOp):
            if op.state is not _IDLE:
                return  # running already, or a completion whose token is out
            if op.retry_at:
                # Waiting for its retry is not running: the run may park meanwhile.
                run.timers[op.seq] = op.retry_at
                self.shard.timers.add(op.retry_at, run, op.seq)
                return
            op.state = _RUNNING
            if op.read_only:
                self.attempt(run, op)
            else:
                # The step's function sees only state a crash cannot take back.
                lsn = run.last_lsn
                durability = self.shard.durability
                if durability.durable >= lsn:
                    self.attempt(run, op)
                else:
                    durability.gated_waits += 1
                    began = perf_counter()
                    durability.gates.append((lsn, lambda: self._gated(run, op, began)))
        elif isinstance(op, TimerOp):
            if not op.recorded:
                op.due = op.due or self.shard.now_ms() + (op.duration_ms or 0)
                run.record(R.TimerStarted(op.seq, op.name, op.due))
                op.recorded = True
            run.timers[op.seq] = op.due
            self.shard.timers.add(op.due, run, op.seq)
        elif isinstance(op, WaitOp):
            if not op.recorded:
                op.due = self.shard.now_ms() + op.timeout_ms if op.timeout_ms is not None else 0
                run.record(R.WaitStarted(op.seq, op.name, op.due))
                op.recorded = True
            if op.due and not op.done:
                run.timers[op.seq] = op.due
                self.shard.timers.add(op.due, run, op.seq)
        elif isinstance(op, ChildOp):
            if not op.recorded:
                run.record(
                    R.ChildRequested(
                        op.seq,
                        op.workflow,
                        op.wid,
                        op.input,
                        self.shard.outbox.take_number(),
                        op.close,
                        op.timeout_ms,
                        # Children keep the trace: below this run's span here, if traced.
                        run.trace.traceparent() if run.trace is not None else run.started.traceparent,
                    )
                )
                op.recorded = True
        elif isinstance(op, SendOp):
            if not op.recorded:
                number = self.shard.outbox.take_number()
                if op.kind == "cancel_workflow":
                    run.record(R.CancelSent(op.seq, op.target, op.payload, number))
                else:
                    run.record(R.SignalSent(op.seq, op.target, op.name, op.payload, number))
                op.recorded = True

    def _gated(self, run: RunState, op: StepOp, began: float) -> None:
        self.shard.durability.gate_wait_us += int((perf_counter() - began) * 1_000_000)
        self.attempt(run, op)

    def attempt(self, run: RunState, op: StepOp) -> None:
        """Past the gate: run the attempt, after taking its limit's permit if it has one
        (every attempt takes its own: a retry waits in the queue again)."""
        if op.limit is None:
            self.execute(run, op)
            return

        shard = self.shard

        def granted(permit: Any) -> bool | None:
            op.asking = False
            if op.done or run.final:
                return False  # cancelled or ended while it waited
            if shard.closed or shard.leaving:
                # Let go of (or reported idle) while it waited: the step still wants its
                # permit, under the shard's next holder (`None`: the server keeps it).
                return None
            op.permit = permit
            self.execute(run, op)
            return True

        permits = shard.engine.permits
        try:
            permits.acquire(op.limit, op.priority, op.fairness_key, op.fairness_weight, granted, shard.index)
        except Exception as exc:  # noqa: BLE001 - no permit to be had (server mode): the attempt's outcome
            self._step_outcome(run, op, None, exc)
            return
        # Still waiting, at the server: the shard may be let go of meanwhile (idle.py).
        op.asking = op.permit is None and permits.remote

    def execute(self, run: RunState, op: StepOp) -> None:
        """Run one attempt of a step's function."""
        trace = run.trace
        if trace is not None and trace.outside:
            # Traced: the attempt's span calls this again, from inside it (with telemetry
            # off, the test above is all the step path pays).
            trace.attempt(self.execute, run, op)
            return
        if op.done or run.final or self.shard.closed:
            _release(op)
            return
        fn = op.fn
        mock = self.shard.engine.step_mocks.get((run.type, op.name)) if self.shard.engine.step_mocks else None
        if mock is not None:
            args: tuple[Any, ...] = (op.attempt,)
            fn = mock
        elif op.completion:
            made = self.token(run, op)
            args = (Completion(made, self.shard.engine.callback_url(made)),)
        elif takes_context(fn):
            # Built only for functions that declare it: `lambda: ...` costs nothing.
            beats = attempt_beats(self.shard, run, op)
            op.context = beats.context = StepContext(step_key(run, op), op.attempt, run.wid, op.name, beats)
            args = (op.context,)
        else:
            op.context = None
            args = ()
        if op.heartbeat_ms is not None:
            (op.beat if op.context is not None else attempt_beats(self.shard, run, op)).arm(self._silent)
        here = (run, op)
        store = self.shard.store
        if store.fenced():
            # This process was stopped longer than the server waits: its lease is gone, and
            # another holder may have run this step and recorded it. Stop, run nothing.
            _release(op)
            self.shard.stop(LeaseLostError(FENCED))
            return
        try:
            if op.thread or (op.timeout_ms is not None and not inspect.iscoroutinefunction(fn)):
                token = current_step.set(here)
                context = contextvars.copy_context()
                current_step.reset(token)
                loop = asyncio.get_running_loop()
                pending: Any = loop.run_in_executor(
                    self.shard.engine.step_threads(), lambda: context.run(_unless_fenced, store, fn, *args)
                )
            else:
                # A synchronous function runs here and now: a plain slot tells ctx.key()
                # which step runs (a context variable would cost more than the step).
                inline_step[0] = here
                try:
                    pending = fn(*args)
                finally:
                    inline_step[0] = None
        except Exception as exc:  # noqa: BLE001 - a step's failure is its outcome
            # Only Exception: KeyboardInterrupt and SystemExit stop the process, as they
            # would anywhere else, instead of being recorded as a retryable failure.
            self._step_outcome(run, op, None, exc)
            return
        if not inspect.isawaitable(pending):
            self._step_outcome(run, op, pending, None)
            return
        token = current_step.set(here)  # the task copies the context it starts in
        task = asyncio.ensure_future(_attempt(pending, op))
        current_step.reset(token)
        op.task = task
        op.awaitable = pending
        task.add_done_callback(lambda t: self._task_done(run, op, t))

    def _task_done(self, run: RunState, op: StepOp, task: asyncio.Future[Any]) -> None:
        if op.task is not task:
            return  # an attempt cut short (heartbeat_timeout): its outcome is recorded already
        op.task = op.awaitable = None
        if task.cancelled():
            _release(op)  # the attempt ended: cancelled with its run, or by a close
            if run.trace is not None:
                run.trace.step_ended(op, None, cancelled=True)
            return
        if op.done or run.final:
            _release(op)
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, Exception):
            # KeyboardInterrupt, SystemExit: not the step's failure; let them stop the loop.
            raise exc
        self._step_outcome(run, op, None if exc else task.result(), exc)

    def _step_outcome(self, run: RunState, op: StepOp, value: Any, exc: BaseException | None) -> None:
        _release(op)  # the attempt ended, whatever becomes of its outcome
        if run.trace is not None:
            run.trace.step_ended(op, exc)
        if op.done or run.final or self.shard.closed:
            # Cancelled or terminated meanwhile, or the shard let go of the run (a thread
            # that outlived a close): the result is discarded, never recorded late.
            return
        if isinstance(exc, _Fenced):
            self.shard.stop(LeaseLostError(FENCED))
            return
        self.shard.steps_run += 1
        rec: R.Rec
        if exc is None:
            if op.completion:
                rec = R.CompletionSent(op.seq, op.name, op.attempt)
            else:
                try:
                    rec = R.StepDone(op.seq, op.name, codec.encode(value, f"step '{op.name}' result"))
                except CodecError as error:
                    # Every attempt would fail the same way: fail at once, no retries.
                    rec = R.StepFailed(op.seq, op.name, failure_from(error))
                if run.streams:  # its streams complete just before its result's record
                    end_step_streams(run, op.seq, "ok" if type(rec) is R.StepDone else "failed")
        else:
            failure = failure_from(exc, self.shard.engine.record_stacks)
            retry_at = self._retry_at(op, exc, failure)
            number = op.attempt + op.attempts_before  # the journal numbers on across resumes
            if retry_at > 0:
                rec = R.Attempt(op.seq, op.name, number, failure, retry_at, self.shard.now_ms())
            elif retry_at == EXHAUSTED and self._pauses(op):
                rec = R.Attempt(op.seq, op.name, number, failure, 0, self.shard.now_ms(), paused=True)
                log.warning(
                    "run '%s' paused: step '%s' ran out of retries (%s); resume it with run.resume()",
                    run.wid,
                    op.name,
                    failure.message,
                )
            else:
                rec = R.StepFailed(op.seq, op.name, failure)
                if run.streams:
                    end_step_streams(run, op.seq, "failed")
        op.state = _IDLE
        durability = self.shard.durability
        if durability.releasing:
            # One of many steps a durable position released (a mass wake-up): its outcome
            # is applied once the release has run every step it opened, so those run
            # their functions first instead of waiting for each run before them to advance
            # (docs/engine.md, *Durability*). Queued now: the run is not idle meanwhile,
            # and the sweep does not park it. Applied within the same release, never on a
            # later turn: a close resumed by that release would let go of it unrecorded.
            run.completions.append(rec)
            durability.hold(lambda: self._apply(run))
            return
        run.event(rec)

    def _silent(self, run: RunState, op: StepOp, ms: int) -> None:
        """`heartbeat_timeout` passed without a heartbeat: the attempt fails as a timed
        out one does (retried under its policy), and its function is told to stop."""
        takes_none = op.context is None
        takes_none = op.context is None
        stop_step(op)
        # Detached from the task it cancelled: that task's end must not touch the next
        # attempt (its permit, its watchdog), which may begin before the cancel lands.
        op.task = op.awaitable = None
        hint = (
            "; its function takes no context, so it cannot heartbeat: give it a parameter s and call s.heartbeat()"
            if takes_none
            else ""
        )
        self._step_outcome(
            run,
            op,
            None,
            errors.TimeoutError(f"the attempt sent no heartbeat for {ms} ms (its heartbeat_timeout){hint}"),
        )

    def _apply(self, run: RunState) -> None:
        if not run.final and not self.shard.closed:
            run.drive()

    def _pauses(self, op: StepOp) -> bool:
        """Out of retries, the step pauses its run rather than fail it: its policy's choice,
        else the engine's. An async completion's send function fails as before."""
        if op.completion:
            return False
        return (op.retry.on_exhausted or self.shard.engine.on_exhausted) == "pause"

    def _retry_at(self, op: StepOp, exc: BaseException, failure: Failure) -> int:
        """When to try again; 0 when the failure is final, EXHAUSTED when the policy would
        retry it but its attempts (or `max_elapsed`) ran out."""
        policy = op.retry
        if failure.retryable is False or isinstance(exc, CodecError):
            return 0
        if op.attempt >= policy.attempts:
            # Asked only when pausing: a failing policy's `retry_if` sees no extra call.
            return EXHAUSTED if self._pauses(op) and self._passes(op, exc, failure) else 0
        if not self._passes(op, exc, failure):
            return 0
        now = self.shard.now_ms()
        import random  # a retry's jitter: loaded on first use, not by `import fusee`

        retry_at = now + policy.delay_ms(op.attempt, random.random())
        if policy.max_elapsed is not None:
            from fusee.workflow.durations import to_ms

            first = op.first_failure_at or now
            if retry_at - first > to_ms(policy.max_elapsed):
                return EXHAUSTED
        return retry_at

    def _passes(self, op: StepOp, exc: BaseException, failure: Failure) -> bool:
        """The policy would retry this failure (its type and `retry_if` allow it)."""
        policy = op.retry
        causes = _causes(exc)
        names = {f.type for f in _chain(failure)}
        for kind in policy.non_retryable:
            if isinstance(kind, type) and any(isinstance(e, kind) for e in causes):
                return False
            if isinstance(kind, str) and kind in names:
                return False
        if policy.retry_if is not None:
            try:
                again = policy.retry_if(failure, op.attempt)
            except Exception as error:  # noqa: BLE001 - a policy that fails decides "final"
                log.warning("step '%s': retry_if raised %r; the failure is final", op.name, error)
                return False
            if not again:
                return False
        return True

    def token(self, run: RunState, op: StepOp) -> str:
        return make_token(run.wid, run.run_no, op.seq, op.attempt, run.started.seed)


def _release(op: StepOp) -> None:
    """The attempt ended: its permit goes back, its heartbeat watchdog stops."""
    beat = op.beat
    if beat is not None:
        beat.end()
    permit = op.permit
    if permit is not None:
        op.permit = None
        permit.release()


def _causes(exc: BaseException | None) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and len(out) < 32:
        out.append(exc)
        exc = exc.__cause__
    return out


def _chain(failure: Failure | None) -> list[Failure]:
    out = []
    while failure is not None:
        out.append(failure)
        failure = failure.cause
    return out


async def _attempt(awaitable: Any, op: StepOp) -> Any:
    timeout_ms = op.timeout_ms
    if timeout_ms is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, timeout_ms / 1000)
    except TimeoutError:
        # A thread cannot be stopped: it keeps its step thread until its function returns
        # (docs/engine.md); its step context tells it to give up.
        if op.context is not None:
            op.context.cancelled = True
        raise errors.TimeoutError(f"the attempt took longer than its timeout ({timeout_ms} ms)") from None


FENCED = "this worker was stopped longer than the server waits: its leases are gone"


class _Fenced(Exception):
    """A step thread found its process fenced before calling the step function."""


def _unless_fenced(store: ShardStore, fn: Callable[..., Any], *args: Any) -> Any:
    # Checked again on the thread, just before the call: a thread step queued before the
    # process was stopped starts only after it woke, maybe before the loop read a byte.
    if store.fenced():
        raise _Fenced
    return fn(*args)
