"""What each journal record does to a run: one function per record kind (`started`,
`step_done`, `timer_fired`...), found through `APPLY` by the record's type.

The same functions apply a record live (after it was appended) and on replay, which is
what makes replay exact: a run's state is what these functions made of its journal. They
reach the run through `AppliedRun`, what of it they read and change, so this file does
not import `run.py` (which dispatches to them: `APPLY[type(rec)](run, rec)`, one dict
lookup and one call on every step's path, as the bound-method lookup it replaces).
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from fusee import _codec as codec
from fusee import _errors as errors
from fusee import journal as R
from fusee._errors import ChildError, CodecError, FuseeError, StepError, error_from
from fusee.engine import streams
from fusee.journal import Status
from fusee.workflow.definitions import Workflow
from fusee.workflow.driver import Driver
from fusee.workflow.ops import ChildOp, ContinueAsNew, Op, SendOp, StepOp, StepState, WaitOp, WatchOp

log = logging.getLogger("fusee")


class Stuck(BaseException):
    """Unwinds workflow code whose run stopped on a determinism error."""


class _RunTimers(Protocol):
    def add(self, due: int, run: Any, seq: int) -> None: ...


class _Shard(Protocol):
    @property
    def timers(self) -> _RunTimers: ...
    def update_finished(self, run: Any, rec: R.UpdateDone) -> None: ...


class AppliedRun(Driver, Protocol):
    """What the appliers read and change of a run (`fusee/engine/run.py`'s `RunState`),
    beyond what `ctx` reads of it (`Driver`)."""

    ctx: Any
    replaying: bool
    ops: dict[int, Op]
    timers: dict[int, int]
    signals: dict[str, deque[bytes]]
    waits: dict[str, deque[WaitOp]]
    signal_ids: set[str]
    compensating: bool
    cancel_reason: str | None
    updates_accepted: set[str]
    update_results: dict[str, R.UpdateDone]
    children: dict[int, str]
    code_outcome: tuple[Any, BaseException | None] | None
    paused: int | None
    pending_start: list[Op]
    inherited: dict[int, int]
    attrs: dict[str, Any]
    streams: dict[str, streams.StreamState]

    @property
    def shard(self) -> _Shard: ...
    def spawn(
        self, coro: Coroutine[Any, Any, Any], on_done: Callable[[Any, BaseException | None], None]
    ) -> None: ...
    def resolve_decoded(self, op: Op, data: bytes, type_: Any, what: str) -> None: ...
    def main_done(self, value: Any, exc: BaseException | None) -> None: ...
    def stuck(self, message: str) -> None: ...
    def ended(self, rec: R.Finished | R.ContinuedAsNew) -> None: ...


def _verify(run: AppliedRun, rec: Any) -> Op | None:
    op = run.ops.get(rec.seq)
    if op is None:
        kind, name = R.op_of(rec)
        run.stuck(f"the journal recorded {kind} '{name}' at position {rec.seq} but the code did not call it")
    return op


def started(run: AppliedRun, rec: R.Started) -> None:
    from fusee.workflow.ctx import Ctx

    wf = run.workflow
    assert wf is not None
    run.ctx = Ctx(run)
    run.spawn(_main(run, wf, rec.input), run.main_done)
    if rec.deadline:
        run.timers[-1] = rec.deadline
    if rec.update_id is not None and rec.update_name is not None:
        update_accepted(run, R.UpdateAccepted(rec.update_id, rec.update_name, rec.update_arg or b"null"))


def step_done(run: AppliedRun, rec: R.StepDone) -> None:
    op = run.ops.get(rec.seq)
    if op is None:
        op = _verify(run, rec)
    if isinstance(op, StepOp):
        try:  # resolve_decoded, inlined: this is every step's path
            value = decode(rec.value, op.output or codec.return_type(op.fn), "step")
        except CodecError:
            run.resolve_decoded(op, rec.value, op.output or codec.return_type(op.fn), "step")
            return
        run.resolve(op, value)


def attempt(run: AppliedRun, rec: R.Attempt) -> None:
    op = _verify(run, rec)
    if isinstance(op, StepOp):
        if rec.attempt == 1 or not op.first_failure_at:
            op.first_failure_at = rec.failed_at or rec.retry_at
        op.attempt = rec.attempt - op.attempts_before + 1
        op.retry_at = rec.retry_at
        if rec.paused:
            # No timer: only `resume()` runs it again (a Resume record). The run waits as
            # a suspended one does, and may park.
            op.state = StepState.PAUSED
            run.paused = op.seq
            return
        op.state = StepState.IDLE
        if not run.replaying:
            run.timers[op.seq] = rec.retry_at
            run.shard.timers.add(rec.retry_at, run, op.seq)


def resume(run: AppliedRun, rec: R.Resume) -> None:
    """The paused step runs again with a fresh set of attempts: the function sees attempt
    1 again and `max_elapsed` counts from now; the journal numbers on after `rec.attempt`."""
    op = _verify(run, rec)
    if isinstance(op, StepOp):
        op.attempts_before = rec.attempt
        op.attempt = 1
        op.first_failure_at = 0
        op.retry_at = 0
        op.state = StepState.IDLE
        run.paused = None
        if not run.replaying:
            run.pending_start.append(op)  # started after this turn, behind the durability gate


def heartbeat(run: AppliedRun, rec: R.Heartbeat) -> None:
    """The step's progress is the record's: what `s.progress()` returns to its next
    attempt after a crash or a handback (fusee/engine/heartbeats.py)."""
    op = _verify(run, rec)
    if isinstance(op, StepOp):
        op.progress = rec.progress


def reset(run: AppliedRun, rec: R.Reset) -> None:
    """Where a reset's copy of the previous run ends. The children the copy started and
    that are still running, and the completion tokens it handed out and that are still
    out, name run `rec.run` (or an earlier one, for a copy of a copy): this run takes
    their results."""
    for seq in run.children:
        run.inherited.setdefault(seq, rec.run)
    for op in run.ops.values():
        if isinstance(op, StepOp) and op.state is StepState.SENT and not op.done:
            run.inherited.setdefault(op.seq, rec.run)


def step_failed(run: AppliedRun, rec: R.StepFailed) -> None:
    op = _verify(run, rec)
    if op is not None:
        run.resolve(op, None, StepError(rec.name, rec.failure))


def issued(run: AppliedRun, rec: R.Rec) -> None:
    """An issued record (TimerStarted, WaitStarted, Drawn, ChildRequested, SignalSent,
    CancelSent): only checked against the operation the code called at its position."""
    _verify(run, rec)


def timer_fired(run: AppliedRun, rec: R.TimerFired) -> None:
    op = _verify(run, rec)
    if isinstance(op, WaitOp):
        queue = run.waits.get(op.name)
        if queue and op in queue:
            queue.remove(op)
    if op is not None:
        run.resolve(op, None)


def signal_received(run: AppliedRun, rec: R.SignalReceived) -> None:
    if rec.id is not None:
        run.signal_ids.add(rec.id)
    queue = run.waits.get(rec.name)
    while queue:
        op = queue.popleft()
        if not op.done:
            run.resolve_decoded(op, rec.value, op.type, "signal")
            return
    run.signals.setdefault(rec.name, deque()).append(rec.value)


def cancel_requested(run: AppliedRun, rec: R.CancelRequested) -> None:
    """Cancellation reaches the code as CancelledError at every operation it waits on;
    what the code does then (compensate, finish) is its own. Compensations already
    running are the answer to a cancel: a second one leaves them alone."""
    if run.compensating:
        return
    run.cancel_reason = rec.reason or "cancelled"
    for op in list(run.ops.values()):
        if not op.done:
            _cancel_op(run, op)
    for watchers in run.child_watchers.values():
        for watch in watchers:
            _cancel_op(run, watch)


def _cancel_op(run: AppliedRun, op: Op) -> None:
    stop_step(op)
    run.resolve(op, None, errors.CancelledError(f"cancelled: {run.cancel_reason}", None, workflow_id=run.wid))


def patch_marker(run: AppliedRun, rec: R.Patched) -> None:
    """Nothing to apply: the replay read every marker before the code ran, and live the
    code recorded it (fusee/engine/patches.py)."""


def attributes_set(run: AppliedRun, rec: R.AttributesSet) -> None:
    """Replayed (live, the code merged them as it recorded them): what the journal holds."""
    R.merge_attributes(run.attrs, rec.attrs)


def update_accepted(run: AppliedRun, rec: R.UpdateAccepted) -> None:
    run.updates_accepted.add(rec.id)
    handler = run.update_handlers.get(rec.name)
    if handler is None:
        run.pending_updates.setdefault(rec.name, []).append(rec)
        return
    run.start_update(rec)


def update_done(run: AppliedRun, rec: R.UpdateDone) -> None:
    run.update_results[rec.id] = rec
    if not run.replaying:
        run.shard.update_finished(run, rec)


def child_started(run: AppliedRun, rec: R.ChildStarted) -> None:
    op = _verify(run, rec)
    if isinstance(op, ChildOp):
        if rec.failure is not None:
            run.resolve(op, None, error_from(rec.failure))
        else:
            from fusee.workflow.ctx import ChildHandle

            run.children[op.seq] = op.wid
            run.resolve(op, ChildHandle(run, op))


def child_result(run: AppliedRun, rec: R.ChildResult) -> None:
    run.child_results[rec.seq] = rec
    run.children.pop(rec.seq, None)
    for watch in run.child_watchers.pop(rec.seq, []):
        run.resolve_child_watch(watch, rec)


def child_watch_result(run: AppliedRun, watch: WatchOp, rec: R.ChildResult) -> None:
    """A watch on a child (`ChildHandle.result`) resolved with the child's recorded end."""
    op = run.ops.get(rec.seq)
    if rec.failure is not None:
        wid = op.wid if isinstance(op, ChildOp) else "?"
        run.resolve(watch, None, ChildError(wid, rec.failure))
    else:
        type_ = op.result_type if isinstance(op, ChildOp) else Any
        run.resolve_decoded(watch, rec.value or b"null", type_, "the result of")


def delivered(run: AppliedRun, rec: R.Delivered) -> None:
    op = _verify(run, rec)
    if isinstance(op, SendOp):
        run.resolve(op, None, error_from(rec.failure) if rec.failure else None)


def completion_sent(run: AppliedRun, rec: R.CompletionSent) -> None:
    op = _verify(run, rec)
    if isinstance(op, StepOp):
        op.state = StepState.SENT
        op.retry_at = 0


def completed(run: AppliedRun, rec: R.Completed) -> None:
    op = _verify(run, rec)
    if op is not None:
        if rec.failure is not None:
            run.resolve(op, None, StepError(op.name, rec.failure))
        else:
            run.resolve_decoded(op, rec.value or b"null", getattr(op, "output", None), "completion")


def finished(run: AppliedRun, rec: R.Finished) -> None:
    if run.replaying and rec.status not in (Status.TERMINATED, Status.TIMED_OUT) and run.code_outcome is None:
        run.stuck(f"the journal records the run ended ({rec.status}) but the code did not end there")
        return
    run.ended(rec)


def continued_as_new(run: AppliedRun, rec: R.ContinuedAsNew) -> None:
    if run.replaying and run.code_outcome is None:
        run.stuck("the journal records continue_as_new but the code did not call it there")
        return
    run.ended(rec)


APPLY: dict[type, Callable[[AppliedRun, Any], None]] = {
    R.Started: started,
    R.StepDone: step_done,
    R.Attempt: attempt,
    R.StepFailed: step_failed,
    R.Resume: resume,
    R.Heartbeat: heartbeat,
    R.Reset: reset,
    R.TimerStarted: issued,
    R.TimerFired: timer_fired,
    R.WaitStarted: issued,
    R.SignalReceived: signal_received,
    R.Drawn: issued,
    R.CancelRequested: cancel_requested,
    R.Patched: patch_marker,
    R.AttributesSet: attributes_set,
    R.StreamChunk: streams.chunk_applied,
    R.StreamEnd: streams.end_applied,
    R.UpdateAccepted: update_accepted,
    R.UpdateDone: update_done,
    R.ChildRequested: issued,
    R.ChildStarted: child_started,
    R.ChildResult: child_result,
    R.SignalSent: issued,
    R.CancelSent: issued,
    R.Delivered: delivered,
    R.CompletionSent: completion_sent,
    R.Completed: completed,
    R.Finished: finished,
    R.ContinuedAsNew: continued_as_new,
}


# -- shared with run.py --------------------------------------------------------------------


def stop_step(op: Op) -> None:
    """Stop a step's attempt: an async one is cancelled; a thread cannot be, so its step
    context says `cancelled` for the function to see."""
    task = getattr(op, "task", None)
    if task is not None:
        task.cancel()
        # A task cancelled before its first turn never awaits the function's coroutine:
        # close it, or it is reported as never awaited when it is collected.
        awaitable = getattr(op, "awaitable", None)
        if inspect.iscoroutine(awaitable) and inspect.getcoroutinestate(awaitable) == inspect.CORO_CREATED:
            awaitable.close()
    context = getattr(op, "context", None)
    if context is not None:
        context.cancelled = True


def decode(data: bytes, type_: Any, what: str) -> Any:
    return codec.decode(data, type_ if type_ is not None else Any, what)


async def maybe_await(value: Any) -> Any:
    if hasattr(value, "__await__"):
        return await value
    return value


async def _main(run: AppliedRun, wf: Workflow[Any], input: bytes) -> Any:
    """The workflow's code, then its compensations, newest first, if it failed or was
    cancelled (never after terminate: that closes the coroutine)."""
    ctx = run.ctx
    try:
        if run.started.not_before:
            # A delayed start: a durable sleep, the journal's first operation.
            await ctx.sleep_until("fusee.delay", run.started.not_before)
        if wf.takes_input:
            arg = codec.decode(input, wf.input_type, "the workflow's input")
            return await wf.fn(ctx, arg)
        return await wf.fn(ctx)
    except (ContinueAsNew, Stuck, GeneratorExit):
        raise  # GeneratorExit: the run ended (terminate) and its coroutine is being closed
    except Exception:
        run.compensating = bool(run.compensations)
        while run.compensations:
            name, fn, options = run.compensations.pop()
            try:
                await ctx.step(name, fn, **options)
            except FuseeError as error:
                log.warning("compensation '%s' of run '%s' failed: %s", name, run.wid, error)
        raise
