"""Run operations through a real server and a worker process, from `fusee.Client` and
`fusee.sync.Client`: resume of a paused run, retry of a failed one, reset of a finished
one, their refusals (the same class and message as in process), and the requester each
client names (`fusee.as_requester`) recorded as `by` in the worker's journal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from fusee_server.access import Scope, refusal

import fusee
import fusee.sync
from fusee import journal as R
from fusee.journal import Status
from fusee.protocol import messages as m
from tests.support.procs import Server, Worker
from tests.support.waiting import eventually


def _is(client: fusee.Client, wid: str, status: Status) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await client.run(wid).status()).status == status

    return check


async def test_resume_retry_and_reset_through_a_server(
    tmp_path: Path, start_server: Callable[..., Server], start_worker: Callable[..., Worker]
) -> None:
    steps = tmp_path / "steps"
    server = start_server()
    start_worker(server.address(), steps_file=steps)
    client = await fusee.Client.connect(server.address())
    try:
        paused = await client.start("flaky", "p-1", True)
        failed = await client.start("flaky", "f-1", False)
        await eventually(_is(client, "p-1", Status.PAUSED), timeout=10, every=0.05)
        await eventually(_is(client, "f-1", Status.FAILED), timeout=10, every=0.05)
        assert [row.id async for row in client.list(status="paused")] == ["p-1"]

        # Refusals come back as the engine raises them.
        with pytest.raises(fusee.RejectedError, match=r"has no step paused out of retries \(it is failed"):
            await failed.resume()
        with pytest.raises(fusee.RejectedError, match=r"has not failed \(it is paused"):
            await paused.retry()
        with pytest.raises(fusee.RejectedError, match=r"has no step 'nope' \(its steps: charge, prepare"):
            await paused.reset("nope")

        (tmp_path / "steps.fixed").write_text("deployed")
        with fusee.as_requester("cli:ana"):
            await paused.resume()
            assert await failed.retry() == 2
        assert await paused.result() == "charged"
        assert await failed.result() == "charged"
        resumed = [r for r in (await paused.describe()).journal if isinstance(r, R.Resume)]
        assert [(r.name, r.attempt, r.by) for r in resumed] == [("charge", 2, "cli:ana")]
        journal = (await failed.describe()).journal
        assert [r for r in journal if isinstance(r, R.Reset)] == [R.Reset(1, "charge", "cli:ana", True)]
        assert not any(isinstance(r, R.StepFailed) for r in journal)  # cut before it

        # A finished run starts again from before a named step.
        assert await paused.reset("prepare", reapply_signals=False) == 2
        assert await paused.result() == "charged"
        assert (await paused.status()).run == 2
    finally:
        await client.close()


def _blocking(address: str) -> list[R.Rec]:
    """A script's view: the blocking client, naming its requester around its calls."""
    with fusee.sync.Client.connect(address) as client:
        run = client.start("waiter", "w-1", 2)
        with fusee.as_requester("script:bob"):
            run.signal("go", 1)
            run.terminate("not needed")
        with pytest.raises(fusee.RejectedError, match="no step paused"):
            client.run("w-1").resume()
        return client.run("w-1").describe().journal


async def test_the_blocking_client_sends_its_requester(
    start_server: Callable[..., Server], start_worker: Callable[..., Worker]
) -> None:
    server = start_server()
    start_worker(server.address())
    journal = await asyncio.to_thread(_blocking, server.address())
    signal = next(r for r in journal if isinstance(r, R.SignalReceived))
    end = journal[-1]
    assert signal.by == "script:bob"
    assert isinstance(end, R.Finished) and end.status == "terminated" and end.by == "script:bob"


@pytest.mark.parametrize("method", ["reset", "retry", "resume"])
def test_a_read_token_may_not_reset_retry_or_resume(method: str) -> None:
    refused = refusal(Scope.READ, m.Call(1, method, 0, b""))
    assert refused is not None and repr(method) in refused
    assert refusal(Scope.CLIENT, m.Call(1, method, 0, b"")) is None
