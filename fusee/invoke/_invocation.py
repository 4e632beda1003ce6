"""One invocation, from the lease to the report (docs/invoke.md, *One request*, steps 3
to 8; the Idle rule: docs/engine.md, *Idle, for invoked workers*).

Connect with `invocation=<id>` (the server grants that invocation's shards, each under a
new epoch, or refuses an unknown or finished invocation), open a fresh engine for exactly
the granted shards, run until every shard has been idle for 100 ms (then DRAIN, and answer
what was already routed) or until the budget less its margin, send one IDLE per shard and
epoch, let every shard go (flush, then checkpoint), close. Nothing outlives the call: the
engine, the connection and its pinger are opened and closed here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from fusee import _errors as errors
from fusee._log import trace_logger
from fusee.engine.engine import Engine
from fusee.engine.idle import IdleReport
from fusee.invoke._request import Exit, Invocation, ShardSummary, Summary
from fusee.protocol import messages as m
from fusee.protocol.address import Address
from fusee.storage.remote import RemoteStorage
from fusee.workflow.definitions import Workflow

IDLE_GRACE_S = 0.1  # every shard idle this long on end: a trickle of calls shares one invocation
PARK_AFTER = "50ms"  # runs park soon after they suspend: the engine is closed soon after anyway
MARGIN_MAX_S = 5.0

_trace = trace_logger("fusee.invoke.trace")
FLUSH_AFTER_S = 0.05  # a trace line waits at most this long (a cold start's first step: ~2 ms)
FINAL_EVENTS = frozenset({"answered", "refused", "dropped"})


class Unavailable(Exception):
    """The server could not be reached, refused the connection (an unknown or finished
    invocation, a wrong token) or went away before the engine was open: 502."""


class Trace:
    """`FUSEE_INVOKE_TRACE=1`: one line per invocation event on standard error
    (fusee/_log.py's trace logger). The lines are written together: when the invocation
    ends (answered, refused, dropped), or FLUSH_AFTER_S after the first line still
    waiting. A line written as its event happens costs the critical path a write to a
    pipe, and the wake-up of the process reading it (0.1 to 0.2 ms each, here, three times
    before a cold start's first step)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.began = time.monotonic()
        self.invocation = "-"
        self.lines: list[str] = []
        self.flushing: asyncio.TimerHandle | None = None

    def __call__(self, event: str, **fields: object) -> None:
        if self.enabled:
            self.at(event, time.monotonic(), **fields)

    def at(self, event: str, when: float, **fields: object) -> None:
        """`event` as it happened at `when` (time.monotonic())."""
        if not self.enabled:
            return
        elapsed_ms = (when - self.began) * 1000
        details = "".join(f" {key}={value}" for key, value in fields.items())
        self.lines.append(f"fusee invoke {self.invocation} +{elapsed_ms:.2f}ms {event}{details}")
        if event in FINAL_EVENTS:
            self.flush()
        elif self.flushing is None:
            self.flushing = asyncio.get_running_loop().call_later(FLUSH_AFTER_S, self.flush)

    def flush(self) -> None:
        if self.flushing is not None:
            self.flushing.cancel()
            self.flushing = None
        if self.lines:
            lines, self.lines = self.lines, []
            _trace.info("%s", "\n".join(lines))


class Budget:
    """Times on the event loop's clock. The work stops at `stop_at`, the budget less its
    margin (a tenth of it, at most 5 s), so that letting the shards go, the IDLE reports
    and the HTTP answer fit before `end_at`, when the server stops waiting for them."""

    def __init__(self, budget_ms: int, received_at: float, *limits: float) -> None:
        self.margin_s = min(budget_ms / 10_000, MARGIN_MAX_S)
        self.end_at = min([received_at + budget_ms / 1000, *limits])
        self.stop_at = self.end_at - self.margin_s
        self.loop = asyncio.get_running_loop()

    def left_s(self) -> float:
        """Until the work stops (0 once it has)."""
        return max(0.0, self.stop_at - self.loop.time())

    def close_deadline_s(self) -> float:
        """How long letting the shards go may take: half of what is left of the budget,
        the other half kept for the reports, the connection's close and the answer."""
        return max(0.0, (self.end_at - self.loop.time()) / 2)


async def run(
    request: Invocation,
    address: Address,
    workflows: Sequence[Workflow[Any]],
    engine_options: dict[str, Any],
    *,
    received_at: float,
    remaining_ms: int | None,
    cold: bool,
    trace: Trace,
) -> Summary:
    loop = asyncio.get_running_loop()
    try:
        storage = await RemoteStorage.connect(msgspec.structs.replace(address, invocation=request.invocation))
    except errors.ConnectionError as error:
        raise Unavailable(str(error)) from None
    # The lease says how much of the budget is left once the server granted it; the
    # platform (Lambda's context) may allow less than the budget the server was told.
    limits = [loop.time() + storage.budget_ms / 1000] if storage.budget_ms > 0 else []
    if remaining_ms is not None:
        limits.append(received_at + remaining_ms / 1000)
    budget = Budget(request.budget_ms, received_at, *limits)
    granted = sorted(storage.granted)
    not_granted = sorted(set(request.shards) - set(granted))
    if storage.conn is not None:
        trace.at("connected", storage.conn.made_at)
    trace("leased", granted=granted, not_granted=not_granted, budget_left_ms=int(budget.left_s() * 1000))
    if not granted:
        await storage.close()
        return Summary(invocation=request.invocation, cold=cold, shards=[], not_granted=not_granted)
    try:
        engine = await Engine.open(
            storage=storage,
            shard_ids=granted,
            workflows=workflows,
            park_after=PARK_AFTER,
            **engine_options,
        )
    except (errors.ConnectionError, errors.LeaseLostError) as error:
        # Engine.open let go of what it took (the storage is closed).
        raise Unavailable(f"the connection went while the shards were opening: {error}") from None
    shards = dict(engine.by_index)
    trace("opened", open_ms={i: round(s.open_ms, 1) for i, s in shards.items()})
    try:
        idle = await _until_idle(engine, storage, budget, trace)
        summaries = await _leave(engine, storage, sorted(shards), "idle" if idle else "budget", budget, trace)
    finally:
        if not engine.closed:  # an error of ours on the way: nothing more is sent
            engine.abandon()
            await storage.abandon()
    return Summary(
        invocation=request.invocation,
        cold=cold,
        shards=summaries,
        not_granted=not_granted,
    )


async def _until_idle(engine: Engine, storage: RemoteStorage, budget: Budget, trace: Trace) -> bool:
    """True once every shard was idle for 100 ms, drained, and idle again after answering
    what had been routed before the drain; False when the budget ran out first."""
    if not await engine.wait_idle(IDLE_GRACE_S, timeout=budget.left_s()):
        return False
    if trace.enabled:
        _trace_writes(storage, trace)
    held = sorted(engine.by_index)
    if not held or storage.lost is not None:
        return True  # every shard stopped: nothing to drain, each reported as a lost lease
    trace("idle", shards=held)
    try:
        async with asyncio.timeout(budget.left_s()):
            # The server's echo comes behind every call and message it routed here before;
            # from then on they wait at the server and make the shard due again once we
            # leave. No engine-side drain: nothing else routes to these shards, and a
            # message between two shards held here is better applied now than dropped.
            await storage.drain(held)
    except TimeoutError:
        return False
    except errors.ConnectionError:
        return True  # the shards heard of it and stopped
    trace("drained")
    # What arrived just before the echo has been handed to its shard by now (its task runs
    # first); idle again, no grace: nothing new can come.
    await asyncio.sleep(0)
    return await engine.wait_idle(0.0, timeout=budget.left_s())


def _trace_writes(storage: RemoteStorage, trace: Trace) -> None:
    """Each shard's first APPEND sent and first DURABLE taken, in the order they came."""
    events = [
        (when, event, store.index)
        for store in storage.stores.values()
        for event, when in (("appended", store.first_sent_at), ("durable", store.first_durable_at))
        if when
    ]
    for when, event, index in sorted(events):
        trace.at(event, when, shard=index)


async def _leave(
    engine: Engine,
    storage: RemoteStorage,
    granted: list[int],
    exit: Exit,
    budget: Budget,
    trace: Trace,
) -> list[ShardSummary]:
    """Report every held shard on the lease connection (IDLE), let each go (flush, then
    checkpoint, within the close deadline; steps still running are not waited for, their
    runs handed back), then close the engine and with it the connection."""
    if exit == "budget":
        trace("budget ended")
    held = sorted(engine.by_index)
    # IDLE goes out before the shards are let go: letting a shard go releases its lease,
    # and the server counts a report only from the holder of the epoch it names (one for
    # a lease already released closes the connection, and the shard counts as left
    # without a report, backing off). Frames keep their order, so the records a shard
    # still had to send reach the server before it is released all the same.
    reports: dict[int, IdleReport] = {}  # the ones sent
    taken: dict[int, IdleReport] = {}
    for index in held:
        taken[index] = report = engine.report(index, budget_ended=exit == "budget")
        if storage.lost is None:
            storage.idle(_idle_message(report))
            reports[index] = report
    deadline = budget.close_deadline_s()
    # Detached rather than closed with the engine: Engine.close closes the storage too.
    # A shard that fails to close is dropped by `detach` as a crash drops it.
    results = await asyncio.gather(*(engine.detach(i, deadline) for i in held), return_exceptions=True)
    summaries: dict[int, ShardSummary] = {}
    for index, result in zip(held, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
        sent = reports.get(index)
        if sent is None:
            # As it was let go (the report its close made), or as it was reported here.
            left = result if isinstance(result, IdleReport) else taken[index]
            summaries[index] = _lost(left, str(storage.lost or result))
            continue
        if isinstance(result, IdleReport):
            summaries[index] = _reported(sent, exit, result.handed_back)
        else:  # reported, but not let go of cleanly: its next holder recovers from the log
            summaries[index] = _reported(sent, exit, [])
            summaries[index].error = str(result)
    for index in granted:
        if index not in summaries:  # stopped while running: a lost lease or a refused write
            summaries[index] = _lost(engine.report(index), str(engine.stop_error(index) or "stopped"))
    for summary in summaries.values():
        trace(
            "left",
            shard=summary.shard,
            exit=summary.exit.replace(" ", "-"),
            steps=summary.steps_run,
            next_due_ms=summary.next_due_ms,
        )
    await engine.close(0.0)  # no shard left: closes the connection
    trace("closed")
    return [summaries[i] for i in sorted(summaries)]


def _idle_message(report: IdleReport) -> m.Idle:
    return m.Idle(
        report.shard,
        report.epoch,
        next_due_ms=report.next_due_ms,
        work_left=report.work_left,
        budget_ended=report.budget_ended,
        steps=report.steps_run,
        open_ms=report.open_ms,
        types_without_code=list(report.types_without_code),
        heartbeats=report.heartbeats,
    )


def _reported(report: IdleReport, exit: Exit, handed_back: list[str]) -> ShardSummary:
    return ShardSummary(
        shard=report.shard,
        epoch=report.epoch,
        exit=exit,
        runs_advanced=None,  # not counted: see ShardSummary.runs_advanced
        steps_run=report.steps_run,
        open_ms=round(report.open_ms, 3),
        work_left=report.work_left,
        next_due_ms=report.next_due_ms,
        handed_back=handed_back,
        types_without_code=list(report.types_without_code),
    )


def _lost(report: IdleReport, error: str) -> ShardSummary:
    return ShardSummary(
        shard=report.shard,
        epoch=report.epoch,
        exit="lost lease",
        runs_advanced=None,
        steps_run=report.steps_run,
        open_ms=round(report.open_ms, 3),
        work_left=True,
        error=error,
    )
