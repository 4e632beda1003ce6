"""One scenario, every way into the handler (STYLE: one fixture over implementations):
`handler.invoke` itself, the Lambda adapter with each event shape AWS sends (and the
server's direct invocation), uvicorn serving `handlers.asgi:app` in its own process, and
the real Lambda runtime interface client running `handlers.aws_lambda.handler`, behind a
function URL and invoked directly.

Every handler here is configured with the address of a counting `Listener`: a request it
refuses must leave that count unchanged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from fusee.invoke import InvocationHandler, invocation_handler
from tests.invoke import events, flows
from tests.support.handlers import SECRET, Entry, LambdaRuntime, Listener, RuntimeApi, Uvicorn, in_thread
from tests.support.procs import environment


def _json(data: bytes) -> Any:
    return json.loads(data) if data else None


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    found = Listener()
    found.start()
    yield found
    found.stop()


@pytest.fixture(scope="module")
def handler(listener: Listener) -> InvocationHandler:
    return invocation_handler(listener.address, workflows=[flows.greet], secret=SECRET)


@pytest.fixture(scope="module")
def settings(listener: Listener) -> dict[str, str]:
    return environment(
        FUSEE_URL=listener.address,
        FUSEE_INVOKE_SECRET=SECRET,
        FUSEE_WORKFLOWS="tests.invoke.flows",
        FUSEE_INVOKE_TRACE="1",
    )


@pytest.fixture(scope="module")
def uvicorn_app(settings: dict[str, str]) -> Iterator[Uvicorn]:
    proc = Uvicorn(settings)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def runtime_api() -> Iterator[RuntimeApi]:
    api = RuntimeApi()
    yield api
    api.close()


@pytest.fixture(scope="module")
def lambda_runtime(runtime_api: RuntimeApi, settings: dict[str, str]) -> Iterator[LambdaRuntime]:
    proc = LambdaRuntime(runtime_api, settings)
    yield proc
    proc.stop()


LAMBDA_SHAPES = sorted(events.SHAPES)
ENTRIES = [
    "invoke",
    *(f"lambda:{shape}" for shape in LAMBDA_SHAPES),
    "uvicorn",
    "awslambdaric",
    "awslambdaric:direct",
]


@pytest.fixture(params=ENTRIES)
def entry(request: pytest.FixtureRequest, handler: InvocationHandler) -> Entry:
    name: str = request.param
    if name == "invoke":

        def post(headers: dict[str, str], body: bytes) -> tuple[int, Any]:
            status, _, data = in_thread(lambda: asyncio.run(handler.invoke(headers, body)))
            return status, _json(data)

    elif name.startswith("lambda:"):
        shape = events.SHAPES[name.removeprefix("lambda:")]

        def post(headers: dict[str, str], body: bytes) -> tuple[int, Any]:
            answer = in_thread(lambda: handler.lambda_handler(shape(headers, body), None))
            status, data = events.response(answer)
            return status, _json(data)

    elif name == "uvicorn":
        app: Uvicorn = request.getfixturevalue("uvicorn_app")

        def post(headers: dict[str, str], body: bytes) -> tuple[int, Any]:
            status, _, data = app.request("POST", headers, body)
            return status, _json(data)

    else:
        api: RuntimeApi = request.getfixturevalue("runtime_api")
        request.getfixturevalue("lambda_runtime")
        event = events.direct if name.endswith(":direct") else events.function_url

        def post(headers: dict[str, str], body: bytes) -> tuple[int, Any]:
            kind, answer = api.invoke(event(headers, body))
            assert kind == "response", answer
            status, data = events.response(answer)
            return status, _json(data)

    return Entry(name, post)
