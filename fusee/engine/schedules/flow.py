"""The schedule's own workflow, `fusee.schedule`, one run per schedule under the ID
`fusee.schedule/NAME` (docs/schedules.md).

Its state (spec, cursor, counters) is its input, carried through `continue_as_new` every
ACTIONS_PER_RUN actions so its journal stays short. It sleeps on a durable timer until the
next time; nothing else wakes it but a new spec (a signal), the handle's updates, and,
while a buffer-one time waits, a timer to look again whether the run it waits for ended.
Every decision that depends on the outside world (does the time's run exist, does the
previous run still run) is made inside a step and recorded, so a replay takes the same
branch; the starts themselves attach to an existing run of the same ID, so a step run
again after a crash starts nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fusee._errors import CodecError, FuseeError, NotFoundError, RejectedError, UnknownWorkflowError
from fusee.engine.schedules.times import between, count_between, iso, next_after, run_id
from fusee.journal import FINAL
from fusee.workflow.definitions import Retry, Workflow

if TYPE_CHECKING:
    from fusee.workflow.ctx import Ctx
    from fusee.workflow.ops import Op

log = logging.getLogger("fusee.schedules")

TYPE = "fusee.schedule"
PREFIX = TYPE + "/"
SET_SIGNAL = "fusee.schedule.set"
CONTROL = "control"
DESCRIBE = "describe"
ACTIONS_PER_RUN = 50
# buffer-one: how soon the end of the run a buffered time waits for is looked for again,
# doubling from the first to the last (nothing tells a run of another's end but a child's).
RECHECK_FIRST_MS = 1_000
RECHECK_LAST_MS = 60_000
RECENT = 10
ATTACH = {"running": "use-existing", "finished": "use-existing"}
# A start refused for a cause no retry changes (the type has no code here, the input does
# not fit it): recorded as that time's outcome instead of failing the schedule.
FINAL_ERRORS = (UnknownWorkflowError, RejectedError, CodecError)
# Steps retry for as long as it takes: a schedule outlives any one failing start.
PATIENT = Retry(attempts=1_000_000, initial="1s", max="1m")


def schedule_id(name: str) -> str:
    return PREFIX + name


def new_state(name: str, spec: dict[str, Any], workflow: str, input: Any) -> dict[str, Any]:
    return {
        "name": name,
        "spec": spec,
        "workflow": workflow,
        "input": input,
        "cursor": None,  # the last time dealt with (fired, skipped or missed)
        "paused": spec["paused"],
        "last": None,  # the run the schedule started last
        "buffered": None,  # buffer-one: the time waiting for `last` to end
        "recheck_ms": RECHECK_FIRST_MS,  # buffer-one: the wait before looking again
        "fired": 0,
        "skipped": 0,
        "missed": 0,  # older than the catch-up window when the schedule woke
        "errors": 0,
        "recent": [],
    }


def _ms(ctx: Ctx) -> int:
    return int(ctx.now().timestamp() * 1000)


def describe(s: dict[str, Any]) -> dict[str, Any]:
    spec = s["spec"]
    cursor = s["cursor"]
    return {
        "name": s["name"],
        "id": schedule_id(s["name"]),
        "workflow": s["workflow"],
        "cron": spec["cron"],
        "every_ms": spec["every_ms"],
        "timezone": spec["timezone"],
        "overlap": spec["overlap"],
        "catchup_window_ms": spec["catchup_window_ms"],
        "jitter_ms": spec["jitter_ms"],
        "paused": s["paused"],
        "next": iso(next_after(spec, cursor)) if cursor is not None else None,
        "last_run": s["last"],
        "buffered": iso(s["buffered"]),
        "fired": s["fired"],
        "skipped": s["skipped"],
        "missed": s["missed"],
        "errors": s["errors"],
        "recent": list(s["recent"]),
    }


# How a worker's schedules reach runs on shards other workers hold: a client of the same
# server, made by `fusee/__init__.py` (the engine may not import the client package).
connect_client: Callable[[Any], Awaitable[Any]] | None = None


class Starter:
    """What the schedule's steps do outside the run: read a run's status, cancel it,
    start a time's run. Bound to the engine that registers the schedule workflow: in
    local mode its own calls; on a worker of a server, a client of that server, since
    the time's run may be on any shard and this worker may hold only some."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.client: Any = None
        self.connecting: asyncio.Future[Any] | None = None

    @property
    def target(self) -> Any:
        return self.client if self.client is not None else self.engine

    async def route(self) -> None:
        """Connect the client first, on a worker of a server (once; shared by steps)."""
        address = getattr(self.engine.storage, "address", None)
        if self.client is not None or address is None or connect_client is None:
            return
        if self.connecting is None:
            self.connecting = asyncio.ensure_future(connect_client(address))
        try:
            self.client = await asyncio.shield(self.connecting)
        except BaseException:
            self.connecting = None  # the next step's attempt connects again
            raise

    async def close(self) -> None:
        client, self.client, self.connecting = self.client, None, None
        if client is not None:
            await client.close()

    async def exists(self, wid: str) -> bool:
        try:
            await self.target.run(wid).status()
        except NotFoundError:
            return False
        return True

    async def running(self, wid: str | None) -> bool:
        if wid is None:
            return False
        try:
            summary = await self.target.run(wid).status()
        except NotFoundError:
            return False
        return summary.status not in FINAL

    async def fire(self, s: dict[str, Any], times: list[int], overlap: str) -> list[list[Any]]:
        """Start the runs of `times`, oldest first, under the overlap policy; each
        outcome is [what, time, run ID or message] with what one of started, attached
        (its run existed already), skipped, buffered, error."""
        await self.route()
        out: list[list[Any]] = []
        last, buffered = s["last"], s["buffered"]
        for at in times:
            rid = run_id(s["name"], at)
            if await self.exists(rid):
                out.append(["attached", at, rid])
                last = rid
                continue
            if overlap != "allow-all" and await self.running(last):
                if overlap == "skip" or (overlap == "buffer-one" and buffered is not None):
                    out.append(["skipped", at, rid])
                    continue
                if overlap == "buffer-one":
                    out.append(["buffered", at, rid])
                    buffered = at
                    continue
                try:  # cancel-other
                    await self.target.run(last).cancel(
                        "schedule: a newer time started (overlap cancel-other)"
                    )
                except NotFoundError:
                    pass  # it ended meanwhile
            try:
                await self.target.start(s["workflow"], rid, s["input"], id_policy=ATTACH)
            except FINAL_ERRORS as error:
                out.append(["error", at, str(error)])
                continue
            out.append(["started", at, rid])
            last = rid
        return out

    async def ended(self, wid: str) -> bool:
        await self.route()
        return not await self.running(wid)


