"""The process the crash tests kill: it runs workflows in local mode whose steps leave
effects in a file outside Fusee, and records what it observed.

Files it appends to (one line per event, O_APPEND writes, which a SIGKILL does not undo;
each line ends with `lines.END`, so that one a kill cut short is told apart):
- effects:  `effect <step key> <value> <pid>` each time a step's function runs;
- acks:     `started <id>` once a start was acknowledged (the call returned);
- observed: `observed <id> <step> <value>` for every recorded step result it finds at
  startup, after recovery;
- results:  `result <id> <json>` for every run result it obtains.

With `--churn`, the directory gets small segments (64 KiB at most) and a checkpoint
every few records, runs park (their sleep outlasts `park_after`), and the child closes
the engine cleanly and opens it again every `--cycle` seconds: rolls, retirements,
checkpoints, closes and recoveries happen many times per life, so kills land in all of
them.

Usage: python -m tests.crash.child DIR FILES_PREFIX [--drain] [--runs N] [--churn]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import fusee
from fusee import journal as R
from tests.crash.lines import END, whole_lines

PID = os.getpid()
files: dict[str, int] = {}
NAP = {"plain": "30ms", "churn": "60ms"}  # churn: longer than park_after, so runs park
PARK_AFTER = {"plain": "100ms", "churn": "20ms"}
mode = "plain"


def emit(kind: str, line: str) -> None:
    os.write(files[kind], f"{line}{END}\n".encode())


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
            await ctx.sleep("nap", NAP[mode])
    return values


async def observe(engine: fusee.Engine) -> None:
    async for summary in engine.list():
        for rec in (await engine.run(summary.id).describe()).journal:
            if isinstance(rec, R.StepDone):
                emit("observed", f"observed {summary.id} {rec.name} {json.loads(rec.value)}")


async def wait_result(engine: fusee.Engine, wid: str) -> None:
    result = await engine.run(wid).result()
    emit("results", f"result {wid} {json.dumps(result)}")


async def open_engine(args: argparse.Namespace) -> fusee.Engine:
    if not args.churn:
        return await fusee.Engine.open(args.dir, workflows=[crashy], shards=4, park_after=PARK_AFTER[mode])
    from fusee_server.store import LocalStorage

    storage = await LocalStorage.open(args.dir, 4, segment_bytes_min=16 << 10, segment_bytes_max=64 << 10)
    engine = await fusee.Engine.open(workflows=[crashy], storage=storage, park_after=PARK_AFTER[mode])
    engine.checkpoint_records = 16
    return engine


def acked_ids(prefix: str) -> list[str]:
    acks = whole_lines(Path(f"{prefix}.acks").read_text())
    return list(dict.fromkeys(line.split()[1] for line in acks if line.startswith("started ")))


async def main() -> None:
    global mode
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("dir")
    parser.add_argument("prefix")
    parser.add_argument("--drain", action="store_true")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--churn", action="store_true")
    parser.add_argument("--cycle", type=float, default=0.2, help="churn: seconds between close and reopen")
    args = parser.parse_args()
    mode = "churn" if args.churn else "plain"
    for kind in ("effects", "acks", "observed", "results"):
        files[kind] = os.open(f"{args.prefix}.{kind}", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(files[kind], b"\n")  # ends a line the last life's kill cut short
    while True:
        engine = await open_engine(args)
        await observe(engine)
        acked = acked_ids(args.prefix)
        waiting = [asyncio.ensure_future(wait_result(engine, wid)) for wid in acked]
        if args.drain:
            await asyncio.wait_for(asyncio.gather(*waiting), timeout=60)
            await engine.close()
            return
        await run_starts(engine, args, len(acked), waiting)
        # Churn: a clean close, then the next life opens the directory again.
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        await engine.close()


async def run_starts(engine: fusee.Engine, args: argparse.Namespace, n: int, waiting: list[Any]) -> None:
    """Start runs, a few at once, until `--runs` (then wait to be killed); with churn,
    return after `--cycle` seconds."""
    policy = {"running": "use-existing", "finished": "use-existing"}
    until = asyncio.get_running_loop().time() + args.cycle

    async def start(wid: str, number: int) -> None:
        await engine.start(crashy, wid, number, id_policy=policy)
        emit("acks", f"started {wid}")
        waiting.append(asyncio.ensure_future(wait_result(engine, wid)))

    while n < args.runs and (not args.churn or asyncio.get_running_loop().time() < until):
        # A few starts at once, so flushes carry several shards' records.
        await asyncio.gather(*(start(f"run-{n + i}", n + i) for i in range(3)))
        n += 3
    if args.churn:
        await asyncio.sleep(max(0.0, until - asyncio.get_running_loop().time()))
        return
    await asyncio.gather(*waiting)
    await asyncio.Event().wait()  # killed by the test, never ends by itself


if __name__ == "__main__":
    asyncio.run(main())
