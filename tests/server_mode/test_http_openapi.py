"""`GET /v1/openapi.json`: a valid OpenAPI 3.1 document (openapi-spec-validator), and true:
every operation it lists is called here against a real server and worker, and each
answer (the documented success, and the errors) validates against the schema the
document gives for it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonschema
from openapi_spec_validator import validate

from tests.support.http import Http
from tests.support.server_cli import base_url

Call = Callable[[Http], Awaitable[tuple[int, Any]]]


# One call per operation, in an order where each finds what it needs (a run to signal).
async def _streamed(api: Http) -> tuple[int, Any]:
    await api.post("/v1/runs", {"type": "streamer", "id": "doc-s", "input": 3})
    return await api.get("/v1/runs/doc-s/streams/numbers", **{"from": "0", "wait": "10000"})


CALLS: dict[str, Call] = {
    "openapi": lambda api: api.get("/v1/openapi.json"),
    "info": lambda api: api.get("/v1/info"),
    "invocations": lambda api: api.get("/v1/invocations"),
    "start": lambda api: api.post("/v1/runs", {"type": "checkout", "id": "doc-1", "input": {"item": "a", "quantity": 1}}),
    "query": lambda api: api.get("/v1/runs/doc-1/queries/phase"),
    "update": lambda api: api.post("/v1/runs/doc-1/updates/note", {"arg": "hi"}),
    "signal": lambda api: api.post("/v1/runs/doc-1/signals/review", {"value": True}),
    "result": lambda api: api.get("/v1/runs/doc-1/result", wait="10000"),
    "describe": lambda api: api.get("/v1/runs/doc-1"),
    "stream": lambda api: _streamed(api),
    "list": lambda api: api.get("/v1/runs", limit="1"),
    "cancel": lambda api: _started_then(api, "doc-2", "cancel"),
    "terminate": lambda api: _started_then(api, "doc-3", "terminate"),
    "reset": lambda api: api.post("/v1/runs/doc-1/reset", {"beforeStep": "ship"}),
    "complete": lambda api: _awaiting_then(api, "doc-c", "complete", {"ok": 1}),
    "fail": lambda api: _awaiting_then(api, "doc-x", "fail", "declined"),
    "retry": lambda api: _flaky_then(api, "doc-f", "failed", "retry"),
    "resume": lambda api: _flaky_then(api, "doc-p", "paused", "resume"),
    "objectCall": lambda api: api.post("/v1/objects/ledger/doc-k/calls/append", {"arg": "a", "id": "c-1"}),
    "objectState": lambda api: api.get("/v1/objects/ledger/doc-k/state"),
    "objectSetField": lambda api: api.request("PUT", "/v1/objects/ledger/doc-k/state/note", "hi"),
    "objectClearField": lambda api: api.request("DELETE", "/v1/objects/ledger/doc-k/state/note", headers={"X-Fusee-Action": "1"}),
    "objectPatch": lambda api: api.request("PATCH", "/v1/objects/ledger/doc-k/state", [{"op": "add", "path": "/n", "value": 1}]),
    "objectEdit": lambda api: api.post("/v1/objects/ledger/doc-k/state", {"set": {"m": 2}}),
    "objectClear": lambda api: api.request("DELETE", "/v1/objects/ledger/doc-k/state", headers={"X-Fusee-Action": "1"}),
}  # fmt: skip


STEPS = [Path("steps")]  # the worker's FUSEE_TEST_STEPS: the test puts it under its tmp_path


async def _awaiting_then(api: Http, id: str, operation: str, body: Any) -> tuple[int, Any]:
    """An `awaiting` run's callback token (its send function writes it), then `operation`."""
    await api.ok("POST", "/v1/runs", {"type": "awaiting", "id": id, "input": 0})
    token = STEPS[0].with_name(f"steps.{id}.token")
    for _ in range(200):
        if token.exists() and token.read_text():
            break
        await asyncio.sleep(0.05)
    return await api.post(f"/v1/{operation}/{token.read_text()}", body)


async def _flaky_then(api: Http, id: str, status: str, operation: str) -> tuple[int, Any]:
    """A `flaky` run (its step never fixed here) once it is `status`, then `operation`."""
    await api.ok("POST", "/v1/runs", {"type": "flaky", "id": id, "input": status == "paused"})
    for _ in range(200):
        if (await api.ok("GET", f"/v1/runs/{id}", journal="false"))["status"] == status:
            break
        await asyncio.sleep(0.05)
    return await api.post(f"/v1/runs/{id}/{operation}")


async def _started_then(api: Http, id: str, operation: str) -> tuple[int, Any]:
    await api.ok("POST", "/v1/runs", {"type": "waiter", "id": id, "input": 1})
    return await api.post(f"/v1/runs/{id}/{operation}", {"reason": "test"})


def operations(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        operation["operationId"]: operation
        for methods in document["paths"].values()
        for operation in methods.values()
    }


def check(document: dict[str, Any], schema: dict[str, Any], value: Any) -> None:
    """`value` against `schema`, its references resolved in the document."""
    jsonschema.Draft202012Validator({**schema, "components": document["components"]}).validate(value)


async def test_the_document_is_valid_and_every_operation_answers_as_it_says(
    start_server, start_worker, tmp_path
):
    STEPS[0] = tmp_path / "steps"
    server = start_server("--http", "127.0.0.1:0")
    start_worker(server.address(), steps_file=STEPS[0])
    async with Http(base_url(server)) as api:
        status, document = await api.get("/v1/openapi.json")
        assert status == 200
        validate(document)  # OpenAPI 3.1, its schemas JSON Schema 2020-12
        listed = operations(document)
        assert listed.keys() == CALLS.keys(), "an operation without a call here, or a call for none"
        for name, call in CALLS.items():
            status, answer = await call(api)
            responses = listed[name]["responses"]
            assert str(status) in responses and status < 300, (name, status, answer)
            check(document, responses[str(status)]["content"]["application/json"]["schema"], answer)
        assert (await api.ok("GET", "/v1/runs/doc-1/result", wait="10000"))["status"] == "ok"
        # Errors are the documented Error, for every operation that can fail.
        error = listed["describe"]["responses"]["404"]["content"]["application/json"]["schema"]
        status, answer = await api.get("/v1/runs/nobody")
        assert status == 404
        check(document, error, answer)
        status, answer = await api.post("/v1/runs", {"type": 1})
        assert status == 400
        check(document, error, answer)


async def test_request_bodies_the_document_refuses_the_api_refuses(start_server):
    """The document says which fields a start takes (no others): the API says the same."""
    server = start_server("--http", "127.0.0.1:0")
    async with Http(base_url(server)) as api:
        document = await api.ok("GET", "/v1/openapi.json")
        schema = operations(document)["start"]["requestBody"]["content"]["application/json"]["schema"]
        for body in (
            {"type": "t", "id": "i", "colour": "red"},
            {"type": "t"},
            {"type": "t", "id": "i", "options": {"delay": []}},
        ):
            try:
                check(document, schema, body)
            except jsonschema.ValidationError:
                pass
            else:
                raise AssertionError(f"the document takes {body}")
            status, answer = await api.post("/v1/runs", body)
            assert (status, answer["code"]) == (400, "Rejected"), (body, answer)
