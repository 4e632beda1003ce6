"""Payload encryption through a server (docs/engine.md, *Payload encryption*): a worker
and a client with the same `fusee.aes_gcm` keys, every byte between them and `fusee
server` recorded by a proxy on loopback. No payload crosses the wire or reaches the
server's directory in plain text; a client without the keys sees `{"$encoded": ...}`
and `fusee runs show` prints it so. Real processes: the server, a worker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import fusee
from tests.server_mode.flows import confide, secret, whisper
from tests.support.procs import ROOT, Proc, Server, Worker, retry
from tests.support.waiting import eventually

MARKER = "wq-secret-91c2"
K1 = os.urandom(32)


class Recorder:
    """A TCP proxy in front of the server that keeps every byte it forwards."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.seen = bytearray()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    self.seen += data
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_nothing_plain_on_the_wire_nor_at_the_server(procs: list[Proc], tmp_path: Path):
    server = Server(tmp_path / "data")
    procs.append(server)
    recorder = Recorder(server.host_port)
    address = await recorder.start()
    try:
        keys = {"FUSEE_TEST_KEYS": f"k1={K1.hex()}"}
        # Started on a thread: it waits for the worker to be ready while this loop runs the proxy.
        procs.append(await asyncio.to_thread(Worker, address, None, keys))
        codec = fusee.aes_gcm({"k1": K1})
        client = await retry(lambda: fusee.Client.connect(address, codec=codec))
        run = await retry(lambda: client.start(secret, "w-1", MARKER))

        async def waiting() -> bool:
            journal = (await run.describe()).journal
            return any(type(r).__name__ == "WaitStarted" for r in journal)

        await eventually(waiting, timeout=30, every=0.05)
        assert await run.update(confide, MARKER + "-arg") == MARKER + "-arg-update-result"
        await run.signal(whisper, MARKER + "-signal")
        result = await asyncio.wait_for(run.result(), 30)
        assert result == {
            "step": MARKER + "-step",
            "child": MARKER + "-child-input-child-step",
            "signal": MARKER + "-signal",
            "updates": [MARKER + "-arg"],
        }
        # The client with the keys reads the journal plain.
        journal = (await run.describe()).journal
        assert any(MARKER.encode() in (getattr(r, "value", None) or b"") for r in journal)

        # A client without them: the result and the journal's payloads stay sealed.
        blind = await retry(lambda: fusee.Client.connect(address))
        sealed_result = await blind.run("w-1").result()
        assert set(sealed_result) == {"$encoded"} and MARKER.encode() not in sealed_result["$encoded"]
        await blind.close()
        await client.close()
        # `fusee runs show` has no keys either: it prints a sealed payload as {"$encoded"}.
        shown = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "fusee", "runs", "show", server.host_port, "w-1", "--json"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)["journal"]
        step = next(row for row in rows if row["record"] == "StepDone")
        assert set(step["value"]) == {"$encoded"}
        assert MARKER not in shown.stdout
    finally:
        recorder.close()

    assert len(recorder.seen) > 10_000  # the calls, the records and the answers all went through
    assert MARKER.encode() not in recorder.seen
    assert b"w-1/child" in recorder.seen  # headers stay readable
    assert b"\x01\x02k1" in recorder.seen  # and payloads went, sealed with k1
    on_disk = [p for p in (tmp_path / "data").rglob("*") if p.is_file() and MARKER.encode() in p.read_bytes()]
    assert on_disk == []
