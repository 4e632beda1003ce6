"""The process the crash tests kill: it runs workflows in local mode whose steps leave
effects in a file outside Fusee, and records what it observed.

Files it appends to (one line per event, O_APPEND writes, which a SIGKILL does not undo):
- effects:  `effect <step key> <value> <pid>` each time a step's function runs;
- acks:     `started <id>` once a start was acknowledged (the call returned);
- observed: `observed <id> <step> <value>` for every recorded step result it finds at
  startup, after recovery;
- results:  `result <id> <json>` for every run result it obtains.

Usage: python -m tests.crash.child DIR FILES_PREFIX [--drain] [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import uuid
from pathlib import Path

import fusee
from fusee import _records as R

PID = os.getpid()
files: dict[str, int] = {}


def emit(kind: str, line: str) -> None:
    os.write(files[kind], f"{line}\n".encode())


def effect(s: fusee.StepContext) -> str:
    value = uuid.uuid4().hex[:12]
    emit("effects", f"effect {s.key} {value} {PID}")
    return value


@fusee.workflow("crashy")
async def crashy(ctx: fusee.Ctx, n: int) -> list[str]:
    values = []
    for i in range(4):
        values.append(await ctx.step(f"s{i}", effect))
        if i == 1:
            await ctx.sleep("nap", "30ms")
    return values


async def observe(engine: fusee.Engine) -> None:
    async for summary in engine.list():
        for rec in (await engine.run(summary.id).describe()).journal:
            if isinstance(rec, R.StepDone):
                emit("observed", f"observed {summary.id} {rec.name} {json.loads(rec.value)}")


async def wait_result(engine: fusee.Engine, wid: str) -> None:
    result = await engine.run(wid).result()
    emit("results", f"result {wid} {json.dumps(result)}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("prefix")
    parser.add_argument("--drain", action="store_true")
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    for kind in ("effects", "acks", "observed", "results"):
        files[kind] = os.open(f"{args.prefix}.{kind}", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    acks_path = Path(f"{args.prefix}.acks")
    acked = [line.split()[1] for line in acks_path.read_text().splitlines() if line.startswith("started ")]
    engine = await fusee.Engine.open(args.dir, workflows=[crashy], shards=4, park_after="100ms")
    await observe(engine)
    waiting = [asyncio.ensure_future(wait_result(engine, wid)) for wid in dict.fromkeys(acked)]
    if args.drain:
        await asyncio.wait_for(asyncio.gather(*waiting), timeout=60)
        await engine.close()
        return
    n = len(acked)
    policy = {"running": "use-existing", "finished": "use-existing"}

    async def start(wid: str, number: int) -> None:
        await engine.start(crashy, wid, number, id_policy=policy)
        emit("acks", f"started {wid}")
        waiting.append(asyncio.ensure_future(wait_result(engine, wid)))

    while n < args.runs:
        # A few starts at once, so flushes carry several shards' records.
        await asyncio.gather(*(start(f"run-{n + i}", n + i) for i in range(3)))
        n += 3
    await asyncio.gather(*waiting)
    await asyncio.Event().wait()  # killed by the test, never ends by itself


if __name__ == "__main__":
    asyncio.run(main())
