"""`fusee runs` against a real server and a worker process: each action, the table and
`--json` shapes, who asked (`cli:USER`) in the worker's journal, clear failures (a
missing run, a wrong address, a bad option), and `bulk resume --type flaky` of many
paused runs once their step is fixed (docs/run-operations.md, *The fusee runs command*)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import fusee
from fusee import journal as R
from tests.support.procs import Server, Worker, listed
from tests.support.runs_cli import BY, Cli, ok, runs
from tests.support.server_cli import token_file
from tests.support.waiting import eventually


def _reach(client: fusee.Client, type: str, status: str, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(await listed(client, type, status)) == count

    return check


async def test_each_action_through_a_server(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    start_server: Callable[..., Server],
    start_worker: Callable[..., Worker],
) -> None:
    cli = Cli(capsys)
    steps = tmp_path / "steps"
    server = start_server()
    start_worker(server.address(), steps_file=steps)
    address = server.address()
    async with await fusee.Client.connect(address) as client:
        for wid in ("p-1", "p-2"):
            await client.start("flaky", wid, True)
        await client.start("flaky", "f-1", False)
        for wid in ("w-1", "w-2", "w-3"):
            await client.start("waiter", wid, 1)
        await eventually(_reach(client, "flaky", "paused", 2), timeout=15)

        # ls: a table sorted by ID, JSON with the page's cursor, filters, paging.
        table = ok(runs("ls", address)).splitlines()  # one as a real process
        assert table[0].split() == ["id", "run", "type", "status", "shard"]
        assert [line.split()[0] for line in table[1:]] == ["f-1", "p-1", "p-2", "w-1", "w-2", "w-3"]
        assert table[2].split()[1:4] == ["1", "flaky", "paused"]
        page = json.loads(ok(await cli("ls", address, "--json", "--limit", "4")))
        assert [r["id"] for r in page["runs"]] == ["f-1", "p-1", "p-2", "w-1"]
        assert page["next_after"] == "w-1" and set(page["runs"][0]) == {
            "id",
            "run",
            "type",
            "status",
            "shard",
        }
        rest = json.loads(ok(await cli("ls", address, "--json", "--after", "w-1")))
        assert [r["id"] for r in rest["runs"]] == ["w-2", "w-3"] and rest["next_after"] is None
        paused = json.loads(ok(await cli("ls", address, "--json", "--status", "paused")))
        assert [r["id"] for r in paused["runs"]] == ["p-1", "p-2"]
        prefixed = json.loads(ok(await cli("ls", address, "--json", "--type", "waiter", "--prefix", "w-2")))
        assert [r["id"] for r in prefixed["runs"]] == ["w-2"]

        # show: the summary and the journal, in a table and as JSON with payloads as values.
        shown = ok(await cli("show", address, "p-1")).splitlines()
        assert shown[0].split()[:6] == ["p-1", "run", "1", "type", "flaky", "paused"]
        assert any("Attempt" in line and "paused=true" in line for line in shown[2:])
        described = json.loads(ok(await cli("show", address, "p-1", "--json")))
        assert described["summary"]["status"] == "paused"
        assert described["journal"][0]["record"] == "Started" and described["journal"][0]["input"] is True
        assert {"record": "StepDone", "seq": 0, "name": "prepare", "value": "ready"} in described["journal"]

        # signal, cancel, terminate: recorded with who asked.
        assert json.loads(ok(await cli("signal", address, "w-1", "go", "7", "--json"))) == {
            "id": "w-1",
            "action": "signal",
            "by": BY,
        }
        assert await client.run("w-1").result() == [7]
        ok(await cli("cancel", address, "w-2", "--reason", "not needed"))
        said = ok(await cli("terminate", address, "w-3", "--reason", "stop"))
        assert said.strip() == f"w-3: terminate recorded (by {BY})"
        assert (await client.run("w-2").status()).status == "cancelled"
        assert (await client.run("w-3").status()).status == "terminated"
        journal = (await client.run("w-1").describe()).journal
        assert next(r for r in journal if isinstance(r, R.SignalReceived)).by == BY
        end = (await client.run("w-3").describe()).journal[-1]
        assert isinstance(end, R.Finished) and end.by == BY

        # The fix is deployed: resume, retry, reset.
        (tmp_path / "steps.fixed").write_text("deployed")
        ok(await cli("resume", address, "p-1"))
        assert await client.run("p-1").result() == "charged"
        retried = json.loads(ok(await cli("retry", address, "f-1", "--json")))
        assert retried == {"id": "f-1", "action": "retry", "by": BY, "run": 2}
        assert await client.run("f-1").result() == "charged"
        reset = ok(await cli("reset", address, "p-1", "--before-step", "charge"))
        assert reset.strip() == f"p-1: reset now run 2 (by {BY})"
        assert await client.run("p-1").result() == "charged"
        cut = [r for r in (await client.run("p-1").describe()).journal if isinstance(r, R.Reset)]
        assert cut == [R.Reset(1, "charge", BY, True)]
        again = await cli("reset", address, "p-1", "--before", "prepare", "--no-reapply-signals", "--json")
        assert json.loads(ok(again))["run"] == 3
        resumed = [r for r in (await client.run("p-2").describe()).journal if isinstance(r, R.Resume)]
        assert resumed == []  # p-2 was left paused


async def test_failures_name_the_problem(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    start_server: Callable[..., Server],
    start_worker: Callable[..., Worker],
) -> None:
    server = start_server()
    start_worker(server.address(), steps_file=tmp_path / "steps")
    address = server.address()
    async with await fusee.Client.connect(address) as client:
        await client.start("flaky", "f-1", False)
        await eventually(_reach(client, "flaky", "failed", 1), timeout=15)
    cases = [
        (["show", address, "nope"], 2, "fusee runs: no workflow 'nope'"),
        (["resume", address, "nope"], 2, "no workflow 'nope'"),
        (["resume", address, "f-1"], 2, "has no step paused out of retries (it is failed"),
        (["reset", address, "f-1", "--before", "nope"], 2, "has no step 'nope' (its steps: charge, prepare"),
        (["ls", "127.0.0.1:9"], 2, "cannot connect to the server at 127.0.0.1:9"),
        (["ls", "no-such-host-here:x"], 2, "address 'no-such-host-here:x'"),
        (["ls", str(tmp_path / "missing")], 2, "is neither a data directory"),
        (["ls", "data"], 2, "data is neither a data directory (none there) nor a server address"),
        (["ls", address, "--status", "sleepy"], 2, "sleepy"),
        (["ls", address, "--limit", "0"], 2, "--limit: 0: give a number from 1"),
        (["signal", address, "f-1", "go", "{nope"], 2, "signal value '{nope' is not JSON"),
        (["reset", address, "f-1"], 2, "the following arguments are required: --before-step"),
        (["frobnicate", address], 2, "invalid choice: 'frobnicate'"),
        (["ls", f"{address}?token-file=/nonexistent"], 2, "/nonexistent"),
    ]
    cli = Cli(capsys)
    for i, (args, code, message) in enumerate(cases):
        done = runs(*args) if i < 2 else await cli(*args)  # the first two as real processes
        assert done.returncode == code and message in done.stderr, (args, done.returncode, done.stderr)
        assert done.stdout == ""


async def test_a_server_without_a_worker_is_said_so(start_server: Callable[..., Server]) -> None:
    server = start_server()  # no worker: nothing holds the shards
    done = runs("resume", server.address(), "p-1", "--timeout", "10")
    assert done.returncode == 2
    assert "no worker holds shard" in done.stderr and "start a worker" in done.stderr, done.stderr


BULK = 1000


async def test_bulk_resume_of_a_thousand_paused_runs(
    tmp_path: Path,
    start_server: Callable[..., Server],
    start_worker: Callable[..., Worker],
) -> None:
    """1,000 runs whose step fails until a flag file exists pause; once it exists, one
    `bulk resume --type flaky` (its default concurrency) resumes them all and every one
    completes; a run of another type is left alone. About 11 s here, the command 2.6 s."""
    count = BULK
    steps = tmp_path / "steps"
    server = start_server()
    start_worker(server.address(), steps_file=steps)
    address = server.address()
    async with await fusee.Client.connect(address) as client:
        ids = [f"bulk-{i:04d}" for i in range(count)]
        gate = asyncio.Semaphore(64)

        async def start(wid: str) -> None:
            async with gate:
                await client.start("flaky", wid, True)

        await asyncio.gather(*(start(wid) for wid in ids))
        await client.start("waiter", "other-1", 1)  # another type: not selected
        await eventually(_reach(client, "flaky", "paused", count), timeout=120, every=0.5)

        (tmp_path / "steps.fixed").write_text("deployed")
        began = time.monotonic()
        done = await asyncio.to_thread(runs, "bulk", "resume", address, "--type", "flaky", timeout=300)
        took = time.monotonic() - began
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"resumed {count} of {count} paused runs of type flaky"
        progress = [line for line in done.stderr.splitlines() if line.startswith("resumed ")]
        assert progress[-1] == f"resumed {count}/{count} (0 refused)"
        await eventually(_reach(client, "flaky", "ok", count), timeout=120, every=0.5)
        assert (await client.run("other-1").status()).status == "running"
        print(f"bulk resume of {count} paused runs: {took:.2f} s (the command, start to exit)")


async def test_tokens_go_in_the_address_and_a_refused_bulk_resume_exits_1(
    tmp_path: Path, start_server: Callable[..., Server], start_worker: Callable[..., Worker]
) -> None:
    """A read token lists the paused runs but may not resume them: each refusal is named
    on stderr and counted, and the command exits 1; a client token resumes them."""
    worker, client_token = token_file(tmp_path, "worker-token"), token_file(tmp_path, "client-token")
    read = token_file(tmp_path, "read-token")
    options = ("--token-file", worker, "--client-token-file", client_token, "--read-token-file", read)
    server = start_server(*options)
    start_worker(server.address(token_file=worker), steps_file=tmp_path / "steps")
    as_client, as_reader = server.address(token_file=client_token), server.address(token_file=read)
    async with await fusee.Client.connect(as_client) as client:
        for wid in ("p-1", "p-2"):
            await client.start("flaky", wid, True)
        await eventually(_reach(client, "flaky", "paused", 2), timeout=15)
        refused = await asyncio.to_thread(runs, "bulk", "resume", as_reader, "--json")
        assert refused.returncode == 1, refused.stderr
        answer = json.loads(refused.stdout)
        assert (answer["selected"], answer["resumed"]) == (2, 0)
        assert [r["id"] for r in sorted(answer["refused"], key=lambda r: r["id"])] == ["p-1", "p-2"]
        assert all("'resume'" in r["error"] for r in answer["refused"]), answer
        assert "p-1: " in refused.stderr and "resumed 0/2 (2 refused)" in refused.stderr
        assert json.loads(ok(runs("bulk", "resume", as_client, "--json")))["resumed"] == 2
