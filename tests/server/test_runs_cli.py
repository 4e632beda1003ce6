"""`fusee runs` on a data directory: the command opens an engine there without any
workflow code, records what it is asked (who asked too), and the application's engine
acts on it when it opens the directory again with its code. A directory another process
holds (an application, a `fusee server`) is refused, naming the holder
(docs/run-operations.md, *The fusee runs command*)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

import fusee
from fusee import journal as R
from tests.server_mode.flows import WORKFLOWS
from tests.support.procs import Server
from tests.support.runs_cli import BY, Cli, ok, runs
from tests.support.waiting import eventually

PAUSED, FAILED, WAITING = ("p-1", "p-2"), ("f-1",), ("w-1", "w-2", "w-3")
BULK = 200


async def _application(data: Path, *, bulk: int = 0) -> None:
    """What the application did before it closed: runs paused out of retries, one
    failed, three waiting for a signal, and `bulk` more paused ones."""
    async with await fusee.Engine.open(str(data), workflows=WORKFLOWS) as engine:
        for wid in PAUSED + tuple(f"b-{i:03d}" for i in range(bulk)):
            await engine.start("flaky", wid, True)
        await engine.start("flaky", "f-1", False)
        for wid in WAITING:
            await engine.start("waiter", wid, 1)

        async def settled() -> bool:
            statuses = [row.status async for row in engine.list(type="flaky")]
            return statuses.count("paused") == len(PAUSED) + bulk and "failed" in statuses

        await eventually(settled, timeout=30, every=0.05)


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    steps = tmp_path / "steps"
    monkeypatch.setenv("FUSEE_TEST_STEPS", str(steps))  # flows' charge step fails until steps.fixed
    return tmp_path / "data"


async def test_each_action_on_a_directory_is_taken_up_by_the_application(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _application(data)
    cli = Cli(capsys)

    # Without the code here, a paused or failed run shows as such; one that would run
    # shows as waiting for its code.
    table = ok(runs("ls", data)).splitlines()  # one as a real process
    assert table[0].split() == ["id", "run", "type", "status", "shard"]
    statuses = {line.split()[0]: line.split()[3] for line in table[1:]}
    assert statuses == {
        "f-1": "failed",
        "p-1": "paused",
        "p-2": "paused",
        "w-1": "waiting_for_code",
        "w-2": "waiting_for_code",
        "w-3": "waiting_for_code",
    }
    listed = json.loads(ok(await cli("ls", data, "--json", "--status", "paused")))
    assert [row["id"] for row in listed["runs"]] == ["p-1", "p-2"] and listed["next_after"] is None
    described = json.loads(ok(await cli("show", data, "p-1", "--json")))
    assert described["summary"] == {"id": "p-1", "run": 1, "type": "flaky", "status": "paused", "shard": 3}
    attempts = [r for r in described["journal"] if r["record"] == "Attempt"]
    assert attempts[-1]["paused"] is True and attempts[-1]["failure"]["message"] == "payments are down"

    ok(await cli("signal", data, "w-1", "go", "7"))
    ok(await cli("cancel", data, "w-2", "--reason", "not needed"))
    ok(await cli("terminate", data, "w-3"))
    assert ok(await cli("resume", data, "p-1")).strip() == f"p-1: resume recorded (by {BY})"
    assert json.loads(ok(await cli("retry", data, "f-1", "--json")))["run"] == 2
    assert json.loads(ok(await cli("reset", data, "p-2", "--before", "prepare", "--json")))["run"] == 2
    again = await cli("resume", data, "p-1")
    assert again.returncode == 2 and "has no step paused out of retries" in again.stderr
    missing = await cli("show", data, "nope")
    assert missing.returncode == 2 and "no workflow 'nope'" in missing.stderr

    # The application opens the directory again, with the fix: it acts on all of it.
    (tmp_path / "steps.fixed").write_text("deployed")
    async with await fusee.Engine.open(str(data), workflows=WORKFLOWS) as engine:
        for wid in ("p-1", "p-2", "f-1"):
            assert await asyncio.wait_for(engine.run(wid).result(), 20) == "charged"
        assert await engine.run("w-1").result() == [7]
        assert (await engine.run("w-2").status()).status == "cancelled"
        assert (await engine.run("w-3").status()).status == "terminated"
        resumed = [r for r in (await engine.run("p-1").describe()).journal if isinstance(r, R.Resume)]
        assert [(r.name, r.by) for r in resumed] == [("charge", BY)]
        reset = [r for r in (await engine.run("p-2").describe()).journal if isinstance(r, R.Reset)]
        assert reset == [R.Reset(1, "prepare", BY, True)]


async def test_bulk_resume_on_a_directory(data: Path, tmp_path: Path) -> None:
    await _application(data, bulk=BULK)
    done = await asyncio.to_thread(runs, "bulk", "resume", data, "--type", "flaky", "--prefix", "b-")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"resumed {BULK} of {BULK} paused runs of type flaky"
    assert done.stderr.splitlines()[-1] == f"resumed {BULK}/{BULK} (0 refused)"
    (tmp_path / "steps.fixed").write_text("deployed")
    async with await fusee.Engine.open(str(data), workflows=WORKFLOWS) as engine:

        async def all_done() -> bool:
            rows = [row async for row in engine.list(type="flaky", status="ok")]
            return len(rows) == BULK

        await eventually(all_done, timeout=30, every=0.05)
        assert (await engine.run("p-1").status()).status == "paused"  # not under the prefix


async def test_a_directory_another_process_holds_is_refused(
    data: Path, tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    async with await fusee.Engine.open(str(data), workflows=WORKFLOWS):
        held = await asyncio.to_thread(runs, "ls", data)
    assert held.returncode == 2 and held.stdout == ""
    assert "the directory is open in process" in held.stderr and "address of the server" in held.stderr

    start_server(dir=tmp_path / "server")
    served = await asyncio.to_thread(runs, "ls", tmp_path / "server")
    assert served.returncode == 2 and "is open in process" in served.stderr, served.stderr
    empty = await asyncio.to_thread(runs, "ls", tmp_path)
    assert empty.returncode == 2 and "is not a Fusee data directory (no fusee.meta)" in empty.stderr
