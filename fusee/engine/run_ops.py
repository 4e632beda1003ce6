"""Run operations that repair a run: `reset(before_step)`, `retry()` from the failed step,
and `resume()` of a run paused by a step out of retries (docs/run-operations.md).

A reset begins the ID's next run from a copy of the current run's journal cut just
before the named step's first record, followed by a `Reset` record (who asked, from
which run) and the signals received after the cut. The copy is appended under the new
run's number, so recovery finds the new run whole in the log like any other (a run
number that changes begins a new journal, as after a continue-as-new) and the old run's
records after the cut are superseded. The new run replays the copy, then goes live: the
steps after the cut run again, with new idempotency keys (`ctx.key()` includes the run).

What the copy sent out is not sent again: the answers the old run got after the cut (a
child's start and result, a signal's delivery, a completion) follow the Reset record, so
nothing waits for an answer already given; a message still unanswered keeps its outbox
number, now owned by the new run, and its answer goes there; and a child still running
names the old run as its parent, so the new run takes results naming the run its copy
came from (`RunState.inherited`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from fusee import _names as names
from fusee import journal as R
from fusee._audit import requester
from fusee._errors import FuseeError, NotFoundError, RejectedError
from fusee._sealing import seal_rec
from fusee.engine.run import RunState, stop_step
from fusee.journal import FINAL, Msg, Status
from fusee.workflow.ops import StepOp

if TYPE_CHECKING:
    from fusee.engine.loader import StoredRun
    from fusee.engine.shard import Shard

# The records a step (or an async completion, whose send function runs as a step) writes:
# a reset cuts before the first of them.
_STEP_RECORDS = (R.StepDone, R.Attempt, R.StepFailed, R.Resume, R.CompletionSent)


def paused_step(state: RunState) -> StepOp | None:
    """The step waiting for `resume()`, if the run has one (a cancel may have ended it)."""
    seq = state.paused
    if seq is None or state.final:
        return None
    op = state.ops.get(seq)
    return op if isinstance(op, StepOp) and not op.done else None


def shown_status(state: RunState | StoredRun) -> Status:
    """A run's status as answers show it: a loaded run with a paused step is `paused`,
    and so is one waiting for its code whose journal ends paused."""
    if isinstance(state, RunState):
        if paused_step(state) is not None:
            return Status.PAUSED
        if state.status == Status.WAITING_FOR_CODE and R.pauses(state.journal):
            return Status.PAUSED
    return R.STATUS_OF[state.status]


async def _refuse(shard: Shard, error: FuseeError) -> NoReturn:
    # A refusal rests on what this process has seen: it leaves once that is durable.
    await shard.durable_at(shard.durability.appended)
    raise error


async def _current(shard: Shard, wid: str) -> RunState | StoredRun:
    """The ID's current run: loaded (a parked one is loaded), else the finished one the
    index keeps."""
    state = await shard.load(wid)
    if state is not None:
        shard.turn(state)  # as it is after its first turn, not before
        return state
    stored = await shard.finished_run(wid)
    if stored is None:
        await _refuse(shard, NotFoundError(f"no workflow '{wid}'", workflow_id=wid))
    assert stored is not None
    return stored


async def reset(shard: Shard, wid: str, before_step: str, reapply_signals: bool = True) -> int:
    """Begin a new run of `wid` from before step `before_step`; its run number."""
    names.name(before_step, "reset step")
    if type(reapply_signals) is not bool:
        raise RejectedError(f"reset(reapply_signals={reapply_signals!r}): expected a bool")
    state = await _current(shard, wid)
    cut = _cut(state, before_step, None)
    if cut is None:
        steps = sorted({r.name for r in state.journal if isinstance(r, _STEP_RECORDS)})
        await _refuse(
            shard,
            RejectedError(
                f"reset: run {state.run_no} of workflow '{wid}' has no step '{before_step}' "
                f"(its steps: {', '.join(steps) or 'none yet'})"
            ),
        )
    assert cut is not None
    return await _begin_from(shard, state, cut, before_step, reapply_signals)


async def retry(shard: Shard, wid: str) -> int:
    """Reset a failed run to before the step whose failure failed it; the new run's number."""
    state = await _current(shard, wid)
    status = shown_status(state)
    if status != Status.FAILED:
        await _refuse(
            shard,
            RejectedError(
                f"retry: workflow '{wid}' has not failed (it is {status}); retry() is for a failed "
                "run (a paused one takes resume(), any other reset(before_step=))"
            ),
        )
    failed = next((r for r in reversed(state.journal) if isinstance(r, R.StepFailed)), None)
    if failed is None:
        await _refuse(
            shard,
            RejectedError(
                f"retry: workflow '{wid}' failed in its own code, not in a step; "
                "reset(before_step=...) names where to start again"
            ),
        )
    assert failed is not None
    cut = _cut(state, failed.name, failed.seq)
    assert cut is not None  # the StepFailed itself is such a record
    return await _begin_from(shard, state, cut, failed.name, True)


