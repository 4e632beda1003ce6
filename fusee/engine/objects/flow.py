"""A key's run: the built-in workflow of an object type (docs/objects.md).

Every key of type T is one run of the workflow named T, with ID `T/KEY`, reached only by
update-with-start: each call is an update whose handler is the object's handler, so a
call is accepted (durable, and from then on run exactly once) when its `UpdateAccepted`
is recorded, and its result is released with its `UpdateDone`. The state is held here,
next to the run:

- An exclusive call takes the key's turn in the order the journal accepted it (the
  `KeyLock` below: a queue of positionless waits resolved as turns end, so replay hands
  the turns out in the same order) and works on its own copy of the state, committed
  when it returns and dropped when it fails. A shared call reads the committed state at
  once, beside everything else.
- Reads are not journaled: the commits happen where the handlers end, at places the
  journal fixes, so a handler replayed after a crash reads what it read the first time.
- Compaction: once no call is active and either about 128 operations and calls were made
  or the shard is about to park the run (it sends the `fusee.compact` update instead,
  `Workflow.compact_update`), the run continues as new with one snapshot as its input:
  the committed state and the IDs and results of recent calls with IDs (the latest 1,024,
  for an hour), so a call sent again after a compaction still gets its recorded result.
  An idle key is then one record in the run store and its index entry.
"""

from __future__ import annotations

import inspect
from collections import deque
from typing import TYPE_CHECKING, Any

import msgspec

from fusee import _codec as codec
from fusee._errors import Failure, RejectedError, error_from, failure_from
from fusee.engine.coordinators.flow import Wake
from fusee.engine.objects.edit import apply_edit, version_of
from fusee.workflow.ctx import ObjectCtx
from fusee.workflow.definitions import Workflow
from fusee.workflow.objects import SEND_WORKFLOW, Handler, ObjectType, State
from fusee.workflow.ops import WatchOp

if TYPE_CHECKING:
    from fusee.workflow.ctx import Ctx

EDIT = "fusee.state.edit"
COMPACT = "fusee.compact"
STATE = "fusee.state"  # query: the committed state
INSPECT = "fusee.object"  # query: state, version, calls running and waiting
OPS_PER_RUN = 128
REMEMBERED_IDS = 1_024
REMEMBER_MS = 3_600_000


def object_id(type_name: str, key: str) -> str:
    return f"{type_name}/{key}"


class KeyLock:
    """The key's turn for exclusive calls, handed out in the order they asked."""

    def __init__(self, ctx: Ctx) -> None:
        self._run = ctx._run  # resolving a wait is the run's own business
        self.held = False
        self.queue: deque[WatchOp] = deque()

    def acquire(self) -> WatchOp | None:
        """None: the turn is the caller's now; else a wait that resolves when it is."""
        if not self.held:
            self.held = True
            return None
        turn = WatchOp(-1, "the key's turn")
        self.queue.append(turn)
        return turn

    def release(self) -> None:
        if self.queue:
            self._run.resolve(self.queue.popleft())  # the turn passes on, still held
        else:
            self.held = False


