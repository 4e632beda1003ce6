"""The debounce and batch coordinators: built-in workflows `fusee.debounce` and
`fusee.batch`, one run per workflow type and key, ID `fusee.debounce/TYPE/KEY` (or
`fusee.batch/...`), reached only by update-with-start (docs/coordinators.md).

Each event is an update. Its handler puts the event in the open window (opening one, and
drawing the ID of the run that window will start, if none is open) and returns that ID:
the update's record makes the event durable, and replay runs the handler again at its
place in the journal, so an acknowledged event is in exactly one window across any
crash. The main code sleeps on a durable timer until the window is due and then starts
the window's run as an abandoned child under the ID drawn when it opened: after a crash
the child start is sent again with that ID and attaches, so a window starts one run.

The coordinator's state is its input, carried through `continue_as_new`; it ends once no
window is open and no remembered event ID is still inside its dedup window, so an idle
key costs nothing. An event that reaches it as it ends is refused before its handler
runs ("the workflow ended before the update finished"); the caller sends it again, to
the key's next coordinator run (handle.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fusee._errors import FuseeError
from fusee.workflow.definitions import Workflow
from fusee.workflow.ops import WatchOp

if TYPE_CHECKING:
    from fusee.workflow.ctx import Ctx
    from fusee.workflow.ops import Op

log = logging.getLogger("fusee.coordinators")

DEBOUNCE = "fusee.debounce"
BATCH = "fusee.batch"
EVENT = "event"
DESCRIBE = "describe"
# Events handled before the coordinator continues as new (its journal stays short).
EVENTS_PER_RUN = 200
MAX_EVENTS = 10_000
REMEMBERED_IDS = 1_024
DEDUP_WINDOW_MS = 10 * 60_000


def coordinator_id(kind: str, workflow: str, key: str) -> str:
    return f"{kind}/{workflow}/{key}"


def new_state(kind: str, workflow: str, key: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "workflow": workflow,
        "key": key,
        "window": None,  # {"id", "first", "due", "input" | "events"}
        "seen": {},  # event ID -> [expires at (ms), run ID], oldest first
        "started": 0,  # runs started by this key's coordinator (this run and before)
        "errors": 0,
    }


def _ms(ctx: Ctx) -> int:
    return int(ctx.now().timestamp() * 1000)


class Wake:
    """Wakes the main code from an update's handler. An operation without a journal
    position, resolved by the handler: handlers run at their records' places on replay,
    so the main code wakes at the same point live and on replay."""

    def __init__(self, ctx: Ctx) -> None:
        self._run = ctx._run  # the driver: resolving an op is the run's own business
        self.op: WatchOp | None = None

    def wait(self) -> Op:
        if self.op is None or self.op.done:
            self.op = WatchOp(-1, "coordinator wake")
        return self.op

    def __call__(self) -> None:
        if self.op is not None:
            self._run.resolve(self.op)


def _prune(s: dict[str, Any], now: int) -> None:
    seen = s["seen"]
    for eid in [eid for eid, (expires, _) in seen.items() if expires <= now]:
        del seen[eid]
    while len(seen) > REMEMBERED_IDS:
        del seen[next(iter(seen))]


def describe(s: dict[str, Any]) -> dict[str, Any]:
    w = s["window"]
    window = None
    if w is not None:
        count = len(w["events"]) if "events" in w else w["count"]
        window = {"id": w["id"], "due": w["due"], "events": count}
    return {
        "kind": s["kind"],
        "workflow": s["workflow"],
        "key": s["key"],
        "window": window,
        "remembered_ids": len(s["seen"]),
        "started": s["started"],
        "errors": s["errors"],
    }


def make_workflow(kind: str) -> Workflow[Any]:
    """The coordinator workflow of `kind` (DEBOUNCE or BATCH)."""

    async def coordinator(ctx: Ctx, state: dict[str, Any]) -> None:
        s = state
        wake = Wake(ctx)
        handling = [0]  # handlers between their start and their end (a full batch's start)
        handled = [0]

        async def close(w: dict[str, Any]) -> None:
            """Start the window's run; a start the child's shard refuses (an unknown type,
            an input that does not fit) is logged and counted, not the coordinator's end."""
            value = w["events"] if "events" in w else w["input"]
            try:
                await ctx.start_child(s["workflow"], w["id"], value, parent_close="abandon")
            except FuseeError as error:
                s["errors"] += 1
                log.warning("%s '%s': the run %s was not started: %s", kind, s["key"], w["id"], error)
                return
            s["started"] += 1

        async def on_event(arg: dict[str, Any]) -> dict[str, Any]:
            handling[0] += 1
            try:
                return await _add(ctx, s, kind, arg, close)
            finally:
                handling[0] -= 1
                handled[0] += 1
                wake()

        def on_describe(_arg: Any = None) -> dict[str, Any]:
            return describe(s)

        ctx.on_query(DESCRIBE, on_describe)
        ctx.on_update(EVENT, on_event)
        timer: Op | None = None
        planned: int | None = None
        # A first run begins with its event in the start record, whose handler runs once
        # the main code first waits: until then it is not idle but about to be fed. A
        # continued run carries a window or remembered IDs (it never continues idle).
        fed = bool(s["window"] or s["seen"])
        while True:
            now = _ms(ctx)
            _prune(s, now)
            w = s["window"]
            busy = w is not None or bool(s["seen"]) or handling[0]
            if not busy and (handled[0] or fed):
                return  # idle: nothing open, nothing to remember
            if busy and not handling[0] and handled[0] >= EVENTS_PER_RUN:
                ctx.continue_as_new(s)
            due = w["due"] if w is not None else min((e for e, _ in s["seen"].values()), default=None)
            if due is not None and (timer is None or planned != due):
                timer, planned = ctx.sleep_until("due", due), due
            elif due is None:
                timer = planned = None
            waits = [wake.wait()] + ([timer] if timer is not None else [])
            await ctx.race(waits)
            if timer is not None and timer.done:
                timer = planned = None
                w = s["window"]
                if w is not None and w["due"] <= _ms(ctx):
                    s["window"] = None  # an event from now on opens the next window
                    await close(w)

    return Workflow(coordinator, kind, input=dict[str, Any])


