"""Runs at once: `@fusee.workflow(concurrency=fusee.Concurrency(n, key=...))`
(docs/coordinators.md).

A start from outside a workflow of such a type is an update with start on the type's (or
key's) coordinator, `fusee.concurrency/TYPE` (`.../TYPE/KEY`). Its handler appends the
start to the queue and starts the start's slot, `fusee.queued/ID`, a run that only waits
to be admitted: the slot exists before the caller's start returns, so the run is listed
as queued, `result()` waits through it, and cancelling it takes the start out of the
queue. The coordinator's main code admits the head of the queue while fewer than `limit`
runs hold a turn: it signals the slot, and once the slot has ended (admitted, not
cancelled) starts the run itself as an abandoned child under its ID, watching its end to
free the turn. Every step of that is a record of the coordinator's journal, so a run
keeps its turn across crashes and each queued start is admitted once.

The coordinator does not continue as new: a child's end is delivered to the run that
started it, so its journal grows with the starts it admits and it ends (starting afresh
on the next start) once nothing is queued or running.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fusee._errors import FuseeError, NotFoundError
from fusee.engine.coordinators.calls import send, wait_started
from fusee.engine.coordinators.flow import Wake
from fusee.workflow.definitions import Workflow
from fusee.workflow.driver import current_step, inline_step

if TYPE_CHECKING:
    from fusee.workflow.ctx import Ctx
    from fusee.workflow.ops import Op

log = logging.getLogger("fusee.coordinators")

COORDINATOR = "fusee.concurrency"
SLOT = "fusee.queued"
ENQUEUE = "enqueue"
ADMIT = "fusee.admit"
DESCRIBE = "describe"


def coordinator_id(workflow: str, key: str | None) -> str:
    return f"{COORDINATOR}/{workflow}" + (f"/{key}" if key is not None else "")


def slot_id(run_id: str) -> str:
    return f"{SLOT}/{run_id}"


def from_outside() -> bool:
    """A start made outside any step function: only those take turns (a run a workflow
    starts, a schedule's among them, runs at once)."""
    return current_step.get() is None and inline_step[0] is None


async def slot(ctx: Ctx, entry: dict[str, Any]) -> None:
    await ctx.wait_for(ADMIT)


class _Entry:
    __slots__ = ("id", "input", "run", "slot")

    def __init__(self, id: str, input: Any, slot: Op) -> None:
        self.id = id
        self.input = input
        self.slot = slot  # the slot's end
        self.run: Op | None = None  # the run's end, once admitted


def _ended(op: Op | None) -> bool:
    return op is not None and op.done


async def coordinator(ctx: Ctx, state: dict[str, Any]) -> None:
    wf, limit = state["workflow"], [state["limit"]]
    queue: list[_Entry] = []  # waiting, in start order
    admitted: list[_Entry] = []  # holding a turn: signalled, or running
    seen: dict[str, str] = {}  # run ID -> its slot's ID, for a start sent twice
    wake = Wake(ctx)
    handling = [0]
    handled = [0]

    async def on_enqueue(arg: dict[str, Any]) -> dict[str, Any]:
        handling[0] += 1
        try:
            rid = arg["id"]
            limit[0] = arg["limit"]  # the newest start's limit applies
            if rid not in seen:
                seen[rid] = slot_id(rid)
                # Awaited: the slot exists before the caller's start returns.
                handle = await ctx.start_child(
                    SLOT, seen[rid], {"id": rid, "workflow": wf}, parent_close="abandon"
                )
                queue.append(_Entry(rid, arg.get("input"), handle.result()))
            return {"id": rid, "slot": seen[rid]}
        finally:
            handling[0] -= 1
            handled[0] += 1
            wake()

    ctx.on_update(ENQUEUE, on_enqueue)

    def on_describe(_arg: Any = None) -> dict[str, Any]:
        return {
            "workflow": wf,
            "key": state.get("key"),
            "limit": limit[0],
            "queued": [e.id for e in queue],
            "running": [e.id for e in admitted],
        }

    ctx.on_query(DESCRIBE, on_describe)
    while True:
        # Cancelled slots leave the queue; a turn is free once its run has ended, or its
        # slot ended without admission (cancelled between the signal and its end).
        queue[:] = [e for e in queue if not _ended(e.slot)]
        for e in list(admitted):
            if e.run is None and _ended(e.slot):
                if e.slot.exc is None:
                    e.run = await _start(ctx, wf, e)
                if e.run is None:
                    admitted.remove(e)
            elif _ended(e.run):
                admitted.remove(e)
                seen.pop(e.id, None)
        while queue and len(admitted) < limit[0]:
            e = queue.pop(0)
            admitted.append(e)
            try:
                await ctx.signal_workflow(slot_id(e.id), ADMIT, None)
            except FuseeError:
                pass  # the slot ended first (cancelled): its end frees the turn
        if not queue and not admitted and not handling[0] and handled[0]:
            return  # nothing waits, nothing runs: the next start begins another coordinator
        waits: list[Op] = [wake.wait()]
        waits += [e.slot for e in queue]
        waits += [e.run if e.run is not None else e.slot for e in admitted]
        try:
            await ctx.race(waits)
        except FuseeError:
            pass  # a slot or a run ended in failure: looked at above, as any end


async def _start(ctx: Ctx, wf: str, e: _Entry) -> Op | None:
    """The admitted run, started under its own ID; its end (an op), or None if refused."""
    try:
        handle = await ctx.start_child(wf, e.id, e.input, parent_close="abandon")
    except FuseeError as error:
        log.warning("runs at once '%s': the run %s was not started: %s", wf, e.id, error)
        return None
    end: Op = handle.result()
    return end


def workflows() -> list[Workflow[Any]]:
    return [
        Workflow(coordinator, COORDINATOR, input=dict[str, Any]),
        Workflow(slot, SLOT, input=dict[str, Any]),
    ]


async def enqueue(target: Any, definition: Workflow[Any], id: str, input: Any, value: Any) -> None:
    """A start of a type with `concurrency=`: queued on its coordinator (through
    `target`, an engine or a client)."""
    c = definition.concurrency
    assert c is not None
    key = str(c.key(input)) if c.key is not None else None
    cid = coordinator_id(definition.name, key)
    state = {"workflow": definition.name, "key": key, "limit": c.limit}
    await send(target, COORDINATOR, cid, state, ENQUEUE, {"id": id, "input": value, "limit": c.limit})


async def through_queue(run: Any) -> None:
    """`result()` of a run that does not exist: if it waits in a queue, wait for its slot
    to end (raising its cancellation) and then for the run to exist. NotFoundError if
    there is no slot either."""
    if run.id.startswith(SLOT + "/"):
        raise NotFoundError(f"no workflow '{run.id}'", workflow_id=run.id)
    await (await _owner(run, slot_id(run.id))).run(slot_id(run.id)).result()
    await wait_started(run)


async def cancel_queued(run: Any, reason: str | None) -> None:
    """`cancel()` of a run that does not exist: take it out of its queue, by cancelling
    its slot. NotFoundError if there is no slot either."""
    if run.id.startswith(SLOT + "/"):
        raise NotFoundError(f"no running workflow '{run.id}'", workflow_id=run.id)
    await (await _owner(run, slot_id(run.id))).run(slot_id(run.id)).cancel(reason)


async def _owner(run: Any, wid: str) -> Any:
    """Who can reach run `wid`: a client, or an engine holding its shard; an engine on
    a worker that does not hold it goes through a client of its server (the slot is on
    the shard of its own ID, which another worker may hold: the model test through
    invoked workers met a cancel refused as "not held" there)."""
    engine = getattr(run, "engine", None)
    if engine is None:
        return run.client
    if engine.shard_index(wid) in engine.by_index:
        return engine
    return await engine.coordinators.via()
