"""The HTTP API's object routes (docs/http-api.md, *Objects*; docs/objects.md): a key's
state, the edits of it, and calls to its handlers.

A key is a run (`TYPE/KEY`), so these routes make the calls a client makes for an
`ObjectRef`: an edit is update-with-start of the built-in exclusive handler
`fusee.state.edit` (it waits for the key like any exclusive call and commits with its
result), a read is the `fusee.object` query. `If-Match` carries the version an editor
read (`if_version`): a stale one answers 412 and changes nothing. Edits carry who asked
(`by`) in the call, which the key's `UpdateAccepted` record keeps.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from fusee import _names as names
from fusee._errors import RejectedError
from fusee.engine.objects.edit import check_edit, version_of
from fusee.engine.objects.flow import EDIT, INSPECT, object_id
from fusee_server.http_runs import ApiError, Asked, Route, RunsApi

CallValue = Any


class ObjectState(msgspec.Struct):
    type: str
    key: str
    exists: bool
    state: dict[str, Any]
    version: str


class Edited(msgspec.Struct):
    type: str
    key: str
    version: str
    changed: list[str]


class CallBody(msgspec.Struct, forbid_unknown_fields=True):
    """A call's argument; `id` makes sending it again run it once."""

    arg: Any = None
    id: str | None = None


class Called(msgspec.Struct):
    type: str
    key: str
    id: str
    value: Any


def _ids(asked: Asked) -> tuple[str, str, str]:
    type_name = names.name(asked.path["type"], "object type name")
    key = names.name(asked.path["key"], "object key")
    return type_name, key, object_id(type_name, key)


async def state(api: RunsApi, asked: Asked) -> ObjectState:
    type_name, key, wid = _ids(asked)
    try:
        detail = await api._call("query", wid, {"id": wid, "name": INSPECT, "arg": None})
    except ApiError as error:
        # A key never called, or deleted (its run ended): empty state.
        if error.code == "NotFound" or (error.code == "Rejected" and "has ended" in error.message):
            return ObjectState(type_name, key, False, {}, version_of({}))
        raise
    return ObjectState(type_name, key, True, detail["state"], detail["version"])


async def _edit(api: RunsApi, asked: Asked, edit: dict[str, Any]) -> Edited:
    type_name, key, wid = _ids(asked)
    if asked.if_match is not None:
        edit["if_version"] = asked.if_match.strip().strip('"')
    check_edit(edit)
    call_id = uuid.uuid4().hex
    args = {
        "type": type_name,
        "id": wid,
        "input": {},
        "update": EDIT,
        "arg": {"a": edit, "id": call_id, "by": asked.by},
        "update_id": call_id,
    }
    answer = await api._retried("update_with_start", wid, args)
    return Edited(type_name, key, answer["version"], answer["changed"])


async def set_field(api: RunsApi, asked: Asked) -> Edited:
    field = names.name(asked.path["field"], "state field")
    return await _edit(api, asked, {"set": {field: asked.body}})


async def clear_field(api: RunsApi, asked: Asked) -> Edited:
    field = names.name(asked.path["field"], "state field")
    return await _edit(api, asked, {"clear": [field]})


async def patch(api: RunsApi, asked: Asked) -> Edited:
    if not isinstance(asked.body, list):
        raise RejectedError("the body: a JSON Patch (RFC 6902), a list of operations")
    return await _edit(api, asked, {"patch": asked.body})


async def edit(api: RunsApi, asked: Asked) -> Edited:
    if not isinstance(asked.body, dict) or "if_version" in asked.body:
        raise RejectedError("the body: an edit (clear_all, clear, set, patch); the version goes in If-Match")
    return await _edit(api, asked, dict(asked.body))


async def clear_all(api: RunsApi, asked: Asked) -> Edited:
    return await _edit(api, asked, {"clear_all": True})


async def call(api: RunsApi, asked: Asked) -> Called:
    type_name, key, wid = _ids(asked)
    handler = names.name(asked.path["handler"], "object handler name")
    if handler.startswith("fusee."):
        raise RejectedError(f"handler {handler!r}: the engine's own handlers are reached by their routes")
    body: CallBody = asked.body
    call_id = names.name(body.id, "call ID") if body.id is not None else uuid.uuid4().hex
    args = {
        "type": type_name,
        "id": wid,
        "input": {},
        "update": handler,
        "arg": {"a": body.arg, "id": call_id if body.id is not None else None},
        "update_id": call_id,
    }
    return Called(type_name, key, call_id, await api._retried("update_with_start", wid, args))


_STATE = "/v1/objects/{type}/{key}/state"
_EDITS = (400, 404, 412)

OBJECT_ROUTES = [
    Route("GET", _STATE, "objectState", "An object key's committed state and its version", ObjectState, state,
          errors=(400,)),
    Route("PUT", _STATE + "/{field}", "objectSetField", "Set one field of a key's state (the body is its value)",
          Edited, set_field, body=CallValue, errors=_EDITS),
    Route("DELETE", _STATE + "/{field}", "objectClearField", "Clear one field of a key's state", Edited,
          clear_field, errors=_EDITS),
    Route("PATCH", _STATE, "objectPatch", "Apply a JSON Patch (RFC 6902) to a key's state", Edited, patch,
          body=list[dict[str, Any]], errors=_EDITS),
    Route("POST", _STATE, "objectEdit", "Edit a key's state: clear_all, clear, set, patch, in that order", Edited,
          edit, body=dict[str, Any], errors=_EDITS),
    Route("DELETE", _STATE, "objectClear", "Clear a key's whole state", Edited, clear_all, errors=_EDITS),
    Route("POST", "/v1/objects/{type}/{key}/calls/{handler}", "objectCall",
          "Call a key's handler and wait for its result", Called, call, body=CallBody, errors=(400, 404, 422)),
]  # fmt: skip