async def _add(ctx: Ctx, s: dict[str, Any], kind: str, arg: dict[str, Any], close: Any) -> dict[str, Any]:
    """One event into the open window; the receipt names the run that will take it."""
    now = _ms(ctx)
    _prune(s, now)
    eid = arg.get("event_id")
    if eid is not None and eid in s["seen"]:
        return {"id": s["seen"][eid][1], "duplicate": True}
    w = s["window"]
    if w is None:
        # The run's ID is drawn (and so recorded) when its window opens: every event of
        # the window gets it at once, and the start after a crash reuses it.
        rid = f"{s['key']}@{ctx.uuid().hex[:16]}"
        w = s["window"] = {"id": rid, "first": now, "due": now}
        if kind == BATCH:
            w["events"] = []
        else:
            w["count"] = 0
    rid = w["id"]
    max_wait = arg.get("max_wait_ms")
    if kind == DEBOUNCE:
        # The latest start's input and settings: `window` after it, capped at `max_wait`
        # after the window's first start.
        w["input"] = arg.get("input")
        w["count"] += 1
        due = now + arg["window_ms"]
        if max_wait is not None:
            due = min(due, w["first"] + max_wait)
        w["due"] = due
    else:
        w["events"].append(arg.get("input"))
        w["due"] = w["first"] + max_wait if max_wait is not None else w["first"]
    if eid is not None:
        s["seen"][eid] = [now + arg.get("dedup_window_ms", DEDUP_WINDOW_MS), rid]
    if kind == BATCH and len(w["events"]) >= min(arg.get("max_events", MAX_EVENTS), MAX_EVENTS):
        # A full batch starts its run from here, so no batch holds more than max_events.
        s["window"] = None
        await close(w)
    return {"id": rid, "duplicate": False}
