"""What a journal says a run waits on, derived from its records alone (not from the
engine's state): its live timers, its open waits, the outside events that can wake it,
and the step attempts it recorded. The checks compare the engine against this."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fusee import _records as R

FINAL = ("ok", "failed", "cancelled", "timed_out", "terminated", "continued")


@dataclass
class Reading:
    """One run's journal, read."""

    deadline: int = 0
    final: bool = False
    status: str = "running"
    timers: dict[int, int] = field(default_factory=dict)  # seq -> due (-1: the deadline)
    signal_waits: dict[int, str] = field(default_factory=dict)  # open waits without timeout
    completions: set[int] = field(default_factory=set)  # tokens out, not completed
    children: dict[int, str] = field(default_factory=dict)  # started, no result yet
    child_starts: dict[int, str] = field(default_factory=dict)  # requested, not answered
    sends: set[int] = field(default_factory=set)  # signal/cancel sent, not delivered
    outcomes: list[tuple[int, int, str]] = field(default_factory=list)  # (seq, attempt, kind)
    step_values: dict[int, bytes] = field(default_factory=dict)
    signals: list[bytes] = field(default_factory=list)
    updates_done: dict[str, R.UpdateDone] = field(default_factory=dict)
    updates_accepted: set[str] = field(default_factory=set)
    completed: set[int] = field(default_factory=set)
    cancel_requests: int = 0
    step_names: list[str] = field(default_factory=list)
    delivered_signals: list[tuple[str, bytes]] = field(default_factory=list)  # (target, value)
    child_ids: list[str] = field(default_factory=list)
    ambiguous: bool = False  # a kept signal met a wait with an unrecorded position before it
    prefixes: set[str] = field(default_factory=set)  # of named operations: "s" right code, "x" changed


def read(journal: list[R.Rec]) -> Reading:
    out = Reading()
    buffered: dict[str, deque[bytes]] = {}
    waits: dict[str, deque[int]] = {}
    attempts: dict[int, int] = {}
    sent: dict[int, R.SignalSent] = {}

    def resolve(seq: int) -> None:
        out.timers.pop(seq, None)
        out.signal_waits.pop(seq, None)
        for queue in waits.values():
            if seq in queue:
                queue.remove(seq)

    positions: set[int] = set()
    for rec in journal:
        if isinstance(getattr(rec, "seq", None), int):
            positions.add(rec.seq)  # type: ignore[attr-defined]
        name = getattr(rec, "name", None)
        if isinstance(rec, (R.StepDone, R.Attempt, R.StepFailed, R.TimerStarted, R.CompletionSent)):
            if name and name != "upd":
                out.prefixes.add(name[0])
        if isinstance(rec, R.Started):
            out.deadline = rec.deadline
            if rec.deadline:
                out.timers[-1] = rec.deadline
            if rec.update_id is not None:
                out.updates_accepted.add(rec.update_id)
        elif isinstance(rec, R.TimerStarted):
            out.timers[rec.seq] = rec.due
        elif isinstance(rec, R.TimerFired):
            resolve(rec.seq)
        elif isinstance(rec, R.WaitStarted):
            queue = buffered.get(rec.signal)
            if queue:
                queue.popleft()  # a kept signal: resolved at once
                # (unless an earlier wait took it and never recorded its position: a known
                # defect after a recovery; then which wait it resolved is unknown)
                if set(range(rec.seq)) - positions:
                    out.ambiguous = True
            else:
                waits.setdefault(rec.signal, deque()).append(rec.seq)
                if rec.due:
                    out.timers[rec.seq] = rec.due
                else:
                    out.signal_waits[rec.seq] = rec.signal
        elif isinstance(rec, R.SignalReceived):
            out.signals.append(rec.value)
            queue_w = waits.get(rec.name)
            if queue_w:
                resolve(queue_w[0])
            else:
                buffered.setdefault(rec.name, deque()).append(rec.value)
        elif isinstance(rec, R.CancelRequested):
            out.cancel_requests += 1
            deadline = out.timers.get(-1)
            out.timers.clear()
            if deadline:
                out.timers[-1] = deadline
            out.signal_waits.clear()
            waits.clear()
            out.completions.clear()
        elif isinstance(rec, R.Attempt):
            attempts[rec.seq] = rec.attempt
            out.outcomes.append((rec.seq, rec.attempt, "Attempt"))
            out.timers[rec.seq] = rec.retry_at
            out.step_names.append(rec.name)
        elif isinstance(rec, (R.StepDone, R.StepFailed)):
            out.outcomes.append((rec.seq, attempts.get(rec.seq, 0) + 1, type(rec).__name__))
            out.timers.pop(rec.seq, None)
            out.completions.discard(rec.seq)
            out.step_names.append(rec.name)
            if isinstance(rec, R.StepDone):
                out.step_values[rec.seq] = rec.value
        elif isinstance(rec, R.CompletionSent):
            out.timers.pop(rec.seq, None)
            out.completions.add(rec.seq)
        elif isinstance(rec, R.Completed):
            out.completions.discard(rec.seq)
            out.completed.add(rec.seq)
        elif isinstance(rec, R.ChildRequested):
            out.child_starts[rec.seq] = rec.id
            out.child_ids.append(rec.id)
        elif isinstance(rec, R.ChildStarted):
            wid = out.child_starts.pop(rec.seq, "?")
            if rec.failure is None:
                out.children[rec.seq] = wid
        elif isinstance(rec, R.ChildResult):
            out.children.pop(rec.seq, None)
        elif isinstance(rec, R.SignalSent):
            out.sends.add(rec.seq)
            sent[rec.seq] = rec
        elif isinstance(rec, R.CancelSent):
            out.sends.add(rec.seq)
        elif isinstance(rec, R.Delivered):
            out.sends.discard(rec.seq)
            if rec.failure is None and rec.seq in sent:
                out.delivered_signals.append((sent[rec.seq].target, sent[rec.seq].value))
        elif isinstance(rec, R.UpdateAccepted):
            out.updates_accepted.add(rec.id)
        elif isinstance(rec, R.UpdateDone):
            out.updates_done[rec.id] = rec
        elif isinstance(rec, R.Finished):
            out.final, out.status = True, rec.status
        elif isinstance(rec, R.ContinuedAsNew):
            out.final, out.status = True, "continued"
    if out.final:
        out.timers.clear()
        out.signal_waits.clear()
        out.completions.clear()
    return out


def live_due(reading: Reading) -> int:
    """The run's earliest live timer (0: none)."""
    return min(reading.timers.values(), default=0)


def wakeable(reading: Reading) -> list[str]:
    """What outside the run can wake it: a signal, a completion, a child still running."""
    out = [f"signal '{name}' (position {seq})" for seq, name in reading.signal_waits.items()]
    out += [f"completion at position {seq}" for seq in reading.completions]
    out += [f"child '{wid}'" for wid in reading.children.values()]
    return out
