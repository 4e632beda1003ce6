"""Payload encryption on invoked workers: the handler's engines seal with the keys of
FUSEE_CODEC_KEYS_FILE, a client with the same keys starts, signals and updates a run
through every kind of payload across several invocations, and the server's directory
holds no plain payload byte (docs/engine.md, *Payload encryption*). Real processes:
`fusee server --invoke-config` and uvicorn serving handlers/asgi.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import fusee
from tests.server_mode.flows import confide, secret, whisper
from tests.support.cluster import Cluster, Handler, quiet
from tests.support.procs import Proc
from tests.support.waiting import eventually

MARKER = "iv-secret-3b8e"
KEY = os.urandom(32)


async def test_an_invoked_handler_keeps_payloads_sealed_at_the_server(procs: list[Proc], tmp_path: Path):
    keys = tmp_path / "keys.txt"
    keys.write_text(f"k1 {KEY.hex()}\n")
    cluster = Cluster(tmp_path, procs=procs)
    env = {**cluster.handler_env(), "FUSEE_CODEC_KEYS_FILE": str(keys)}
    cluster.start_handler(lambda: Handler(cluster.handler_port, env))
    cluster.start_invoked_config(budgetMs=1000)
    client = await fusee.Client.connect(cluster.host_port, codec=fusee.aes_gcm({"k1": KEY}))
    await quiet(client)
    run = await client.start(secret, "iv-1", MARKER)

    async def waiting() -> bool:
        return any(type(r).__name__ == "WaitStarted" for r in (await run.describe()).journal)

    await eventually(waiting, timeout=30, every=0.05)
    assert await run.update(confide, MARKER + "-arg") == MARKER + "-arg-update-result"
    await asyncio.sleep(1.5)  # the invocation that took the update ends; the next one takes the signal
    await run.signal(whisper, MARKER + "-signal")
    result = await asyncio.wait_for(run.result(), 30)
    assert result["signal"] == MARKER + "-signal" and result["child"] == MARKER + "-child-input-child-step"
    await client.close()
    hits = [p for p in (tmp_path / "data").rglob("*") if p.is_file() and MARKER.encode() in p.read_bytes()]
    assert hits == []
    everything = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
    assert b"iv-1/child" in everything and b"\x01\x02k1" in everything
