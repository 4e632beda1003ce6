"""The engine and the client are one interface: one scenario runs against an engine in
local mode and against a `fusee.Client` of a real server with a real worker, through one
fixture, and sees the same shapes (a listing is an async iterator, a status a `Status`,
results typed by their definitions) and the same errors (a value JSON cannot hold is a
`CodecError` naming its path; an unknown listing status is refused, naming the valid
ones)."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import fusee
import fusee.sync
from fusee import journal as R
from fusee.client import ClientRun
from fusee.journal import Status
from tests.server_mode.flows import WORKFLOWS, Order, Receipt, checkout, note, phase, review
from tests.support.procs import Server, Worker

Api = Any  # fusee.Engine or fusee.Client: the scenario does not know which


@pytest.fixture(params=["engine", "client"])
async def api(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    start_server: Callable[..., Server],
    start_worker: Callable[..., Worker],
) -> AsyncIterator[Api]:
    if request.param == "engine":
        engine = await fusee.Engine.open(str(tmp_path / "local"), workflows=WORKFLOWS)
        yield engine
        await engine.close()
    else:
        server = start_server()
        start_worker(server.address())
        client = await fusee.Client.connect(server.address())
        yield client
        await client.close()


async def rows(api: Api, **filters: Any) -> list[fusee.RunSummary]:
    return [row async for row in api.list(**filters)]


async def test_one_scenario_against_the_engine_and_the_client(api: Api) -> None:
    # What cannot be recorded is refused before anything is, naming where it is.
    with pytest.raises(fusee.CodecError, match=r"the workflow's input cannot be encoded") as bad:
        await api.start(checkout, "order-x", {"item": object(), "quantity": 1})
    assert bad.value.path == "$.item"
    with pytest.raises(fusee.CodecError, match="does not match"):
        await api.start(checkout, "order-x", {"item": "kettle", "quantity": "two"})
    with pytest.raises(fusee.NotFoundError):
        await api.run("order-x").status()

    run = await api.start(checkout, "order-1", Order("kettle", 2))
    assert await run.query(phase) == "review"
    assert await run.update(note, "gift wrap") == 1
    with pytest.raises(fusee.RejectedError, match="a note is not empty"):
        await run.update(note, "")
    with pytest.raises(fusee.CodecError, match="signal 'review'") as bad:
        await run.signal(review, {"approved": object()})
    assert bad.value.path == "$.approved"
    with pytest.raises(fusee.CodecError, match="does not match"):
        await run.signal(review, "yes")

    summary = await run.status()
    assert type(summary) is fusee.RunSummary and type(summary.status) is Status
    assert (summary.id, summary.run, summary.type, summary.status) == ("order-1", 1, "checkout", "running")
    described = await run.describe()
    assert type(described) is fusee.RunDescription and described.summary == summary
    kinds = {type(rec) for rec in described.journal}
    assert type(described.journal[0]) is R.Started and R.UpdateAccepted in kinds

    listing = api.list(type="checkout")
    assert not inspect.isawaitable(listing) and isinstance(listing, AsyncIterator)
    assert [row async for row in listing] == [summary]
    assert await rows(api, status=Status.RUNNING) == [summary]
    assert await rows(api, status="ok") == []
    for wrong in ("completed", "bogus", "parked"):
        with pytest.raises(fusee.RejectedError, match=r"expected one of running, .*ok, failed") as refused:
            await rows(api, status=wrong)
        assert repr(wrong) in str(refused.value)

    await run.signal(review, True)
    receipt = await run.result()
    assert receipt == Receipt("kettle", 2, True, ["gift wrap"])
    assert await api.run("order-1", checkout).result() == receipt  # typed by the definition given
    ended = await run.status()
    assert ended.status is Status.OK and ended.status == "ok"
    assert [row.id for row in await rows(api, status="ok")] == ["order-1"]
    with pytest.raises(fusee.NotFoundError):
        await run.signal(review, False)


SHARED = [
    "start",
    "run",
    "signal_with_start",
    "update_with_start",
    "complete",
    "fail",
    "list",
    "objects",
    "object_ref",
]
RUN = [
    "signal",
    "query",
    "update",
    "result",
    "status",
    "describe",
    "cancel",
    "terminate",
    "reset",
    "retry",
    "resume",
]


def shape(method: Any) -> list[tuple[str, Any, Any]]:
    """A method's parameters as a caller sees them: name, kind and default."""
    params = list(inspect.signature(method).parameters.values())[1:]  # without self
    return [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize("name", SHARED)
def test_the_engine_the_client_and_the_blocking_client_take_the_same_arguments(name: str) -> None:
    engine = shape(getattr(fusee.Engine, name))
    assert shape(getattr(fusee.Client, name)) == engine
    assert shape(getattr(fusee.sync.Client, name)) == engine


@pytest.mark.parametrize("name", RUN)
def test_run_handles_take_the_same_arguments(name: str) -> None:
    local = shape(getattr(fusee.Run, name))
    assert shape(getattr(ClientRun, name)) == local
    blocking = shape(getattr(fusee.sync.Run, name))
    if name == "result":  # the blocking one may give up waiting (the run goes on)
        assert blocking == [("timeout", inspect.Parameter.POSITIONAL_OR_KEYWORD, None)]
    else:
        assert blocking == local
