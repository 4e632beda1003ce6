"""`GET /v1/openapi.json`: the OpenAPI 3.1 document of the routes `http_runs.ROUTES`
lists, built from the msgspec types their handlers decode and encode.

`msgspec.json.schema_components` gives each type's JSON Schema (2020-12, the dialect
OpenAPI 3.1 uses); this module only arranges them into paths, parameters and responses.
Nothing here describes a field by hand, so a field the code adds, renames or constrains
shows in the document as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

import fusee
from fusee_server.http_types import Error


class Route(Protocol):
    """What the document reads of a route (http_runs.Route)."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def answer(self) -> Any: ...
    @property
    def query(self) -> Any: ...
    @property
    def body(self) -> Any: ...
    @property
    def status(self) -> int: ...
    @property
    def errors(self) -> tuple[int, ...]: ...
    @property
    def params(self) -> list[str]: ...


REF = "#/components/schemas/{name}"
ERROR_WORDS = {
    400: "Refused: a malformed request or argument; nothing was recorded",
    401: "No token, or not one of the server's",
    403: "The token, the Origin or the Host may not make this request",
    404: "No such run",
    409: "Taken: the ID policy refused, or the code does not match the run's journal",
    412: "The object's state changed since the version in If-Match; nothing was changed",
    413: "The body is too large",
    422: "A recorded failure (an update's handler raised)",
    503: "No worker could answer in time; retry",
}


def document(routes: Sequence[Route]) -> dict[str, Any]:
    bodies = [route.body for route in routes if route.body is not None]
    answers = [route.answer for route in routes]
    queries = [route.query for route in routes if route.query is not None]
    types = [*bodies, *answers, *queries, Error]
    schemas, components = msgspec.json.schema_components(types, ref_template=REF)
    schema_of = dict(zip(types, schemas, strict=True))
    # A query string's struct becomes parameters, one per field, not a schema of its own.
    query_schemas = {query: components.pop(query.__name__) for query in set(queries)}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "operationId": route.name,
            "summary": route.summary,
            "parameters": [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in route.params
            ],
            "responses": {
                str(route.status): _json(schema_of[route.answer], "The answer"),
                **{
                    str(status): _json({"$ref": REF.format(name="Error")}, ERROR_WORDS[status])
                    for status in sorted({*route.errors, 401, 403, 503})
                },
            },
        }
        if route.query is not None:
            operation["parameters"] += _parameters(query_schemas[route.query])
        if route.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema_of[route.body]}},
            }
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Fusee HTTP API",
            "version": fusee.__version__,
            "description": "Start, signal, query, update and read durable workflow runs; call and edit objects (docs/http-api.md).",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        # A server without a token takes requests without one (on loopback only).
        "security": [{"bearer": []}, {}],
    }


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _parameters(schema: dict[str, Any]) -> list[dict[str, Any]]:
    required = set(schema.get("required", ()))
    return [
        {
            "name": name,
            "in": "query",
            "required": name in required,
            "schema": {k: v for k, v in field.items() if k != "description"},
            **({"description": field["description"]} if "description" in field else {}),
        }
        for name, field in schema["properties"].items()
    ]