async def resume(shard: Shard, wid: str) -> None:
    """Run the paused step again with a fresh set of attempts; returns once the Resume
    record is durable."""
    state = await _current(shard, wid)
    if isinstance(state, RunState) and state.status == Status.WAITING_FOR_CODE:
        # The Resume record is all a resume writes: the engine that has the code replays
        # it and runs the step again (the CLI on a directory its application closed).
        paused = R.paused_attempts(state.journal)
        if paused:
            attempt = paused[max(paused)]  # the latest, as a loaded run's `paused` is
            # Recorded, not driven: there is no code here to run the step with.
            state.record(R.Resume(attempt.seq, attempt.name, attempt.attempt, requester()))
            await shard.durable_at(state.last_lsn)
            return
    if isinstance(state, RunState) and state.status == Status.STUCK:
        await _refuse(
            shard,
            RejectedError(f"resume: workflow '{wid}' cannot run here now ({state.status}); fix that first"),
        )
    op = paused_step(state) if isinstance(state, RunState) else None
    if op is None:
        await _refuse(
            shard,
            RejectedError(
                f"resume: workflow '{wid}' has no step paused out of retries "
                f"(it is {shown_status(state)}); only a paused run resumes"
            ),
        )
    assert op is not None and isinstance(state, RunState)
    last = op.attempt - 1 + op.attempts_before  # the journal's number of its last attempt
    state.event(R.Resume(op.seq, op.name, last, requester()))
    await shard.durable_at(state.last_lsn)


def _cut(state: RunState | StoredRun, step: str, seq: int | None) -> int | None:
    """Where the copy ends: just before the step's first record. A step that has none yet
    (its first attempt running) cuts at the end of a run that has not ended."""
    for index, rec in enumerate(state.journal):
        if isinstance(rec, _STEP_RECORDS) and rec.name == step and (seq is None or rec.seq == seq):
            return index
    if isinstance(state, RunState) and not state.final:
        if any(isinstance(op, StepOp) and op.name == step and not op.done for op in state.ops.values()):
            return len(state.journal)
    return None


_ISSUED_OUT = (R.ChildRequested, R.SignalSent, R.CancelSent, R.CompletionSent)
_ANSWERS = (R.ChildStarted, R.Delivered, R.ChildResult, R.Completed)


def _carried(copy: list[R.Rec], after: list[R.Rec], reapply_signals: bool) -> list[R.Rec]:
    """The records after the cut the new run takes, in their order: the signals (unless
    not reapplied), and the answers to what the copy sent out (a child's start and
    result, a signal's or cancel's delivery, an async completion): those were answered
    once, to the old run, and are not asked again."""
    sent = {r.seq for r in copy if isinstance(r, _ISSUED_OUT)}
    out: list[R.Rec] = []
    for rec in after:
        if isinstance(rec, R.SignalReceived) and reapply_signals:
            out.append(rec)
        elif isinstance(rec, _ANSWERS) and rec.seq in sent:
            out.append(rec)
    return out


def _append_copy(shard: Shard, wid: str, run_no: int, started: R.Started, records: list[R.Rec]) -> None:
    """Stage the new run's records (before its state exists: replaying them builds it).
    The outbox takes each as on any append, but what they send leaves only once the whole
    copy is staged: a message whose answer follows in the copy is no longer pending by
    then, and is not sent again (sent at once, a child would be started a second time).
    One still unanswered goes out again under its number, now the new run's."""
    durability = shard.durability
    out: list[Msg] = []
    lsn = durability.appended
    codec = shard.engine.codec
    for rec in records:
        lsn = durability.stage(
            R.encode_entry(R.Entry(wid, run_no, rec if codec is None else seal_rec(codec, rec)))
        )
        sent = shard.outbox.note(wid, run_no, rec, started.parent)
        if sent is not None:
            out += sent if isinstance(sent, list) else [sent]
        durability.made(lsn)
    if out:
        shard.messages.send_when_durable(lsn, out)


async def _begin_from(
    shard: Shard, state: RunState | StoredRun, cut: int, step: str, reapply_signals: bool
) -> int:
    started = state.journal[0]
    assert isinstance(started, R.Started)
    wid = state.wid
    copy = state.journal[:cut]
    records = [
        *copy,
        R.Reset(state.run_no, step, requester(), reapply_signals),
        *_carried(copy, state.journal[cut:], reapply_signals),
    ]
    if isinstance(state, RunState):
        if shard.runs.get(wid) is not state:
            await _refuse(shard, RejectedError(f"reset: workflow '{wid}' moved on meanwhile; try again"))
        _retire(shard, state)
    shard.index_entries.pop(wid)  # a finished run's entry: the new run is the ID's now
    run_no = state.run_no + 1
    _append_copy(shard, wid, run_no, started, records)
    # Replayed against the copy, then live: it runs on from the cut. Result waiters wait
    # by workflow ID, so callers of `result()` get the new run's outcome.
    new = shard.revive(wid, run_no, records)
    await shard.durable_at(shard.durability.appended)
    return new.run_no


def _retire(shard: Shard, state: RunState) -> None:
    """Stop the run a reset replaces, writing nothing: the new run's records supersede its
    journal (a crash before they are durable finds it as it was). Its running steps are
    stopped and their results discarded; its children stay (the copy is attached to them)."""
    shard.callers.refuse_updates(state)
    if state.status not in FINAL:
        state.status = Status.CONTINUED  # final, not ended: the ID's next run holds it
    state.final = True
    state.timers.clear()
    for op in state.ops.values():
        if not op.done:
            stop_step(op)
    state.ready.clear()
    state.close_fibers()
    shard.timers.forget(state)
    shard.ready.discard(state)
    del shard.runs[state.wid]