class Passing(Exception):
    """A call of a schedule's step failed for a cause that may pass: the shard holding the
    time's run stopped (its process restarts), a connection to the server dropped. A
    FuseeError out of a step is final; this one is retried (PATIENT), so a schedule
    outlives the failure instead of failing with it."""


async def patient(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except FuseeError as error:  # (the refusals no retry changes are outcomes, in `fire`)
        raise Passing(f"{type(error).__name__}: {error}") from error


def _apply(s: dict[str, Any], outcomes: list[list[Any]]) -> None:
    for what, at, detail in outcomes:
        if what in ("started", "attached"):
            s["fired"] += 1
            s["last"] = detail
            s["recent"] = (s["recent"] + [detail])[-RECENT:]
            if s["buffered"] == at:
                s["buffered"] = None
        elif what == "buffered":
            s["buffered"] = at
        elif what == "skipped":
            s["skipped"] += 1
        else:
            s["errors"] += 1
            log.warning("schedule '%s': the run of %s was not started: %s", s["name"], iso(at), detail)


def make_workflow(starter: Starter) -> Workflow[Any]:
    """The schedule workflow, bound to the engine of `starter`."""

    async def fire(
        ctx: Ctx, s: dict[str, Any], times: list[int], overlap: str, name: str = "fire"
    ) -> list[Any]:
        if not times:
            return []
        snapshot = {k: s[k] for k in ("name", "workflow", "input", "last", "buffered")}

        async def go() -> list[list[Any]]:
            outcomes: list[list[Any]] = await patient(starter.fire(snapshot, times, overlap))
            return outcomes

        outcomes: list[list[Any]] = await ctx.step(name, go, retry=PATIENT)
        _apply(s, outcomes)
        return outcomes

    async def control(ctx: Ctx, s: dict[str, Any], arg: dict[str, Any]) -> Any:
        op = arg.get("op")
        if op == "pause":
            s["paused"] = True
        elif op == "resume":
            s["paused"] = False
        elif op == "trigger":
            # Now, whatever the overlap: the caller asked for this run.
            what, _, detail = (await fire(ctx, s, [_ms(ctx)], "allow-all", "trigger"))[0]
            return {"outcome": what, "id": detail}
        elif op == "backfill":
            # [start, end): every time, whatever the overlap; a time whose run exists
            # (it ran, or an earlier backfill started it) is attached to, not run again.
            times = between(s["spec"], arg["start"] - 1, arg["end"] - 1, limit=10_000)
            last = s["last"]
            outcomes = await fire(ctx, s, times, "allow-all", "backfill")
            if last is not None:
                s["last"] = last  # the overlap policy keeps watching the newest run
            counts = {"times": len(times), "started": 0, "attached": 0, "error": 0}
            for what, _, _ in outcomes:
                counts[what] = counts.get(what, 0) + 1
            return counts
        elif op != "describe":
            raise RejectedError(f"schedule control {op!r}: use pause, resume, trigger, backfill or describe")
        return describe(s)

    async def schedule(ctx: Ctx, state: dict[str, Any]) -> None:
        s = state

        def on_describe(_arg: Any = None) -> dict[str, Any]:
            return describe(s)

        ctx.on_query(DESCRIBE, on_describe)

        controls = [0]  # updates being handled: the run does not continue as new under them

        async def on_control(arg: dict[str, Any]) -> Any:
            controls[0] += 1
            try:
                return await control(ctx, s, arg)
            finally:
                controls[0] -= 1

        ctx.on_update(CONTROL, on_control)
        if s["cursor"] is None:
            s["cursor"] = _ms(ctx)
        timer: Op | None = None
        planned = None
        signal: Op | None = None
        recheck: Op | None = None
        actions = 0
        while True:
            if actions >= ACTIONS_PER_RUN and not controls[0]:
                ctx.continue_as_new(s)
            spec = s["spec"]
            at = next_after(spec, s["cursor"])
            if timer is None or planned != at:
                # The jitter is drawn once per time and recorded (ctx.random), so a
                # replay sleeps to the same instant.
                jitter = int(ctx.random() * spec["jitter_ms"]) if spec["jitter_ms"] else 0
                timer, planned = ctx.sleep_until("next", at + jitter), at
            if signal is None:
                signal = ctx.wait_for(SET_SIGNAL)
            if recheck is None and s["buffered"] is not None:
                # A durable timer, not a step left waiting for the run's end: the schedule
                # parks meanwhile, and an invoked shard is let go of between two looks.
                recheck = ctx.sleep("recheck", s.setdefault("recheck_ms", RECHECK_FIRST_MS))
            await ctx.race([op for op in (timer, signal, recheck) if op is not None])
            actions += 1
            if signal.done:
                new = await signal
                signal = None
                s["spec"], s["workflow"], s["input"] = new["spec"], new["workflow"], new["input"]
                s["paused"] = new["spec"]["paused"]
                # The new spec's times start from now: its earlier ones were never this
                # schedule's, and must not be caught up.
                s["cursor"] = max(s["cursor"], _ms(ctx))
                continue
            if recheck is not None and recheck.done:
                recheck = None
                await _recheck(ctx, s, starter, fire)
                continue
            if timer.done:
                timer = None
                await _due(ctx, s, fire)

    return Workflow(schedule, TYPE, input=dict[str, Any])


async def _recheck(ctx: Ctx, s: dict[str, Any], starter: Starter, fire: Any) -> None:
    """buffer-one: the buffered time starts once the run it waits for has ended."""
    if s["buffered"] is None:
        return  # started meanwhile (a backfill, a new spec)
    last = s["last"]

    async def look() -> bool:
        return last is None or await patient(starter.ended(last))

    if await ctx.step("ended", look, retry=PATIENT):
        s["recheck_ms"] = RECHECK_FIRST_MS
        await fire(ctx, s, [s["buffered"]], "allow-all")
    else:
        s["recheck_ms"] = min(2 * s["recheck_ms"], RECHECK_LAST_MS)


async def _due(ctx: Ctx, s: dict[str, Any], fire: Any) -> None:
    """The timer fired: every time up to now, oldest first; those older than the
    catch-up window are missed, those while paused are skipped."""
    now = _ms(ctx)
    spec = s["spec"]
    horizon = now - spec["catchup_window_ms"]
    if s["cursor"] < horizon:
        s["missed"] += count_between(spec, s["cursor"], horizon)
        s["cursor"] = horizon
    times = between(spec, s["cursor"], now)
    if times:
        s["cursor"] = times[-1]
    if s["paused"]:
        s["skipped"] += len(times)
        return
    await fire(ctx, s, times, spec["overlap"])
