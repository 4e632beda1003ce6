"""A worker process for the server-mode tests: `python -m tests.server_mode.worker
ADDRESS`. It opens one engine in server mode with the test workflows, as the README does,
and prints a line per shard it takes or loses (`took N`, `lost N`). When its connection
goes (the server restarted), the engine connects again by itself and takes its shards back:
the process prints `reconnected`, then what it took. SIGTERM closes it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import fusee
from tests.server_mode.flows import WORKFLOWS
from tests.support.workers import print_shards


async def serve(engine: fusee.Engine, stop: asyncio.Event) -> None:
    held: set[int] = set()
    storage = engine.storage
    connections = getattr(storage, "connections", 1)
    while not stop.is_set():
        if getattr(storage, "connections", 1) != connections:
            connections = getattr(storage, "connections", 1)
            print("reconnected", flush=True)
            held = set()  # what it holds now is printed as taken, under the new connection
        held = print_shards(engine, held)
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except TimeoutError:
            pass


async def main(address: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    keys = os.environ.get("FUSEE_TEST_KEYS")  # "k2=<hex>,k1=<hex>": payloads encrypted
    codec = fusee.aes_gcm(dict(pair.split("=") for pair in keys.split(","))) if keys else None
    engine = await fusee.Engine.open(
        durability="server", address=address, workflows=WORKFLOWS, park_after="200ms", codec=codec
    )
    print("ready", " ".join(str(s.index) for s in engine.shards), flush=True)
    await serve(engine, stop)
    await engine.close()
    print("closed", flush=True)


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s worker %(name)s: %(message)s"
    )
    asyncio.run(main(sys.argv[1]))
