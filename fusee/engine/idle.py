"""What a shard reports when an invoked worker lets it go (spec: Invoked workers, IDLE)."""

from __future__ import annotations

import msgspec


class IdleReport(msgspec.Struct, frozen=True):
    """One shard, as its holder leaves it."""

    shard: int
    epoch: int
    """The lease the report is made under: the server counts it only under that one."""
    work_left: bool
    """Something could still progress: a step running, a run ready, a message sent less
    than 3 s ago unanswered, a timer due within 250 ms."""
    budget_ended: bool
    """The holder left because its time budget ended, not because the shard was idle."""
    next_due_ms: int | None
    """When the shard is next due, in ms from now (relative, so clocks need not agree):
    0 while a step runs (due now: its runs were handed back), None when nothing is due."""
    steps_run: int
    open_ms: float
    """How long attaching the shard took (opening it, then recovery)."""
    types_without_code: list[str]
    """Workflow types with runs here that the holder had no code for."""
    handed_back: list[str]
    """Runs whose steps were still running when the shard was let go: they run again
    under the next holder (a step's result that arrives after this is dropped)."""