class Key:
    """One key's run: its handlers, its committed state and its calls."""

    def __init__(self, ctx: Ctx, ot: ObjectType, snapshot: dict[str, Any]) -> None:
        self.ctx = ctx
        self.ot = ot
        self.key = ctx.workflow_id[len(ot.name) + 1 :]
        # The committed state, in a one-slot box: shared calls read whatever is committed
        # when they read, and a commit swaps the slot.
        self.box: list[dict[str, bytes]] = [
            {k: codec.encode(v, f"state field '{k}'") for k, v in (snapshot.get("state") or {}).items()}
        ]
        self.seen: dict[str, list[Any]] = dict(snapshot.get("seen") or {})  # id -> [expires, ok, value]
        self.recent: dict[str, list[Any]] = {}  # this run's calls with IDs: id -> [ok, value]
        self.lock = KeyLock(ctx)
        self.wake = Wake(ctx)
        self.active = 0
        self.calls = 0
        self.compact = False
        self.running: list[dict[str, Any]] = []
        self.waiting: list[dict[str, Any]] = []
        for name, handler in ot.handlers.items():
            ctx.on_update(name, self._handler(name, handler))
        ctx.on_update(EDIT, self._handler(EDIT, Handler(_edit, shared=False)))
        ctx.on_update(COMPACT, self._on_compact)
        ctx.on_query(STATE, self._state)
        ctx.on_query(INSPECT, self._inspect)
        # A first call to a handler the type lacks rode in the start record: refused here
        # (a workflow's update may wait for a handler its code registers later; an
        # object's handlers are all registered above).
        for name in list(ctx._run.pending_updates):
            ctx.on_update(name, self._unknown(name))

    def _unknown(self, name: str) -> Any:
        def refuse(_arg: Any = None) -> None:
            raise RejectedError(
                f"object type '{self.ot.name}' has no handler '{name}' "
                f"(handlers: {', '.join(sorted(self.ot.handlers)) or 'none'})"
            )

        return refuse

    async def serve(self) -> None:
        ctx = self.ctx
        while True:
            await self.wake.wait()
            if self.active:
                continue
            if self.compact or self.calls + ctx.journal_size() >= OPS_PER_RUN:
                ctx.continue_as_new(self._snapshot())

    def _handler(self, name: str, handler: Handler) -> Any:
        async def on_call(envelope: Any) -> Any:
            return await self._call(name, handler, envelope if isinstance(envelope, dict) else {})

        return on_call

    async def _call(self, name: str, handler: Handler, envelope: dict[str, Any]) -> Any:
        cid = envelope.get("id")
        if cid is not None and cid in self.seen:
            return _remembered(self.seen[cid])  # ran before the last compaction
        entry = {"handler": name, "id": cid}
        self.active += 1
        held = False
        try:
            if handler.shared:
                state = State(self.box, None)
            else:
                self.waiting.append(entry)
                turn = self.lock.acquire()
                if turn is not None:
                    await turn
                held = True
                self.waiting.remove(entry)
                state = State(self.box, dict(self.box[0]))
            self.running.append(entry)
            ctx = ObjectCtx(self.ctx._run, self.ot.name, self.key, state)
            try:
                value = handler.fn(ctx, envelope.get("a")) if handler.takes_arg else handler.fn(ctx)
                if inspect.isawaitable(value):
                    value = await value
            except Exception as exc:
                if cid is not None:
                    self.recent[cid] = [False, msgspec.to_builtins(failure_from(exc, False))]
                raise
            if not handler.shared:
                self.box[0] = state._fields or {}  # committed: the UpdateDone that follows carries the result
            if cid is not None:
                self._remember(cid, value)
            return value
        finally:
            if entry in self.running:
                self.running.remove(entry)
            elif entry in self.waiting:
                self.waiting.remove(entry)
            if held:
                self.lock.release()
            self.active -= 1
            self.calls += 1
            self.wake()

    def _remember(self, cid: str, value: Any) -> None:
        try:
            plain = codec.decode(codec.encode(value, "result"), Any, "result")
        except Exception:  # noqa: BLE001 - a result JSON cannot hold fails the update itself
            return
        self.recent[cid] = [True, plain]

    def _on_compact(self, _arg: Any = None) -> None:
        self.compact = True
        self.wake()

    def _state(self, _arg: Any = None) -> dict[str, Any]:
        return _plain(self.box[0])

    def _inspect(self, _arg: Any = None) -> dict[str, Any]:
        return {
            "type": self.ot.name,
            "key": self.key,
            "state": _plain(self.box[0]),
            "version": version_of(self.box[0]),
            "running": list(self.running),
            "waiting": list(self.waiting),
            "remembered_ids": len(self.seen) + len(self.recent),
        }

    def _snapshot(self) -> dict[str, Any]:
        now = int(self.ctx.now().timestamp() * 1000)
        seen = {cid: item for cid, item in self.seen.items() if item[0] > now}
        for cid, (ok, value) in self.recent.items():
            seen.pop(cid, None)
            seen[cid] = [now + REMEMBER_MS, ok, value]
        while len(seen) > REMEMBERED_IDS:
            del seen[next(iter(seen))]
        return {"state": _plain(self.box[0]), "seen": seen}


def _plain(fields: dict[str, bytes]) -> dict[str, Any]:
    return {k: codec.decode(data, Any, f"state field '{k}'") for k, data in fields.items()}


def _remembered(item: list[Any]) -> Any:
    _, ok, value = item
    if ok:
        return value
    raise error_from(msgspec.convert(value, Failure))


async def _edit(ctx: Any, edit: Any) -> dict[str, Any]:
    """The built-in exclusive handler `fusee.state.edit` (edit.py): its changes commit with
    its result, as any exclusive handler's do."""
    state: State = ctx.state
    edit = edit if isinstance(edit, dict) else {}
    fields, changed = apply_edit(state._fields or {}, edit)
    state.clear_all()
    for key, data in fields.items():
        state.set(key, codec.decode(data, Any, f"state field '{key}'"))
    return {"version": version_of(fields), "changed": changed}


def make_workflow(ot: ObjectType) -> Workflow[Any]:
    """The built-in workflow of object type `ot`: one run per key."""

    async def key_run(ctx: Ctx, snapshot: dict[str, Any]) -> None:
        await Key(ctx, ot, snapshot if isinstance(snapshot, dict) else {}).serve()

    wf: Workflow[Any] = Workflow(key_run, ot.name, input=dict[str, Any])
    wf.compact_update = COMPACT
    return wf


def send_workflow(reach: Any) -> Workflow[Any]:
    """`fusee.object.send`: `ctx.object(...).send` from workflow code starts one of these
    (abandoned), so the durable outbox delivers the call even if its caller ends at once;
    its one step sends the call with the run's ID as the call's ID, so a retried step
    gets the same acceptance."""

    async def object_send(ctx: Ctx, call: dict[str, Any]) -> None:
        async def deliver(s: Any) -> None:
            data = codec.encode(call.get("arg"), "object call argument")
            await reach.send_from_code(call["type"], call["key"], call["handler"], data, ctx.workflow_id)

        await ctx.step("send", deliver)

    return Workflow(object_send, SEND_WORKFLOW, input=dict[str, Any])
