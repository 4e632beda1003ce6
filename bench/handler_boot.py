"""What the invocation handler adds to a function's cold start: `import handlers.asgi`
with its environment set (FUSEE_URL, FUSEE_INVOKE_SECRET, FUSEE_WORKFLOWS naming a module
with one workflow), as a whole process, against `python -c pass` (and against `python -c
"import asyncio"`, which uvicorn and mangum load anyway). Run on demand:
`python bench/handler_boot.py [--runs 20] [--module handlers.asgi]` (a few seconds).

Bytecode is compiled once first, into a cache of its own (PYTHONPYCACHEPREFIX in a
temporary directory): a deployment ships or builds it, and a run that compiled every
module would measure the compiler. The two commands alternate, so a machine whose speed
drifts shifts both alike. Prints the median and the spread of each, their difference
(the goal: at most 100 ms), and the imports that cost the most on their own, by `python
-X importtime`.

Then the library's own boot, timed inside fresh processes (so the interpreter's start is
not in it): `import fusee` with asyncio and msgspec loaded already (a handler's server
loads both anyway) against `import asyncio` on its own, each the median of `--runs`,
alternating. The goal: `import fusee` at most 0.2x `import asyncio`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_MS = 100.0
RATIO_GOAL = 0.2  # import fusee / import asyncio, each timed inside its process

# Each prints how long its last import took, in seconds.
FUSEE_OWN = (
    "import asyncio, msgspec, time; t = time.perf_counter(); import fusee; print(time.perf_counter() - t)"
)
ASYNCIO_OWN = "import time; t = time.perf_counter(); import asyncio; print(time.perf_counter() - t)"


def run(args: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    subprocess.run(args, cwd=ROOT, env=env, check=True)
    return (time.perf_counter() - began) * 1000


def timed_inside(code: str, env: dict[str, str]) -> float:
    """The ms that `code` printed (its own timing, in seconds)."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return float(done.stdout) * 1000


def own_imports(runs: int, env: dict[str, str]) -> tuple[list[float], list[float]]:
    """`import fusee` (asyncio and msgspec loaded) and `import asyncio`, each timed inside a
    fresh process, `runs` of each, alternating."""
    fusee_ms: list[float] = []
    asyncio_ms: list[float] = []
    for _ in range(runs):
        fusee_ms.append(timed_inside(FUSEE_OWN, env))
        asyncio_ms.append(timed_inside(ASYNCIO_OWN, env))
    return fusee_ms, asyncio_ms


def costliest(module: str, env: dict[str, str], count: int = 12) -> list[tuple[int, int, str]]:
    """The modules whose own import time (not counting what they import) is largest:
    (own us, cumulative us, name)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    rows: list[tuple[int, int, str]] = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        own_us, cumulative_us, name = line.split(":", 1)[1].split("|")
        rows.append((int(own_us), int(cumulative_us), name.strip()))
    return sorted(rows, reverse=True)[:count]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--module", default="handlers.asgi")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FUSEE_", "PYTHON"))}
        env.update(
            PYTHONPATH=str(ROOT),
            PYTHONPYCACHEPREFIX=cache,
            FUSEE_URL="127.0.0.1:7600",
            FUSEE_INVOKE_SECRET="bench-secret-0123456789abcdef",
            FUSEE_WORKFLOWS="tests.invoke.flows",
        )
        bare = [sys.executable, "-c", "pass"]
        loop = [sys.executable, "-c", "import asyncio"]
        handler = [sys.executable, "-c", f"import {args.module}"]
        run(handler, env)  # compiles the bytecode into the cache
        run(bare, env)
        bare_ms: list[float] = []
        loop_ms: list[float] = []
        handler_ms: list[float] = []
        for _ in range(args.runs):
            bare_ms.append(run(bare, env))
            loop_ms.append(run(loop, env))
            handler_ms.append(run(handler, env))
        top = costliest(args.module, env)
        fusee_ms, asyncio_ms = own_imports(args.runs, env)
    difference = statistics.median(handler_ms) - statistics.median(bare_ms)
    print(
        f"python -c pass          median {statistics.median(bare_ms):6.1f} ms  (min {min(bare_ms):.1f}, max {max(bare_ms):.1f})"
    )
    print(
        f"import {args.module:<16} median {statistics.median(handler_ms):6.1f} ms  "
        f"(min {min(handler_ms):.1f}, max {max(handler_ms):.1f})"
    )
    print(
        f"python -c 'import asyncio' median {statistics.median(loop_ms):6.1f} ms  "
        f"(min {min(loop_ms):.1f}, max {max(loop_ms):.1f})"
    )
    verdict = "within" if difference <= GOAL_MS else "OVER"
    print(
        f"the handler adds        {difference:6.1f} ms  ({verdict} the {GOAL_MS:.0f} ms goal), {args.runs} runs each"
    )
    beyond = statistics.median(handler_ms) - statistics.median(loop_ms)
    print(f"of which beyond asyncio {beyond:6.1f} ms  (what uvicorn or mangum would not load anyway)")
    print("costliest imports by their own time (python -X importtime; own, then with what they import):")
    for own_us, cumulative_us, name in top:
        print(f"  {own_us / 1000:6.1f} ms  {cumulative_us / 1000:6.1f} ms  {name}")
    ratio = statistics.median(fusee_ms) / statistics.median(asyncio_ms)
    print(
        f"import fusee (asyncio, msgspec loaded) median {statistics.median(fusee_ms):6.1f} ms  "
        f"(min {min(fusee_ms):.1f}, max {max(fusee_ms):.1f}), timed inside the process"
    )
    print(
        f"import asyncio                         median {statistics.median(asyncio_ms):6.1f} ms  "
        f"(min {min(asyncio_ms):.1f}, max {max(asyncio_ms):.1f})"
    )
    verdict = "within" if ratio <= RATIO_GOAL else "OVER"
    print(f"import fusee / import asyncio           {ratio:6.2f}x  ({verdict} the {RATIO_GOAL:g}x goal)")


if __name__ == "__main__":
    main()
