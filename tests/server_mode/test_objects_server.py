"""Objects through a server (docs/objects.md): clients call keys held by two worker
processes, a workflow calls keys on other workers' shards, a worker SIGKILLed mid-load
loses no acknowledged call, and the state is read and edited through the HTTP API
(`If-Match`: 412 on a stale version) and `fusee objects`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import fusee
import fusee.sync
from tests.support.http import Http
from tests.support.procs import ROOT, retry
from tests.support.server_cli import base_url


async def test_calls_through_a_server_reach_every_workers_keys_once(start_server, start_worker):
    server = start_server()
    start_worker(server.address())
    second = start_worker(server.address())
    client = await retry(lambda: fusee.Client.connect(server.address()))
    try:
        entries = [(f"k{i % 8}", f"e{i}") for i in range(80)]

        async def append(key: str, entry: str) -> int:
            ref = client.object_ref("ledger", key)
            return await retry(lambda: ref.call("append", entry, id=entry), timeout=60)

        first_half = await asyncio.gather(*(append(k, e) for k, e in entries[:40]))
        second.kill()  # its shards go to the other worker; calls sent again by ID run once
        rest = await asyncio.gather(*(append(k, e) for k, e in entries[40:]))
        positions = dict(zip([e for _, e in entries], [*first_half, *rest], strict=True))
        for i in range(8):
            state = await retry(lambda i=i: client.object_ref("ledger", f"k{i}").state(), timeout=60)
            mine = [e for k, e in entries if k == f"k{i}"]
            assert sorted(state["log"]) == sorted(mine) and len(state["log"]) == len(mine)
            assert all(state["log"][positions[e] - 1] == e for e in mine)
        # A workflow's calls (on a worker) to keys on any shard, each once.
        run = await retry(lambda: client.start("bookkeeper", "bk-1", [f"k{i}" for i in range(8)]))
        assert await asyncio.wait_for(run.result(), 60) == [11] * 8
        assert sorted([key async for key in client.objects("ledger")]) == [f"k{i}" for i in range(8)]
    finally:
        await client.close()

    def blocking() -> tuple[int, dict]:
        with fusee.sync.Client.connect(server.address()) as sync_client:
            ref = sync_client.object_ref("ledger", "k0")
            return ref.call("append", "sync-1", id="sync-1"), ref.inspect()

    position, detail = await asyncio.to_thread(blocking)
    assert position == 12 and detail["state"]["log"][-1] == "sync-1" and detail["exists"]


async def test_state_is_read_and_edited_over_http_and_with_fusee_objects(
    start_server, start_worker, tmp_path
):
    server = start_server("--http", "127.0.0.1:0")
    start_worker(server.address())
    async with Http(base_url(server)) as api:
        path = "/v1/objects/ledger/a1"
        status, answer = await retry(lambda: api.post(path + "/calls/append", {"arg": "x", "id": "c1"}))
        assert status == 200 and answer["value"] == 1, answer
        status, read = await api.get(path + "/state")
        assert status == 200 and read["state"] == {"log": ["x"]} and read["exists"]
        status, edited = await api.request("PUT", path + "/state/note", "gift wrap")
        assert status == 200 and edited["changed"] == ["note"]
        op = [{"op": "add", "path": "/log/-", "value": "y"}]
        status, error = await api.request("PATCH", path + "/state", op, headers={"If-Match": read["version"]})
        assert status == 412 and error["code"] == "StaleVersion", error
        status, patched = await api.request(
            "PATCH", path + "/state", op, headers={"If-Match": edited["version"]}
        )
        assert status == 200 and patched["changed"] == ["log"]
        status, error = await api.request("PATCH", path + "/state", [{"op": "remove", "path": "/nope"}])
        assert status == 400 and "patch operation 0" in error["message"]
        status, _ = await api.request("DELETE", path + "/state/note", headers={"X-Fusee-Action": "1"})
        assert status == 200
        status, read = await api.get(path + "/state")
        assert read["state"] == {"log": ["x", "y"]}
        status, error = await api.post(path + "/calls/nope", {})
        assert status == 400 and "no handler" in error["message"] and "'nope'" in error["message"]

    def cli(*args: str, editor: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if editor is not None:
            env["EDITOR"] = editor
        return subprocess.run(
            [sys.executable, "-m", "fusee", "objects", *args], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip

    address = server.address()
    shown = cli("show", address, "ledger", "a1", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == {"log": ["x", "y"]}
    dry = cli("patch", address, "ledger", "a1", '[{"op": "remove", "path": "/log/0"}]', "--dry-run")
    assert dry.returncode == 0 and "would change: log" in dry.stdout, dry.stdout + dry.stderr
    assert json.loads(cli("show", address, "ledger", "a1", "--json").stdout)["state"]["log"] == ["x", "y"]
    assert cli("set", address, "ledger", "a1", "owner", '"ana"').returncode == 0
    stale = cli("set", address, "ledger", "a1", "owner", '"bo"', "--if-version", "0000")
    assert stale.returncode == 2 and "changed since version 0000" in stale.stderr
    bad = cli("set", address, "ledger", "a1", "owner", "ana")
    assert bad.returncode == 2 and "is not JSON" in bad.stderr
    # $EDITOR: a script that drops `log` and sets `owner` in the file it is given.
    script = tmp_path / "editor.py"
    script.write_text(
        "import json, sys\n"
        "p = sys.argv[1]\nd = json.load(open(p))\nd.pop('log')\nd['owner'] = 'cy'\n"
        "json.dump(d, open(p, 'w'))\n"
    )
    edited = cli("edit", address, "ledger", "a1", editor=f"{sys.executable} {script}")
    assert edited.returncode == 0, edited.stderr
    assert "changed: log, owner" in edited.stdout
    assert json.loads(cli("show", address, "ledger", "a1", "--json").stdout)["state"] == {"owner": "cy"}
    assert cli("clear", address, "ledger", "a1").returncode == 0
    listed = cli("ls", address, "ledger")
    assert listed.returncode == 0 and listed.stdout.split() == ["a1"]
    client = await retry(lambda: fusee.Client.connect(server.address()))
    try:
        assert await client.object_ref("ledger", "a1").state() == {}
    finally:
        await client.close()
