"""Write a directory in the format of the release this runs on, for the upgrade tests.

Run it on that release's code, not this one's: for log format 3 (directory format 1),

    git worktree add /tmp/old 3b0a5e7^
    (cd /tmp/old/server && pip wheel . --no-deps -w /tmp/oldwheel)
    pip install --no-deps --target /tmp/oldpkgs /tmp/oldwheel/*.whl
    PYTHONPATH=/tmp/old:/tmp/oldpkgs:tests/server/formats python tests/server/formats/make.py /tmp/d
    tar -C /tmp/d -czf tests/server/formats/log3.tar.gz .

A first process starts runs of every kind and closes cleanly (checkpoints); a second
starts more and is killed mid-flight, so the log holds records after the checkpoints. The
reshard tests run it on this release (`make.py DIR SHARDS`).
"""

from __future__ import annotations

import asyncio
import os
import sys

from flows import WORKFLOWS, finished, napping, parent, sleeper, waiter

import fusee


async def first(root: str, shards: int) -> None:
    engine = await fusee.Engine.open(root, workflows=WORKFLOWS, shards=shards, durability="local")
    for n in range(6):
        await (await engine.start(finished, f"finished-{n}", n)).result()
    for n in range(3):
        await engine.start(napping, f"napping-{n}", n)
        await engine.start(sleeper, f"sleeper-{n}", n)
        await engine.start(waiter, f"waiter-{n}", n)
    await (await engine.start(parent, "parent-1", 1)).result()
    await asyncio.sleep(2.0)  # park them
    await engine.close()


async def second(root: str, shards: int) -> None:
    engine = await fusee.Engine.open(root, workflows=WORKFLOWS, shards=shards, durability="local")
    for n in range(6, 9):
        await (await engine.start(finished, f"finished-{n}", n)).result()
    await engine.start(waiter, "waiter-late", 9)
    await engine.start(sleeper, "sleeper-late", 9)
    await asyncio.sleep(0.2)
    os._exit(0)  # no close: these records lie after the shards' checkpoints


if __name__ == "__main__":
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    asyncio.run(first(sys.argv[1], count))
    asyncio.run(second(sys.argv[1], count))
