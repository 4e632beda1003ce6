"""What `engine.object(type, key)` and `client.object_ref(type, key)` call (docs/objects.md):
an update with start on the key's run (flow.py). The same class serves an engine and a
client: both can send update-with-start, query a run and terminate one, so objects need
no remote call of their own; a server relays them as it relays any run's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from fusee import _codec as codec
from fusee import _names as names
from fusee._audit import requester
from fusee._errors import NotFoundError, RejectedError
from fusee.engine.coordinators.calls import Reaching, send
from fusee.engine.objects.edit import check_edit, version_of
from fusee.engine.objects.flow import EDIT, INSPECT, STATE, make_workflow, object_id, send_workflow
from fusee.journal import FINAL
from fusee.workflow.definitions import Workflow
from fusee.workflow.objects import ObjectType


class Objects(Reaching):
    """An engine's or a client's object calls (`target`)."""

    def builtin(self) -> list[Workflow[Any]]:
        """The workflows every engine registers for objects (`fusee.object.send`)."""
        return [send_workflow(self)]

    @staticmethod
    def workflow_of(ot: ObjectType) -> Workflow[Any]:
        """The built-in workflow of an object type: made once per type, so registering the
        type on a second engine (or twice) is the same code."""
        if ot._workflow is None:
            ot._workflow = make_workflow(ot)
        wf: Workflow[Any] = ot._workflow
        return wf

    def ref(self, type_name: str, key: str) -> ObjectRef:
        return ObjectRef(self, type_name, key)

    async def keys(self, type_name: str, limit: int | None = None) -> AsyncIterator[str]:
        """The keys of `type_name` that exist (running runs of its workflow)."""
        names.name(type_name, "object type name")
        target = await self.via()
        prefix = f"{type_name}/"
        async for row in target.list(type_name, "running", limit=limit):
            if row.id.startswith(prefix):
                yield row.id[len(prefix) :]

    async def call_from_code(self, type_name: str, key: str, handler: str, arg: bytes, cid: str) -> Any:
        """A `ctx.object(...).call` step's attempt: `cid` is the step's key, the same for
        every attempt, so the key runs the call once."""
        return await self.ref(type_name, key).call(handler, _Raw(arg), id=cid)

    async def send_from_code(self, type_name: str, key: str, handler: str, arg: bytes, cid: str) -> None:
        await self.ref(type_name, key).send(handler, _Raw(arg), id=cid)


class _Raw:
    """An argument already encoded by workflow code (decoded once, where it is sent)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _arg(arg: Any) -> Any:
    return codec.decode(arg.data, Any, "object call argument") if isinstance(arg, _Raw) else arg


class ObjectRef:
    """One key of an object type: calls, reads and edits of its state."""

    def __init__(self, objects: Objects, type_name: str, key: str) -> None:
        self._objects = objects
        self.type = names.name(type_name, "object type name")
        self.key = names.name(key, "object key")
        self.id = object_id(type_name, key)

    def __repr__(self) -> str:
        return f"<fusee.ObjectRef {self.id!r}>"

    async def call(
        self, handler: str, arg: Any = None, *, id: str | None = None, by: str | None = None
    ) -> Any:
        """The handler's result. Calls with one `id` run once: a call sent again with it,
        whether the first was waiting, running or done, gets the same recorded result."""
        return await self._send(handler, arg, id, by, accepted=False)

    async def send(self, handler: str, arg: Any = None, *, id: str | None = None) -> None:
        """Returns once the call is accepted (durable); its handler runs on."""
        await self._send(handler, arg, id, None, accepted=True)

    async def _send(self, handler: str, arg: Any, id: str | None, by: str | None, *, accepted: bool) -> Any:
        names.name(handler, "object handler name")
        cid = names.name(id, "call ID") if id is not None else None
        envelope: dict[str, Any] = {"a": _arg(arg), "id": cid}
        if by is not None:
            envelope["by"] = by
        target = await self._objects.via()
        return await send(
            target,
            self.type,
            self.id,
            {},
            handler,
            envelope,
            update_id=cid or uuid.uuid4().hex,
            accepted=accepted,
        )

    async def state(self) -> dict[str, Any]:
        """The committed state (empty for a key that does not exist), once durable."""
        value: dict[str, Any] | None = await self._query(STATE)
        return {} if value is None else value

    async def inspect(self) -> dict[str, Any]:
        """The key: its state, its version (for `if_version`), the calls running and
        waiting for it, and its run (`exists` False for a key with no run)."""
        run = await self._run()
        detail: dict[str, Any] | None = await self._query(INSPECT)
        if detail is None:
            return {
                "type": self.type,
                "key": self.key,
                "exists": False,
                "state": {},
                "version": version_of({}),
            }
        summary = await run.status()
        detail["exists"] = True
        detail["run"] = {
            "id": self.id,
            "run": summary.run,
            "status": str(summary.status),
            "shard": summary.shard,
        }
        return detail

    async def describe(self) -> Any:
        """The key's run, as `run.describe()` gives it."""
        return await (await self._run()).describe()

    async def delete(self) -> None:
        """End the key: its state is gone, and the next call starts it empty."""
        try:
            await (await self._run()).terminate("object deleted")
        except NotFoundError:
            pass

    async def set_state(self, field: str, value: Any, *, if_version: str | None = None) -> dict[str, Any]:
        return await self.edit_state({"set": {_field(field): value}}, if_version=if_version)

    async def patch_state(
        self, ops: list[dict[str, Any]], *, if_version: str | None = None
    ) -> dict[str, Any]:
        """A JSON Patch (RFC 6902) over the state as one object."""
        return await self.edit_state({"patch": ops}, if_version=if_version)

    async def clear_state(self, field: str | None = None, *, if_version: str | None = None) -> dict[str, Any]:
        """One field; none named: all of it."""
        edit = {"clear_all": True} if field is None else {"clear": [_field(field)]}
        return await self.edit_state(edit, if_version=if_version)

    async def edit_state(
        self,
        edit: dict[str, Any],
        *,
        if_version: str | None = None,
        by: str | None = None,
        id: str | None = None,
    ) -> dict[str, Any]:
        """An exclusive call of the built-in `fusee.state.edit`: `clear_all`, `clear`,
        `set`, `patch`, in that order; refused whole (`StaleVersionError`) if the state is
        no longer at `if_version`. The answer is `{version, changed}`."""
        edit = dict(check_edit(edit))
        if if_version is not None:
            edit["if_version"] = if_version
        check_edit(edit)
        # Who asked: given, or named for this task (`fusee.as_requester`), as run operations do.
        answer: dict[str, Any] = await self.call(EDIT, edit, id=id, by=by or requester())
        return answer

    async def _query(self, name: str) -> Any:
        """A query of the key's run; None if the key has no run (never called, or
        deleted: its run ended)."""
        run = await self._run()
        try:
            return await run.query(name)
        except NotFoundError:
            return None
        except RejectedError:
            try:
                summary = await run.status()
            except NotFoundError:
                return None
            if summary.status in FINAL:
                return None
            raise

    async def _run(self) -> Any:
        target = await self._objects.via()
        return target.run(self.id)


def _field(field: Any) -> str:
    if type(field) is not str or not field:
        raise RejectedError(f"a state field is named by a non-empty string, not {field!r}")
    return field
