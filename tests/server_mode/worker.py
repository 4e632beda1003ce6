"""A worker process for the server-mode tests: `python -m tests.server_mode.worker
ADDRESS`. It opens an engine in server mode with the test workflows and prints a line
per shard it takes or loses (`took N`, `lost N`). When its connection goes (the server
was killed), it opens a new engine, as a deployed worker would. SIGTERM closes it."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import fusee
from tests.server_mode.flows import WORKFLOWS


async def serve(engine: fusee.Engine, stop: asyncio.Event) -> None:
    held: set[int] = set()
    storage = engine.storage
    while not stop.is_set() and getattr(storage, "lost", None) is None:
        now = {s.index for s in engine.shards}
        for index in sorted(now - held):
            print("took", index, flush=True)
        for index in sorted(held - now):
            print("lost", index, flush=True)
        held = now
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except TimeoutError:
            pass
    for index in sorted(held):
        if stop.is_set():
            break
        print("lost", index, flush=True)


async def main(address: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    first = True
    while not stop.is_set():
        try:
            engine = await fusee.Engine.open(
                durability="server", address=address, workflows=WORKFLOWS, park_after="200ms"
            )
        except fusee.ConnectionError:
            await asyncio.sleep(0.2)
            continue
        if first:
            print("ready", " ".join(str(s.index) for s in engine.shards), flush=True)
            first = False
        else:
            print("reconnected", flush=True)
        await serve(engine, stop)
        if stop.is_set():
            await engine.close()
        else:
            engine.abandon()
            await engine.storage.abandon()
    print("closed", flush=True)


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s worker %(name)s: %(message)s"
    )
    asyncio.run(main(sys.argv[1]))
