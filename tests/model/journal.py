"""What a journal says a run waits on, derived from its records alone (not from the
engine's state): its live timers, its open waits, the outside events that can wake it,
and the step attempts it recorded. The checks compare the engine against this."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fusee import journal as R

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
    """Read a journal in order, as the run applied it."""
    reader = _Reader()
    for rec in journal:
        reader.apply(rec)
    out = reader.out
    if out.final:
        out.timers.clear()
        out.signal_waits.clear()
        out.completions.clear()
    return out


class _Reader:
    """One method per record kind, as the run has (fusee/engine/run.py)."""

    def __init__(self) -> None:
        self.out = Reading()
        self.buffered: dict[str, deque[bytes]] = {}  # signals no wait took yet
        self.waits: dict[str, deque[int]] = {}  # open waits per signal, oldest first
        self.attempts: dict[int, int] = {}
        self.sent: dict[int, R.SignalSent] = {}
        self.positions: set[int] = set()

    def apply(self, rec: R.Rec) -> None:
        seq = getattr(rec, "seq", None)
        if isinstance(seq, int):
            self.positions.add(seq)
        name = getattr(rec, "name", None)
        if isinstance(rec, _NAMED) and name and name != "upd":
            self.out.prefixes.add(name[0])
        handler = getattr(self, "_on_" + type(rec).__name__, None)
        if handler is not None:
            handler(rec)

    def _resolve(self, seq: int) -> None:
        self.out.timers.pop(seq, None)
        self.out.signal_waits.pop(seq, None)
        for queue in self.waits.values():
            if seq in queue:
                queue.remove(seq)

    def _on_Started(self, rec: R.Started) -> None:
        self.out.deadline = rec.deadline
        if rec.deadline:
            self.out.timers[-1] = rec.deadline
        if rec.update_id is not None:
            self.out.updates_accepted.add(rec.update_id)

    def _on_TimerStarted(self, rec: R.TimerStarted) -> None:
        self.out.timers[rec.seq] = rec.due

    def _on_TimerFired(self, rec: R.TimerFired) -> None:
        self._resolve(rec.seq)

    def _on_WaitStarted(self, rec: R.WaitStarted) -> None:
        queue = self.buffered.get(rec.signal)
        if queue:
            queue.popleft()  # a kept signal: resolved at once
            # (unless an earlier wait took it and never recorded its position, as after a
            # recovery before the fix: then which wait it resolved is unknown)
            if set(range(rec.seq)) - self.positions:
                self.out.ambiguous = True
            return
        self.waits.setdefault(rec.signal, deque()).append(rec.seq)
        if rec.due:
            self.out.timers[rec.seq] = rec.due
        else:
            self.out.signal_waits[rec.seq] = rec.signal

    def _on_SignalReceived(self, rec: R.SignalReceived) -> None:
        self.out.signals.append(rec.value)
        queue = self.waits.get(rec.name)
        if queue:
            self._resolve(queue[0])
        else:
            self.buffered.setdefault(rec.name, deque()).append(rec.value)

    def _on_CancelRequested(self, rec: R.CancelRequested) -> None:
        """Every operation the code waits on resolves (CancelledError); the deadline stays."""
        out = self.out
        out.cancel_requests += 1
        deadline = out.timers.get(-1)
        out.timers.clear()
        if deadline:
            out.timers[-1] = deadline
        out.signal_waits.clear()
        self.waits.clear()
        out.completions.clear()

    def _on_Attempt(self, rec: R.Attempt) -> None:
        self.attempts[rec.seq] = rec.attempt
        self.out.outcomes.append((rec.seq, rec.attempt, "Attempt"))
        self.out.timers[rec.seq] = rec.retry_at
        self.out.step_names.append(rec.name)

    def _on_StepDone(self, rec: R.StepDone) -> None:
        self._step_ended(rec)
        self.out.step_values[rec.seq] = rec.value

    def _on_StepFailed(self, rec: R.StepFailed) -> None:
        self._step_ended(rec)

    def _step_ended(self, rec: R.StepDone | R.StepFailed) -> None:
        out = self.out
        out.outcomes.append((rec.seq, self.attempts.get(rec.seq, 0) + 1, type(rec).__name__))
        out.timers.pop(rec.seq, None)
        out.completions.discard(rec.seq)
        out.step_names.append(rec.name)

    def _on_CompletionSent(self, rec: R.CompletionSent) -> None:
        self.out.timers.pop(rec.seq, None)
        self.out.completions.add(rec.seq)

    def _on_Completed(self, rec: R.Completed) -> None:
        self.out.completions.discard(rec.seq)
        self.out.completed.add(rec.seq)

    def _on_ChildRequested(self, rec: R.ChildRequested) -> None:
        self.out.child_starts[rec.seq] = rec.id
        self.out.child_ids.append(rec.id)

    def _on_ChildStarted(self, rec: R.ChildStarted) -> None:
        wid = self.out.child_starts.pop(rec.seq, "?")
        if rec.failure is None:
            self.out.children[rec.seq] = wid

    def _on_ChildResult(self, rec: R.ChildResult) -> None:
        self.out.children.pop(rec.seq, None)

    def _on_SignalSent(self, rec: R.SignalSent) -> None:
        self.out.sends.add(rec.seq)
        self.sent[rec.seq] = rec

    def _on_CancelSent(self, rec: R.CancelSent) -> None:
        self.out.sends.add(rec.seq)

    def _on_Delivered(self, rec: R.Delivered) -> None:
        self.out.sends.discard(rec.seq)
        if rec.failure is None and rec.seq in self.sent:
            sent = self.sent[rec.seq]
            self.out.delivered_signals.append((sent.target, sent.value))

    def _on_UpdateAccepted(self, rec: R.UpdateAccepted) -> None:
        self.out.updates_accepted.add(rec.id)

    def _on_UpdateDone(self, rec: R.UpdateDone) -> None:
        self.out.updates_done[rec.id] = rec

    def _on_Finished(self, rec: R.Finished) -> None:
        self.out.final, self.out.status = True, rec.status

    def _on_ContinuedAsNew(self, rec: R.ContinuedAsNew) -> None:
        self.out.final, self.out.status = True, "continued"


_NAMED = (R.StepDone, R.Attempt, R.StepFailed, R.TimerStarted, R.CompletionSent)


def live_due(reading: Reading) -> int:
    """The run's earliest live timer (0: none)."""
    return min(reading.timers.values(), default=0)


def wakeable(reading: Reading) -> list[str]:
    """What outside the run can wake it: a signal, a completion, a child still running."""
    out = [f"signal '{name}' (position {seq})" for seq, name in reading.signal_waits.items()]
    out += [f"completion at position {seq}" for seq in reading.completions]
    out += [f"child '{wid}'" for wid in reading.children.values()]
    return out
