"""Instructions per step and per run on memory storage, counted by valgrind's callgrind:
steady where wall-clock figures on a shared machine spread by a third. Run on demand:
`python bench/instructions.py` (needs `valgrind`; takes about a minute).

Each figure is the difference between two runs of the same workload at two sizes,
divided by the difference in size, so the interpreter's start and the engine's open and
close cancel out:
- per step: one workflow of 500 steps, then 1,500;
- per run of 4 steps: 200 runs over 4 shards, then 700.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile

from engine_cost import chain, four  # the same workflows as the wall-clock figures (bench/ is on the path)

import fusee


async def workload(kind: str, n: int) -> None:
    engine = await fusee.Engine.open(workflows=[chain, four], shards=4)
    if kind == "steps":
        await (await engine.start(chain, "c", n)).result()
    else:
        runs = [await engine.start(four, f"r{i}", i) for i in range(n)]
        for run in runs:
            await run.result()
    await engine.close()


def instructions(kind: str, n: int) -> int:
    """Total instructions of this file running one workload under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                kind,
                str(n),
            ],
            check=True,
            capture_output=True,
        )
        with open(out) as f:
            summary = next(line for line in f if line.startswith("summary:"))
    return int(summary.split()[1])


def main() -> None:
    step = (instructions("steps", 1500) - instructions("steps", 500)) // 1000
    run = (instructions("runs", 700) - instructions("runs", 200)) // 500
    print(f"instructions per sequential step (memory storage): {step:,}")
    print(f"instructions per run of 4 steps over 4 shards: {run:,}")


if __name__ == "__main__":
    if len(sys.argv) == 3:
        asyncio.run(workload(sys.argv[1], int(sys.argv[2])))
    else:
        main()
