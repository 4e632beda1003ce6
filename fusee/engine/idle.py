"""When a shard is idle (docs/engine.md, *Idle, for invoked workers*), when that may change by itself,
and what a shard reports when an invoked worker lets it go (IDLE)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

import msgspec

from fusee._clock import Clock
from fusee.engine.outbox import ANSWER_WAIT_MS, Outbox
from fusee.engine.run import RunState
from fusee.journal import Status
from fusee.storage.contract import ShardStore

IDLE_DUE_MS = 250  # a shard whose next due time is nearer than this is not idle


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
    heartbeats: int
    """Step heartbeats recorded: a step that only heartbeats through a budget still
    progresses (its next attempt resumes from there), so its shard is not backed off."""
    open_ms: float
    """How long attaching the shard took (opening it, then recovery)."""
    types_without_code: list[str]
    """Workflow types with runs here that the holder had no code for."""
    handed_back: list[str]
    """Runs whose steps were still running when the shard was let go: they run again
    under the next holder (a step's result that arrives after this is dropped)."""


class IdleView(Protocol):
    """What idleness and the report read of a shard: its positions, what is under way
    (calls, loads, ready runs, a checkpoint), its loaded runs, its outbox and when it is
    next due. Read only."""

    @property
    def index(self) -> int: ...
    @property
    def store(self) -> ShardStore: ...
    @property
    def appended(self) -> int: ...
    @property
    def durable(self) -> int: ...
    @property
    def calls(self) -> int: ...
    @property
    def update_waiters(self) -> Collection[object]: ...
    @property
    def ready(self) -> Collection[RunState]: ...
    @property
    def loading(self) -> Collection[int | str]: ...
    @property
    def checkpointing(self) -> bool: ...
    @property
    def runs(self) -> Mapping[str, RunState]: ...
    @property
    def outbox(self) -> Outbox: ...
    @property
    def steps_run(self) -> int: ...
    @property
    def heartbeats(self) -> int: ...
    @property
    def open_ms(self) -> float: ...
    @property
    def types_without_code(self) -> Collection[str]: ...
    def now_ms(self) -> int: ...
    def next_due_ms(self, *, resends: bool = True) -> int: ...


def is_idle(shard: IdleView, *, housekeeping: bool = False) -> bool:
    """Nothing can make progress on the shard: every loaded run waits on a timer, a
    signal, a child, a completion or a permit the server holds the wait for (no step
    runs, no code replays); no load, call being
    answered, flush or checkpoint is under way; every message sent in the last 3 s is
    answered (an older one no longer holds the shard: its resend goes out from the
    shard's next holder); and its next due time is at least 250 ms away.

    `housekeeping`: idle but for a checkpoint under way (the shard's own upkeep once its
    runs parked, which makes no progress: `Engine.wait_idle` does not restart its grace
    for it)."""
    if (
        shard.appended > shard.durable
        or shard.calls
        or shard.update_waiters
        or shard.ready
        or shard.loading
        or (shard.checkpointing and not housekeeping)
    ):
        return False
    for run in shard.runs.values():
        if run.status == Status.RUNNING and (
            run.stepping() or run.completions or run.pending_start or run.replaying
        ):
            return False
    now = shard.now_ms()
    for pending in shard.outbox.pending.values():
        if not pending.first_sent or now - pending.first_sent < ANSWER_WAIT_MS:
            return False
    due = shard.next_due_ms(resends=False)
    return not due or due - now >= IDLE_DUE_MS


def next_change_ms(shard: IdleView) -> int:
    """When the shard may become idle or stop being idle with no event of its own: its
    next due time comes within 250 ms, or an unanswered message's 3 s run out (0:
    never). What `Engine.wait_idle` sleeps until, instead of polling."""
    at = 0
    due = shard.next_due_ms(resends=False)
    if due:
        at = due - IDLE_DUE_MS
    for pending in shard.outbox.pending.values():
        if pending.first_sent and (not at or pending.first_sent + ANSWER_WAIT_MS < at):
            at = pending.first_sent + ANSWER_WAIT_MS
    return at


def report(shard: IdleView, *, budget_ended: bool = False, handed_back: Sequence[str] = ()) -> IdleReport:
    """What an invoked worker tells the server of the shard as it leaves."""
    now = shard.now_ms()
    due = shard.next_due_ms()
    steps_running = bool(handed_back) or any(run.stepping() for run in shard.runs.values())
    return IdleReport(
        shard=shard.index,
        epoch=shard.store.epoch,
        work_left=steps_running or not is_idle(shard),
        budget_ended=budget_ended,
        next_due_ms=0 if steps_running else (max(0, due - now) if due else None),
        steps_run=shard.steps_run,
        heartbeats=shard.heartbeats,
        open_ms=shard.open_ms,
        types_without_code=sorted(shard.types_without_code),
        handed_back=list(handed_back),
    )


class Watched(Protocol):
    """What waiting for idleness needs of the engine: its shards, the event their changes
    set while someone waits (`idle_waiters` says so, so nobody else pays for it), and
    its clock."""

    idle_waiters: int

    @property
    def shards(self) -> Sequence[IdleView]: ...
    @property
    def activity(self) -> asyncio.Event: ...
    @property
    def clock(self) -> Clock: ...


async def wait_idle(engine: Watched, grace: float, timeout: float | None) -> bool:
    """`Engine.wait_idle`: True once every shard has been idle for `grace` seconds on end,
    False if `timeout` seconds pass first. Woken by the shards' own changes and by the
    clock when a shard's next due time comes within 250 ms: nothing is polled."""
    loop = asyncio.get_running_loop()
    give_up = None if timeout is None else loop.time() + timeout
    idle_since: float | None = None
    engine.idle_waiters += 1
    try:
        while True:
            engine.activity.clear()
            now = loop.time()
            # Idle but for a checkpoint under way, once per change: idle outright when no
            # shard is checkpointing (is_idle without `housekeeping` is exactly that).
            settled = all(is_idle(shard, housekeeping=True) for shard in engine.shards)
            if settled and not any(shard.checkpointing for shard in engine.shards):
                idle_since = now if idle_since is None else idle_since
                wait = idle_since + grace - now
                if wait <= 0:
                    return True
                due = _next_busy_in(engine)
                if due is not None:
                    wait = min(wait, due)
            else:
                if not settled:
                    # Progress, not a checkpoint of parked runs: the grace restarts.
                    # (A checkpoint taken because every run parked would otherwise add
                    # a whole grace to every invocation.)
                    idle_since = None
                wait = _next_busy_in(engine) or 3600.0
            if give_up is not None:
                if now >= give_up:
                    return False
                wait = min(wait, give_up - now)
            try:
                # A timeout on this task, not wait_for's: no task made per change.
                async with asyncio.timeout(max(wait, 0.001)):
                    await engine.activity.wait()
            except TimeoutError:
                pass
    finally:
        engine.idle_waiters -= 1


def _next_busy_in(engine: Watched) -> float | None:
    """Seconds until a shard's next due time comes within 250 ms, or an unanswered
    message stops holding its shard (None: neither)."""
    soonest: int | None = None
    for shard in engine.shards:
        at = next_change_ms(shard)
        if at and (soonest is None or at < soonest):
            soonest = at
    if soonest is None:
        return None
    return max(0.0, (soonest - engine.clock.now_ms()) / 1000)
